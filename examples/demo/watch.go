package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/memnet"
	"github.com/flowgate/flowgate/flowcontrol"
)

// WatchSpec configures the watch mode: an overloading load through the
// example proxy at its defaults, shown live, then summarised.
type WatchSpec struct {
	Backends int
	// Load is the load; its Duration is how long arrivals go on, its Drain
	// how long the last answers are waited for.
	Load LoadSpec
	// Window is the span of the live TTFT percentiles; zero: 5 s.
	Window time.Duration
	// Contrast, if set, runs the same load (same seed) again with one
	// thing changed, the policy: ContrastNone or ContrastStatic.
	Contrast string
	// Out receives the live lines and the summary; nil discards them.
	Out io.Writer
	// Net, if set, is the network the run talks over (see DemoSpec.Net);
	// nil: loopback TCP.
	Net *memnet.Network
}

// The contrast runs of the watch mode.
const (
	// ContrastNone is no flow control: a static gate whose threshold is
	// above any saturation, so that no band ever waits.
	ContrastNone = "none"
	// ContrastStatic is the usual constant ceiling: every band, critical
	// included, waits while saturation ≥ 1.
	ContrastStatic = "static"
)

// WatchPhase is one watched run.
type WatchPhase struct {
	Name string
	Load *LoadResult
	// Lost: see PhaseResult.Lost.
	Lost float64
	// Interrupted: the context ended (Ctrl-C) before the load did; the
	// requests still open were cancelled.
	Interrupted bool
	// PeakQueued is the most requests seen waiting in the gateway's
	// critical and sheddable bands by the live view (sampled each second).
	PeakQueued [2]int
}

// watchPolicy is one watched policy and how the output names it.
type watchPolicy struct {
	name, desc string
	ref        gateway.PolicyRef
}

var (
	watchFlowgate = watchPolicy{
		name: "flowgate",
		desc: "soft-reflective: critical never held, sheddable held back as the servers saturate",
		ref:  gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName},
	}
	watchContrasts = map[string]watchPolicy{
		ContrastNone: {
			name: "no flow control",
			desc: "a static gate at threshold 2e6, above any saturation: every request goes on at once",
			ref:  gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 2 * flowcontrol.MaxSaturation},
		},
		ContrastStatic: {
			name: "static ceiling",
			desc: "static threshold 1.0: sheddable held while saturation ≥ 1, critical paced there (one tick in two)",
			ref:  gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 1.0},
		},
	}
)

// RunWatch runs the watch mode: the load through examples/proxy's gateway
// in-process at its defaults (soft-reflective, in-flight credit on), with a
// live line a second, then, if spec.Contrast is set, the same load with the
// contrast policy, then the summary. It stops early, still printing the
// summary of what was measured, when ctx ends.
func RunWatch(ctx context.Context, spec WatchSpec) ([]*WatchPhase, error) {
	out := spec.Out
	if out == nil {
		out = io.Discard
	}
	if spec.Window <= 0 {
		spec.Window = 5 * time.Second
	}
	pols := []watchPolicy{watchFlowgate}
	if spec.Contrast != "" {
		c, ok := watchContrasts[spec.Contrast]
		if !ok {
			return nil, fmt.Errorf("demo: -contrast %q: want %q or %q", spec.Contrast, ContrastNone, ContrastStatic)
		}
		pols = append(pols, c)
	}
	l := spec.Load
	fmt.Fprintf(out, "flowgate watch: %d fake vLLM servers (the simulator's Qwen3-14B/H100 replica at %gx speed), the %s mix at %g QPS of model time (%g req/s wall, %.0f %% critical, seed %d), %v of arrivals\n",
		spec.Backends, l.SpeedUp, l.Workload.Name, l.QPS, l.QPS*l.SpeedUp, 100*l.Workload.CriticalShare, l.Seed, l.Duration)
	fmt.Fprintf(out, "gateway: examples/proxy's, in-process, at its defaults (in-flight credit on; its times divided by the speed-up)\n")
	var phases []*WatchPhase
	for _, pol := range pols {
		if ctx.Err() != nil {
			break
		}
		ph, err := watchPhase(ctx, spec, pol, out)
		if err != nil {
			return phases, err
		}
		phases = append(phases, ph)
	}
	printWatchSummary(out, spec, phases)
	return phases, nil
}

// watchPhase runs the load through fresh backends and a fresh proxy with
// pol, printing a live line a second.
func watchPhase(ctx context.Context, spec WatchSpec, pol watchPolicy, out io.Writer) (*WatchPhase, error) {
	st, err := startStack(DemoSpec{Config: gateway.DefaultConfig(), Backends: spec.Backends, Load: spec.Load, Net: spec.Net}, pol.ref, false)
	if err != nil {
		return nil, err
	}
	defer st.close()
	client := newClient(spec.Net)
	defer client.CloseIdleConnections()

	fmt.Fprintf(out, "\n%s (%s)\n", pol.name, pol.desc)
	fmt.Fprintln(out, strings.TrimRight(fmt.Sprintf("%7s %5s  %-13s  %-11s  %-28s  %-28s", "", "", "queued", "in flight",
		"critical TTFT, last "+fmtSeconds(spec.Window), "sheddable TTFT, last "+fmtSeconds(spec.Window)), " "))
	fmt.Fprintf(out, "%7s %5s  %6s %6s  %-11s  %7s %7s %12s  %7s %7s %12s\n", "time", "sat.", "crit", "shed", "by server", "p50", "p99", "refused", "p50", "p99", "refused")

	var mu sync.Mutex
	w := &ttftWindow{span: spec.Window}
	var refused [2]int // answered with a status other than 200: critical, sheddable
	load := spec.Load
	load.FirstToken = w.add
	load.Done = func(critical bool, status int) {
		mu.Lock()
		defer mu.Unlock()
		if status != 0 && status != 200 {
			refused[classIndex(critical)]++
		}
	}
	start := time.Now()
	var peak [2]int
	staleSeen := false
	// line prints the state at now, elapsed since start formatted by
	// elapsed.
	line := func(now time.Time, elapsed func(time.Duration) string) {
		s := st.proxy.Controller().Stats()
		q := [2]int{s.Bands[0].Queued, s.Bands[len(s.Bands)-1].Queued}
		peak = [2]int{max(peak[0], q[0]), max(peak[1], q[1])}
		var inflight []string
		for _, n := range st.proxy.InFlight() {
			inflight = append(inflight, fmt.Sprint(n))
		}
		stale := ""
		for _, r := range st.proxy.Poller().Readings() {
			if !r.Usable {
				stale, staleSeen = "*", true
			}
		}
		p50, p99 := w.quantiles(now)
		mu.Lock()
		r := refused
		mu.Unlock()
		fmt.Fprintf(out, "%7s %5.2f%1s %6d %6d  %-11s  %7s %7s %12d  %7s %7s %12d\n",
			elapsed(now.Sub(start)), st.proxy.Poller().Saturation(), stale, q[0], q[1],
			strings.Join(inflight, " "), fmtTTFT(p50[0]), fmtTTFT(p99[0]), r[0], fmtTTFT(p50[1]), fmtTTFT(p99[1]), r[1])
	}
	stopLive := make(chan struct{})
	liveDone := make(chan struct{})
	go func() {
		defer close(liveDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		announced := false
		for {
			select {
			case <-stopLive:
				return
			case now := <-tick.C:
				if !announced && now.Sub(start) >= load.Duration {
					announced = true
					fmt.Fprintf(out, "  -- %s: arrivals over; waiting for the last answers (at most %s) --\n", fmtSeconds(load.Duration), fmtSeconds(load.Drain))
				}
				line(now, func(d time.Duration) string { return fmtSeconds(d.Round(time.Second)) })
			}
		}
	}()
	res, err := RunLoad(ctx, client, st.url+"/v1/completions", load, nil)
	close(stopLive)
	<-liveDone
	if err != nil {
		return nil, err
	}
	line(time.Now(), fmtTenths)
	if staleSeen {
		fmt.Fprintf(out, "  * a server's metrics were late or failing then: it counts as saturated (1), the poller's fail-safe\n")
	}
	ph := &WatchPhase{Name: pol.name, Load: res, Lost: st.lost(res.Wall), Interrupted: ctx.Err() != nil, PeakQueued: peak}
	if ph.Interrupted {
		fmt.Fprintf(out, "  -- interrupted at %s: the requests still open were cancelled --\n", fmtTenths(res.Wall))
	}
	st.stopProxy()
	return ph, nil
}

// watchLoad is the watch mode's default load: the demo's codegen mix (4×
// speed-up, seed 1) at 18 QPS of model time instead of 16, for a minute of
// arrivals, and at most 15 s for the last answers, so that the run takes
// about 70 s of wall time. 16 QPS is the two-replica pool's knee, where a
// minute builds little backlog; 18 is over it. One run on the shared 2-core
// machine: with no flow control, critical TTFT p99 353 ms at 16, 8.2 s at
// 18 (the backlog, in the servers' queues, cleared within 11 s of the last
// arrival).
func watchLoad() LoadSpec {
	l := demoLoad()
	l.QPS = 18
	l.Duration = 60 * time.Second
	l.Drain = 15 * time.Second
	return l
}

// classIndex is 0 for critical, 1 for sheddable.
func classIndex(critical bool) int {
	if critical {
		return 0
	}
	return 1
}

// ttftWindow keeps, per class, the TTFTs whose first token arrived in the
// last span.
type ttftWindow struct {
	span time.Duration
	mu   sync.Mutex
	at   [2][]time.Time
	ttft [2][]time.Duration
}

func (w *ttftWindow) add(critical bool, ttft time.Duration) {
	c := classIndex(critical)
	w.mu.Lock()
	w.at[c] = append(w.at[c], time.Now())
	w.ttft[c] = append(w.ttft[c], ttft)
	w.mu.Unlock()
}

// quantiles drops what is older than span before now and returns the p50
// and p99 of what is left per class (0: none).
func (w *ttftWindow) quantiles(now time.Time) (p50, p99 [2]time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range 2 {
		i := 0
		for i < len(w.at[c]) && now.Sub(w.at[c][i]) > w.span {
			i++
		}
		w.at[c] = append(w.at[c][:0], w.at[c][i:]...)
		w.ttft[c] = append(w.ttft[c][:0], w.ttft[c][i:]...)
		p50[c], p99[c] = quantile(w.ttft[c], 0.5), quantile(w.ttft[c], 0.99)
	}
	return p50, p99
}

// fmtTTFT prints a latency for the live view: ms below 1 s, "–" for none.
func fmtTTFT(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// fmtSeconds prints a duration in seconds: whole if it is, else in tenths.
func fmtSeconds(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// fmtTenths prints a duration in seconds and tenths.
func fmtTenths(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// printWatchSummary prints each phase's counts and whole-run TTFT, and
// what they mean.
func printWatchSummary(out io.Writer, spec WatchSpec, phases []*WatchPhase) {
	if len(phases) == 0 {
		return
	}
	fmt.Fprintf(out, "\nSummary: TTFT measured by the client %s, whole run (×%g = model time)\n", DemoSpec{Net: spec.Net}.clock(), spec.Load.SpeedUp)
	for _, ph := range phases {
		fmt.Fprintf(out, "  %s:\n", ph.Name)
		for _, c := range []struct {
			name string
			r    *ClassResult
		}{{"critical", &ph.Load.Critical}, {"sheddable", &ph.Load.Sheddable}} {
			fmt.Fprintf(out, "    %-9s TTFT p50 %7s  p99 %7s   %s\n", c.name,
				fmtTTFT(quantile(c.r.TTFT, 0.5)), fmtTTFT(quantile(c.r.TTFT, 0.99)), c.r.summary())
		}
		ok := true
		for _, c := range []*ClassResult{&ph.Load.Critical, &ph.Load.Sheddable} {
			ok = ok && OneResponse(c)
		}
		if n := ph.Load.Critical.Abandoned + ph.Load.Sheddable.Abandoned; n > 0 {
			fmt.Fprintf(out, "    no response: %d requests still open at the end (drain bound or Ctrl-C), cancelled by the client\n", n)
		}
		if n := ph.Load.Critical.Errors + ph.Load.Sheddable.Errors; n > 0 {
			fmt.Fprintf(out, "    no response: %d requests ended by a transport error\n", n)
		}
		if ok {
			fmt.Fprintf(out, "    every request sent got exactly one outcome (sent = answered + no response)\n")
		} else {
			fmt.Fprintf(out, "    ACCOUNTING ERROR: sent ≠ answered + no response\n")
		}
		if ph.Lost > 0.02 {
			fmt.Fprintf(out, "    WARNING: a fake server fell %.0f %% behind real time: the machine was too busy for this speed-up, latencies are inflated\n", 100*ph.Lost)
		}
		if ph.Interrupted {
			fmt.Fprintf(out, "    interrupted after %s: only what completed by then is measured\n", fmtTenths(ph.Load.Wall))
		}
	}
	ph := phases[0]
	f := ph.Load
	crit, shed := quantile(f.Critical.TTFT, 0.99), quantile(f.Sheddable.TTFT, 0.99)
	fmt.Fprintln(out)
	switch {
	case crit == 0 || shed == 0:
		fmt.Fprintf(out, "Too few answers to compare the classes.\n")
	case 2*crit <= shed && ph.PeakQueued[1] > 0:
		fmt.Fprintf(out, "What it means: critical requests went first (TTFT p99 %s) while sheddable ones waited (p99 %s, %.0f× as long).\n"+
			"As the servers saturated, flowgate held sheddable requests back in its queue (up to %d seen waiting; critical: %d), so critical ones did not queue behind them inside the servers.\n",
			fmtTTFT(crit), fmtTTFT(shed), float64(shed)/float64(crit), ph.PeakQueued[1], ph.PeakQueued[0])
	case ph.PeakQueued[1] == 0:
		fmt.Fprintf(out, "What it means: little here; flowgate was never seen holding a sheddable request (critical TTFT p99 %s, sheddable %s): the load did not saturate the servers for long.\n",
			fmtTTFT(crit), fmtTTFT(shed))
	default:
		behind := ""
		if ph.Lost > 0.02 {
			behind = " (and a fake server fell behind real time)"
		}
		fmt.Fprintf(out, "What it means: in this run critical TTFT p99 (%s) was not well below sheddable's (%s), although flowgate held up to %d sheddable requests back%s.\n",
			fmtTTFT(crit), fmtTTFT(shed), ph.PeakQueued[1], behind)
	}
	if ph.Interrupted {
		fmt.Fprintf(out, "(Interrupted after %s: a short run says little.)\n", fmtTenths(f.Wall))
	}
	if len(phases) > 1 {
		c := phases[1].Load
		cc, cs := quantile(c.Critical.TTFT, 0.99), quantile(c.Sheddable.TTFT, 0.99)
		fmt.Fprintf(out, "Contrast, the same arrivals (same seed) with %s: critical TTFT p99 %s (flowgate: %s), sheddable %s (flowgate: %s).\n",
			phases[1].Name, fmtTTFT(cc), fmtTTFT(crit), fmtTTFT(cs), fmtTTFT(shed))
		switch {
		case crit > 0 && cc > crit:
			fmt.Fprintf(out, "With %s, critical requests waited %.1f× as long at p99.\n", phases[1].Name, float64(cc)/float64(crit))
		case crit > 0 && cc > 0:
			fmt.Fprintf(out, "In this run critical TTFT p99 was no higher with %s.\n", phases[1].Name)
		}
	}
}
