// Command demo runs the proxy demo: two fake vLLM backends, the flowgate
// proxy in front of them and an open-loop load generator over loopback HTTP,
// once with the static baseline and once with soft-reflective, and prints
// TTFT p99 side by side.
//
// With -evict N it shows eviction instead: N interleaved rounds of a
// reasoning load (the simulator's reasoning@0.7, sheddable clients not
// streaming, as batch jobs call) through the proxy with soft-reflective,
// eviction (flowControl.enableEviction) off and on, same seed, fresh fake
// backends per run. Long sheddable decodes fill the backends' KV caches and
// a critical request then waits in a backend's queue; with eviction on the
// proxy takes a sheddable request back and sends it again later. It prints,
// per run and as medians, critical TTFT p99, the evictions, every
// sheddable client's outcome (exactly one each) and the critical streams
// cut (none).
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/memnet"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// DemoSpec configures one demo run (both policies).
type DemoSpec struct {
	Config   gateway.Config // bands, saturation settings; the policy is set per phase
	Backends int
	// Replica is the fake backends' model; zero: vllm.DefaultConfig().
	Replica vllm.Config
	Load    LoadSpec
	// Out receives the progress line and the table; nil discards them.
	Out io.Writer
	// BackendPriority also runs every policy with priority all the way
	// down: the fake servers schedule by priority (vLLM's
	// --scheduling-policy priority) and the proxy writes each request's
	// band into its body (bodyPriority: set).
	BackendPriority bool
	// Baseline is the policy soft-reflective is compared with; zero: the
	// static ceiling at 1.0 (llm-d's default static-usage-limit-policy).
	// A static threshold above MaxSaturation is no flow control.
	Baseline gateway.PolicyRef
	// Net, if set, is the network the load's client, the proxy and the
	// fake backends talk over; nil: loopback TCP. The test runs on one in
	// a testing/synctest bubble, where the model and the clients keep
	// virtual time and a busy machine cannot make them late.
	Net *memnet.Network
}

// baseline is spec's Baseline with its default, and the table's name for it.
func (spec DemoSpec) baseline() (gateway.PolicyRef, string) {
	ref := spec.Baseline
	if ref.Type == "" {
		ref = gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 1.0}
	}
	if ref.Type == flowcontrol.StaticPolicyName && ref.Threshold > flowcontrol.MaxSaturation {
		return ref, "no flow control"
	}
	if ref.Type == flowcontrol.StaticPolicyName {
		return ref, fmt.Sprintf("static (threshold %g)", ref.Threshold)
	}
	return ref, ref.Type
}

// clock says where the table's times were measured.
func (spec DemoSpec) clock() string {
	if spec.Net != nil {
		return "over an in-memory network (virtual clock)"
	}
	return "over loopback (wall clock)"
}

// PhaseResult is one policy's run.
type PhaseResult struct {
	Policy string
	Load   *LoadResult
	Stats  flowcontrol.Stats
	// Answers is the proxy's own count of finished gated requests, by
	// "band code reason".
	Answers map[string]int
	// Lost is the largest share of the phase's wall time by which a fake
	// backend fell behind real time (see fakevllm.Server.Lost): above
	// BusyLost the machine was too busy to run the model at speed.
	Lost float64
	// Stalled is the share of the phase's wall time this process waited for
	// a CPU in waits longer than stallGap (see stallProbe): above
	// BusyStalled the proxy and the client ran late, whatever Lost says.
	Stalled float64
	// BackendErrors are the proxy's logged transport errors (its 502
	// backend-error answers), the first few of them.
	BackendErrors []string
	// Evictions is the gateway's eviction state at the end of the phase
	// (nil with eviction off), and Aborted the requests the fake backends
	// aborted because their client (the proxy) went away.
	Evictions *flowhttp.EvictionStats
	Aborted   uint64
}

// BusyLost is the share of a phase's wall time behind real time (Lost)
// above which the demo warns that the machine was too busy for the speed-up.
const BusyLost = 0.02

// BusyStalled is the share of a phase's wall time spent waiting for a CPU
// (Stalled) above which the demo warns that the proxy and the client ran
// late. Measured on 2026-12-04 on the 2-core machine: 0.3–0.8 % for the
// end-to-end test alone, 1.3 % within the whole suite, 3–5.5 % alone beside
// a spinning loop per core, 13–21 % within the whole suite beside them.
const BusyStalled = 0.05

// busyWarning is what the result line says of a phase the machine was too
// busy to measure ("" when it was not).
func (r *PhaseResult) busyWarning() string {
	w := ""
	if r.Lost > BusyLost {
		w += fmt.Sprintf(" (WARNING: a backend fell %.0f %% behind real time: the machine is too busy for this speed-up)", 100*r.Lost)
	}
	if r.Stalled > BusyStalled {
		w += fmt.Sprintf(" (WARNING: this process waited %.0f %% of the time for a CPU: latencies are inflated)", 100*r.Stalled)
	}
	return w
}

// maxBackendErrors bounds the transport errors a phase keeps.
const maxBackendErrors = 10

// headerTimeout is the ReadHeaderTimeout of the demo's in-process servers
// (the fake backends and the proxy): a bound against a hang only. Their
// clients are in the same process and send each request at once, but
// net/http checks the deadline it set on the first byte before it reads
// what is already there: in a process starved for seconds (the machine too
// busy for the speed-up) a 5 s timeout was missed with the request waiting
// in the socket, the connection closed unanswered, and the proxy answered
// 502 backend-error. (A 5 ms timeout in a process with busy goroutines on
// GOMAXPROCS=1 reproduces it: 18 EOFs in 400 POSTs; none without.)
const headerTimeout = 10 * time.Minute

// listen starts an HTTP server for h on a loopback port, or on mem if set.
func listen(mem *memnet.Network, h http.Handler) (*http.Server, string, error) {
	var (
		ln  net.Listener
		url string
	)
	if mem != nil {
		ln, url = mem.Listen()
	} else {
		tcp, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		ln, url = tcp, "http://"+tcp.Addr().String()
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout}
	go func() { _ = srv.Serve(ln) }()
	return srv, url, nil
}

// stack is one run's fake backends and the proxy in front of them, each
// serving on a loopback port.
type stack struct {
	fakes   []*fakevllm.Server
	servers []*http.Server
	proxy   *gateway.Proxy
	psrv    *http.Server
	url     string // the proxy's base URL
	stopped bool
	// backendErrors keeps the proxy's transport errors (the 502s), at
	// most maxBackendErrors of them; the rest of its log is dropped.
	logMu         sync.Mutex
	backendErrors []string
}

// startStack starts spec.Backends fresh fake backends and the proxy with
// the given policy (spec.Config's times scaled by the speed-up). On error
// what was started is closed.
func startStack(spec DemoSpec, policy gateway.PolicyRef, backendPriority bool) (_ *stack, err error) {
	s := &stack{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	var urls []string
	for range spec.Backends {
		fc := fakevllm.Config{SpeedUp: spec.Load.SpeedUp, Replica: spec.Replica}
		if backendPriority {
			fc.SchedulingPolicy = fakevllm.PolicyPriority
		}
		f, err := fakevllm.New(fc)
		if err != nil {
			return nil, err
		}
		s.fakes = append(s.fakes, f)
		srv, url, err := listen(spec.Net, f)
		if err != nil {
			return nil, err
		}
		s.servers = append(s.servers, srv)
		urls = append(urls, url)
	}
	cfg := scaleConfig(spec.Config, spec.Load.SpeedUp)
	cfg.Policy = policy
	if backendPriority {
		cfg.BodyPriority = gateway.BodyPrioritySet
	}
	// The proxy's log is dropped but for its transport errors (the 502s).
	logf := func(format string, args ...any) {
		if format != gateway.BackendErrorLog {
			return
		}
		s.logMu.Lock()
		defer s.logMu.Unlock()
		if len(s.backendErrors) < maxBackendErrors {
			s.backendErrors = append(s.backendErrors, fmt.Sprintf(format, args...))
		}
	}
	// The load generator is the only client and names each request's
	// band itself, as a front proxy that authenticated it would: the
	// proxy trusts the objective header here (a deployment grants bands
	// by API key instead; see examples/proxy/README.md).
	opts := gateway.Options{Config: cfg, Backends: urls, Logf: logf, TrustObjectiveHeader: true}
	if spec.Net != nil {
		opts.DialContext = spec.Net.DialContext
	}
	if cfg.Eviction {
		opts.Eviction = scaleEviction(cfg, spec.Load.SpeedUp)
	}
	p, err := gateway.NewProxy(opts)
	if err != nil {
		return nil, err
	}
	p.Start()
	s.proxy = p
	if s.psrv, s.url, err = listen(spec.Net, p); err != nil {
		return nil, err
	}
	return s, nil
}

// stopProxy stops the proxy gracefully: it stops accepting, answers what is
// queued, and lets the rest finish (10 s at most). Idempotent.
func (s *stack) stopProxy() {
	if s.stopped || s.proxy == nil {
		return
	}
	s.stopped = true
	s.proxy.Drain()
	if s.psrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = s.psrv.Shutdown(sctx)
		cancel()
	}
	s.proxy.Close()
}

// close stops the proxy (if still running), then the fake backends.
func (s *stack) close() {
	s.stopProxy()
	for _, srv := range s.servers {
		_ = srv.Close()
	}
	for _, f := range s.fakes {
		f.Close()
	}
}

// lost is the largest share of wall by which a fake backend fell behind
// real time (PhaseResult.Lost).
func (s *stack) lost(wall time.Duration) float64 {
	l := 0.0
	for _, f := range s.fakes {
		l = max(l, f.Lost().Seconds()/wall.Seconds())
	}
	return l
}

// newClient is the load's HTTP client: enough idle connections for an
// open-loop load, no compression; on mem if set.
func newClient(mem *memnet.Network) *http.Client {
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, DisableCompression: true}
	if mem != nil {
		tr.DialContext = mem.DialContext
	}
	return &http.Client{Transport: tr}
}

// RunPhase starts fresh fake backends and a proxy with the given policy,
// runs the load through the proxy over loopback HTTP, then shuts everything
// down.
func RunPhase(ctx context.Context, spec DemoSpec, policy gateway.PolicyRef, backendPriority bool) (*PhaseResult, error) {
	out := spec.Out
	if out == nil {
		out = io.Discard
	}
	st, err := startStack(spec, policy, backendPriority)
	if err != nil {
		return nil, err
	}
	defer st.close()
	p := st.proxy
	client := newClient(spec.Net)
	defer client.CloseIdleConnections()

	name := policy.Type
	if backendPriority {
		name += " + backend priority"
	}
	if spec.Config.Eviction {
		name += " + eviction"
	}
	progress := func(sent, finished int) {
		st := p.Controller().Stats()
		queued := 0
		for _, b := range st.Bands {
			queued += b.Queued
		}
		fmt.Fprintf(out, "\r  %-32s sent %5d  finished %5d  queued %4d  in flight %v  saturation %5.2f ",
			name, sent, finished, queued, p.InFlight(), st.Saturation)
	}
	probe := startStallProbe()
	load, err := RunLoad(ctx, client, st.url+"/v1/completions", spec.Load, progress)
	stalled := probe.Stop()
	fmt.Fprintln(out)
	st.stopProxy()
	if err != nil {
		return nil, err
	}
	st.logMu.Lock()
	defer st.logMu.Unlock()
	r := &PhaseResult{Policy: name, Load: load, Stats: p.Controller().Stats(), Answers: p.Answers(), Lost: st.lost(load.Wall),
		Stalled: stalled.Seconds() / load.Wall.Seconds(), BackendErrors: append([]string(nil), st.backendErrors...)}
	if ev, ok := p.Gateway().Evictions(); ok {
		r.Evictions = &ev
	}
	for _, f := range st.fakes {
		r.Aborted += f.Aborted()
	}
	return r, nil
}

// scaleConfig divides the proxy's time settings by the speed-up: the fake
// backends run the model SpeedUp× faster than the hardware it models, so a
// 50 ms scrape interval would be SpeedUp× staler, in model time, than a real
// gateway's. Scaled, the gateway sees the backends as a real one would see
// real servers. The bands are copied (the caller's Config is not modified).
func scaleConfig(cfg gateway.Config, speedUp float64) gateway.Config {
	if speedUp <= 1 {
		return cfg
	}
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speedUp) }
	cfg.Bands = append([]gateway.Band(nil), cfg.Bands...)
	for i := range cfg.Bands {
		cfg.Bands[i].MaxWait = scale(cfg.Bands[i].MaxWait)
	}
	tick := cfg.Tick
	if tick == 0 {
		tick = flowcontrol.DefaultTick
	}
	cfg.Tick = max(scale(tick), 50*time.Microsecond)
	cfg.Saturation.ScrapeInterval = max(scale(cfg.Saturation.ScrapeInterval), time.Millisecond)
	cfg.Saturation.MetricsStalenessThreshold = max(scale(cfg.Saturation.MetricsStalenessThreshold), 4*cfg.Saturation.ScrapeInterval)
	return cfg
}

// scaleEviction is the evictor's times divided by the speed-up, as
// scaleConfig divides the proxy's (cfg is scaled already): the stall that
// makes a forwarded request held, the grace after a confirmed eviction (no
// shorter than the scaled scrape interval, the sensor's lag) and the bound
// on the wait for a confirmation. Unscaled, a held critical request would
// wait SpeedUp×100 ms of model time before its first victim.
func scaleEviction(cfg gateway.Config, speedUp float64) flowcontrol.EvictionConfig {
	if speedUp <= 1 {
		return flowcontrol.EvictionConfig{}
	}
	scale := func(d time.Duration) time.Duration { return max(time.Duration(float64(d)/speedUp), time.Millisecond) }
	return flowcontrol.EvictionConfig{
		Stall:          scale(flowcontrol.DefaultEvictionStall),
		Grace:          max(scale(flowcontrol.DefaultEvictionGrace), cfg.Saturation.ScrapeInterval),
		ConfirmTimeout: scale(flowcontrol.DefaultEvictionConfirmTimeout),
	}
}

// RunDemo runs the baseline (spec.Baseline: the static ceiling at 1.0
// unless set), then soft-reflective, and prints the table.
func RunDemo(ctx context.Context, spec DemoSpec) ([]*PhaseResult, error) {
	out := spec.Out
	if out == nil {
		out = io.Discard
	}
	fmt.Fprintf(out, "flowgate proxy demo: %d fake vLLM backends (Qwen3-14B/H100 model at %gx speed), %s load at %g QPS (model time; %g req/s wall), %.0f%% critical, %v per policy\n",
		spec.Backends, spec.Load.SpeedUp, spec.Load.Workload.Name, spec.Load.QPS, spec.Load.QPS*spec.Load.SpeedUp,
		100*spec.Load.Workload.CriticalShare, spec.Load.Duration)
	var results []*PhaseResult
	prios := []bool{false}
	if spec.BackendPriority {
		prios = append(prios, true)
	}
	for _, prio := range prios {
		base, _ := spec.baseline()
		for _, pol := range []gateway.PolicyRef{
			base,
			{Type: flowcontrol.SoftReflectivePolicyName},
		} {
			r, err := RunPhase(ctx, spec, pol, prio)
			if err != nil {
				return results, err
			}
			results = append(results, r)
		}
	}
	printTable(out, spec, results)
	return results, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func printTable(out io.Writer, spec DemoSpec, rs []*PhaseResult) {
	if len(rs) != 2 {
		printWide(out, spec, rs)
		return
	}
	s, f := rs[0].Load, rs[1].Load
	change := func(a, b time.Duration) string {
		if a == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%+.1f %%", 100*(float64(b)-float64(a))/float64(a))
	}
	fmt.Fprintf(out, "\nTTFT measured by the HTTP client %s (×%g = model time)\n\n", spec.clock(), spec.Load.SpeedUp)
	_, baseName := spec.baseline()
	fmt.Fprintf(out, "| metric | %s | soft-reflective | change |\n| --- | --- | --- | --- |\n", baseName)
	row := func(name string, q float64, a, b []time.Duration) {
		if len(a) == 0 && len(b) == 0 {
			return // not measured (sheddable sent without streaming)
		}
		x, y := quantile(a, q), quantile(b, q)
		fmt.Fprintf(out, "| %s | %s | %s | %s |\n", name, ms(x), ms(y), change(x, y))
	}
	row("critical TTFT p50", 0.5, s.Critical.TTFT, f.Critical.TTFT)
	row("critical TTFT p99", 0.99, s.Critical.TTFT, f.Critical.TTFT)
	row("sheddable TTFT p50", 0.5, s.Sheddable.TTFT, f.Sheddable.TTFT)
	row("sheddable TTFT p99", 0.99, s.Sheddable.TTFT, f.Sheddable.TTFT)
	row("critical E2E p99", 0.99, s.Critical.E2E, f.Critical.E2E)
	row("sheddable E2E p99", 0.99, s.Sheddable.E2E, f.Sheddable.E2E)
	fmt.Fprintln(out)
	for _, r := range rs {
		fmt.Fprintf(out, "%s: critical: %s; sheddable: %s; %.1fs wall", r.Policy, r.Load.Critical.summary(), r.Load.Sheddable.summary(), r.Load.Wall.Seconds())
		fmt.Fprintln(out, r.busyWarning())
	}
}

// demoLoad is the default demo load: the published codegen point, 16 QPS,
// where the calibrated two-replica pool is at its capacity (the simulator
// overloads there, as the hardware did).
func demoLoad() LoadSpec {
	return LoadSpec{
		Workload: workload.Codegen,
		QPS:      16,
		SpeedUp:  4,
		Duration: 20 * time.Second,
		CV:       workload.DefaultCV,
		Seed:     1,
		Drain:    30 * time.Second,
	}
}

// printWide prints one column per phase (the backend-priority run's four).
func printWide(out io.Writer, spec DemoSpec, rs []*PhaseResult) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(out, "\nTTFT measured by the HTTP client %s (×%g = model time)\n\n| metric |", spec.clock(), spec.Load.SpeedUp)
	for _, r := range rs {
		fmt.Fprintf(out, " %s |", r.Policy)
	}
	fmt.Fprintf(out, "\n| --- |%s\n", strings.Repeat(" --- |", len(rs)))
	row := func(name string, q float64, get func(*LoadResult) []time.Duration) {
		fmt.Fprintf(out, "| %s |", name)
		for _, r := range rs {
			fmt.Fprintf(out, " %s |", ms(quantile(get(r.Load), q)))
		}
		fmt.Fprintln(out)
	}
	row("critical TTFT p50", 0.5, func(l *LoadResult) []time.Duration { return l.Critical.TTFT })
	row("critical TTFT p99", 0.99, func(l *LoadResult) []time.Duration { return l.Critical.TTFT })
	row("sheddable TTFT p99", 0.99, func(l *LoadResult) []time.Duration { return l.Sheddable.TTFT })
	row("critical E2E p99", 0.99, func(l *LoadResult) []time.Duration { return l.Critical.E2E })
	fmt.Fprintln(out)
	for _, r := range rs {
		fmt.Fprintf(out, "%s: critical: %s; sheddable: %s; %.1fs wall", r.Policy, r.Load.Critical.summary(), r.Load.Sheddable.summary(), r.Load.Wall.Seconds())
		fmt.Fprintln(out, r.busyWarning())
	}
}
