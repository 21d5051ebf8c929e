package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
)

// EvictSpec configures RunEvict: the same load through the example proxy
// with soft-reflective, eviction off and on, in interleaved rounds.
type EvictSpec struct {
	Rounds int
	// Demo is each run's setup: its Config's Eviction is set per run, its
	// policy is soft-reflective.
	Demo DemoSpec
}

// EvictRun is one run of RunEvict.
type EvictRun struct {
	Round    int
	Eviction bool
	*PhaseResult
}

// Evicted is how many evictions the run's gateway made (0 with eviction
// off: there is no evictor).
func (r *EvictRun) Evicted() uint64 {
	if r.Stats.Eviction == nil {
		return 0
	}
	var n uint64
	for _, e := range r.Stats.Eviction.Evicted {
		n += e
	}
	return n
}

// Requeued is how many of the run's victims were sent again (none had
// started its response).
func (r *EvictRun) Requeued() uint64 {
	if r.Evictions == nil {
		return 0
	}
	var n uint64
	for _, e := range r.Evictions.Requeued {
		n += e
	}
	return n
}

// OneResponse reports whether every client of c got exactly one outcome:
// an HTTP response, a transport error or its own giving up at the drain
// bound (each client records one outcome; the check is that none is
// missing or doubled).
func OneResponse(c *ClassResult) bool { return c.Sent == c.Answered()+c.Errors+c.Abandoned }

// statusCounts formats c's outcomes: each HTTP status with its count, the
// refusals' reasons, transport errors.
func statusCounts(c *ClassResult) string {
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(c.Status)) {
		parts = append(parts, fmt.Sprintf("%d×%d", c.Status[code], code))
	}
	for _, r := range slices.Sorted(maps.Keys(c.Reasons)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, c.Reasons[r]))
	}
	if c.Abandoned > 0 {
		parts = append(parts, fmt.Sprintf("%d given up by the client at the drain bound", c.Abandoned))
	}
	if c.Errors > 0 {
		parts = append(parts, fmt.Sprintf("%d transport errors", c.Errors))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// evictLoad is -evict's load: the simulator's reasoning@0.7 on two
// replicas (examples/sim/README.md, "Eviction": critical TTFT p99 6.8 s
// without eviction, 218 ms with it), where the KV caches fill with long
// sheddable decodes admitted while the pool read unsaturated. Sheddable
// clients do not stream, as batch jobs call (a started stream is never
// evicted); critical ones stream, which is how TTFT is measured.
//
// The trap needs minutes of model time to form (a reasoning request decodes
// 6,200 tokens on average, about two minutes at the batch's step time,
// and the caches fill only after tens of such decodes have piled up), so
// the run is long in model time: 5 minutes of arrivals at 10× speed-up is
// 30 s of wall time per run, then at most 30 s (5 model minutes) of drain
// for the last decodes (a request still unanswered then is given up and
// counted as such). The speed-up is as high as the
// 2-core machine runs the model at speed with critical streams' per-token
// events (the fake backends' Lost, printed, says when it did not); a model
// step of the default replica is 14–25 ms, 1.4–2.5 ms of wall time here.
func evictLoad() LoadSpec {
	return LoadSpec{
		Workload:       workload.Reasoning,
		QPS:            0.7,
		SpeedUp:        10,
		Duration:       30 * time.Second,
		CV:             workload.DefaultCV,
		Seed:           1,
		Drain:          30 * time.Second,
		PlainSheddable: true,
	}
}

// RunEvict runs Rounds rounds; in each, soft-reflective serves the same
// load (same seed) with eviction off and on, each in front of fresh fake
// backends, in an order that alternates by round (as RunCompare rotates
// its programs), then prints a line per run and the medians.
func RunEvict(ctx context.Context, spec EvictSpec) ([]*EvictRun, error) {
	ds := spec.Demo
	out := ds.Out
	if out == nil {
		out = io.Discard
	}
	fmt.Fprintf(out, "flowgate eviction over HTTP: %d fake vLLM backends at %gx, %s at %g QPS (model time), %.0f%% critical (streamed), sheddable not streamed, %v of arrivals per run, %d rounds, soft-reflective with eviction off and on\n",
		ds.Backends, ds.Load.SpeedUp, ds.Load.Workload.Name, ds.Load.QPS, 100*ds.Load.Workload.CriticalShare, ds.Load.Duration, spec.Rounds)
	soft := gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName}
	var runs []*EvictRun
	for r := range spec.Rounds {
		for k := range 2 {
			on := (r+k)%2 == 1
			rs := ds
			rs.Config.Eviction = on
			pr, err := RunPhase(ctx, rs, soft, false)
			if err != nil {
				return runs, fmt.Errorf("demo: round %d, eviction %v: %w", r+1, on, err)
			}
			run := &EvictRun{Round: r + 1, Eviction: on, PhaseResult: pr}
			runs = append(runs, run)
			printEvictRun(out, ds, run)
			if ctx.Err() != nil {
				return runs, ctx.Err()
			}
		}
	}
	printEvictSummary(out, ds, runs)
	return runs, nil
}

func onOff(on bool) string {
	if on {
		return "on "
	}
	return "off"
}

func printEvictRun(out io.Writer, ds DemoSpec, r *EvictRun) {
	c, s := &r.Load.Critical, &r.Load.Sheddable
	p99 := quantile(c.TTFT, 0.99)
	fmt.Fprintf(out, "  round %d eviction %s critical TTFT p99 %7s (model %8s)  evictions %3d (re-queued %d, backend aborts %d)  critical: %s, cut %d  sheddable: sent %d, %s, one response each: %v  %.1fs wall%s\n",
		r.Round, onOff(r.Eviction), ms(p99), ms(time.Duration(float64(p99)*ds.Load.SpeedUp)), r.Evicted(), r.Requeued(), r.Aborted,
		statusCounts(c), c.Cut, s.Sent, statusCounts(s), OneResponse(s), r.Load.Wall.Seconds(), r.busyWarning())
}

// printEvictSummary prints the medians over the rounds, each way.
func printEvictSummary(out io.Writer, ds DemoSpec, runs []*EvictRun) {
	type agg struct {
		p99, shedE2E       []time.Duration
		evicted, requeued  []int
		cut, notOne, sent  int
		status             map[int]int
		transport, stopped int
		abandoned          int
	}
	by := map[bool]*agg{false: {status: map[int]int{}}, true: {status: map[int]int{}}}
	for _, r := range runs {
		a := by[r.Eviction]
		a.p99 = append(a.p99, quantile(r.Load.Critical.TTFT, 0.99))
		a.shedE2E = append(a.shedE2E, quantile(r.Load.Sheddable.E2E, 0.99))
		a.evicted = append(a.evicted, int(r.Evicted()))
		a.requeued = append(a.requeued, int(r.Requeued()))
		a.cut += r.Load.Critical.Cut
		a.stopped += r.Load.Critical.Stopped
		if !OneResponse(&r.Load.Sheddable) {
			a.notOne++
		}
		a.sent += r.Load.Sheddable.Sent
		for code, n := range r.Load.Sheddable.Status {
			a.status[code] += n
		}
		a.transport += r.Load.Sheddable.Errors
		a.abandoned += r.Load.Sheddable.Abandoned
	}
	medInt := func(v []int) string {
		if len(v) == 0 {
			return "n/a"
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return fmt.Sprintf("%d (%d–%d)", s[len(s)/2], s[0], s[len(s)-1])
	}
	fmt.Fprintf(out, "\nmedian over the rounds (min–max), measured by the HTTP client %s (×%g = model time)\n\n", ds.clock(), ds.Load.SpeedUp)
	fmt.Fprintf(out, "| eviction | critical TTFT p99 | sheddable E2E p99 | evictions | re-queued | critical streams cut | sheddable: one response each | sheddable outcomes, all rounds |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, on := range []bool{false, true} {
		a := by[on]
		codes := make([]string, 0, len(a.status))
		for _, code := range slices.Sorted(maps.Keys(a.status)) {
			codes = append(codes, fmt.Sprintf("%d×%d", a.status[code], code))
		}
		if a.abandoned > 0 {
			codes = append(codes, fmt.Sprintf("%d given up by the client at the drain bound", a.abandoned))
		}
		if a.transport > 0 {
			codes = append(codes, fmt.Sprintf("%d transport errors", a.transport))
		}
		cut := fmt.Sprint(a.cut)
		if a.stopped > 0 {
			cut += fmt.Sprintf(" (%d still streaming when the client stopped waiting)", a.stopped)
		}
		one := "yes"
		if a.notOne > 0 {
			one = fmt.Sprintf("NO in %d rounds", a.notOne)
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s | %s (%d sent) | %s |\n", strings.TrimSpace(onOff(on)), medianRange(a.p99), medianRange(a.shedE2E),
			medInt(a.evicted), medInt(a.requeued), cut, one, a.sent, strings.Join(codes, ", "))
	}
	var ratios []float64
	off := map[int]time.Duration{}
	for _, r := range runs {
		if !r.Eviction {
			off[r.Round] = quantile(r.Load.Critical.TTFT, 0.99)
		}
	}
	for _, r := range runs {
		if b := off[r.Round]; r.Eviction && b > 0 {
			ratios = append(ratios, float64(quantile(r.Load.Critical.TTFT, 0.99))/float64(b))
		}
	}
	if len(ratios) > 0 {
		slices.Sort(ratios)
		fmt.Fprintf(out, "\ncritical TTFT p99 with eviction over without, same round: %.2f× (%.2f–%.2f)\n", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
}
