package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/flowcontrol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEndOverload: the codegen mix at 24 QPS (model time; the
// calibrated two-replica pool saturates near 16), sent by an open-loop client
// over loopback through the proxy to two in-process fake vLLM backends
// running the model 5× fast, once with no flow control (a static gate above
// any saturation) and once with soft-reflective (4 s of arrivals each, then a
// drain). Critical TTFT p99 must drop by at least half (−69 %, −74 %, −69 % in
// three runs on 2026-12-02 at load 3). The baseline was the
// static ceiling at 1.0 (−61 % to −78 % over 7 runs) until Static paced its
// approach to the threshold and stopped flooding the backends on reopening:
// since then static's critical p99 sits near soft-reflective's (689 against
// 479 ms in one run), which the simulator's tables measure properly;
// every request gets 200 or a documented status; the client's, the proxy's
// and the controller's counts add up.
//
// One size whatever FLOWGATE_FULL says: the claim needs the queues that 4 s
// of overload builds. At 3 s the drop was −62 %, −52 % and −43 % in three
// runs, under the claim once.
//
// It runs in parallel with TestWatch (which asserts nothing on latency):
// both mostly wait on real time (about a third of a core each), and the
// Lost check below catches a run whose backends the other starved. Beside
// it the drop was −59 % to −72 % over 13 judged runs on 2026-12-04 (alone,
// in the same hour: −62 % to −73 % over 11).
func TestEndToEndOverload(t *testing.T) {
	t.Parallel()
	replica := vllm.DefaultConfig()
	load := demoLoad()
	load.QPS = 24
	load.SpeedUp = 5
	load.Duration = 4 * time.Second
	t.Logf("size: %v of arrivals per phase, at every size (the claim needs them)", load.Duration)
	load.Drain = 60 * time.Second
	load.PlainSheddable = true // critical streams (TTFT); sheddable costs no per-token CPU
	cfg := gateway.DefaultConfig()
	cfg.Saturation.InFlightCredit = false // the published A/B: the reference formula, no credit
	spec := DemoSpec{Config: cfg, Backends: 2, Replica: replica, Load: load,
		Baseline: gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 2 * flowcontrol.MaxSaturation}}

	// The comparison is only meaningful if the fake backends ran the model
	// at speed. On a machine too busy for that (Lost above BusyLost, 2 %
	// of a phase: where the table itself warns that the machine is too
	// busy), the counts are still checked, and the run is repeated; after
	// three such runs the latency claim is skipped, saying why. The bound
	// was 5 %: a run whose table warned of a 4 % lag was judged and failed
	// (soft-reflective's critical p99 1169 ms, p50 twice its usual; the
	// backends and the proxy share this starved process). Lags over 2 %
	// came in 1 of 9 runs of the whole suite and 2 of 16 of the package.
	//
	// The backends catch up after a short wait for a CPU, the proxy and the
	// client do not: beside a spinning loop per core, within the whole
	// suite, the process waited 13–21 % of each phase for a CPU (backends
	// 0–0.8 % behind) and the drop was −39 % and −43 % in 2 of 7 runs
	// (−64 % to −69 % in the others). A phase that waited more than
	// BusyStalled is repeated the same way (alone beside the hog: 3–5.5 %,
	// judged, −68 % to −70 % in 4 runs).
	busy := func(rs []*PhaseResult) bool {
		for _, r := range rs {
			if r.Lost > BusyLost || r.Stalled > BusyStalled {
				return true
			}
		}
		return false
	}
	for attempt := 1; ; attempt++ {
		results, err := RunDemo(context.Background(), spec)
		require.NoError(t, err)
		require.Len(t, results, 2)
		var sb strings.Builder
		printTable(&sb, spec, results)
		t.Logf("attempt %d:\n%s", attempt, sb.String())
		checkCounts(t, results)
		if raceEnabled {
			// The counts above are what -race is for. The latency claim is
			// the plain pass's: instrumented, the proxy's own path adds
			// about a second to soft-reflective's critical p99 (1.2–1.4 s
			// against 0.4–0.5 s) while the backends keep time, and the
			// comparison measures the race detector.
			t.Skip("latency claim not judged under -race (the proxy runs instrumented); counts checked")
		}
		if busy(results) {
			if attempt == 3 {
				t.Skipf("backends fell %.0f %% / %.0f %% behind real time, the process waited %.0f %% / %.0f %% for a CPU: machine too busy to judge latency in every attempt",
					100*results[0].Lost, 100*results[1].Lost, 100*results[0].Stalled, 100*results[1].Stalled)
			}
			continue
		}
		none := quantile(results[0].Load.Critical.TTFT, 0.99)
		soft := quantile(results[1].Load.Critical.TTFT, 0.99)
		require.LessOrEqual(t, float64(soft), 0.5*float64(none),
			"critical TTFT p99: no flow control %v, soft-reflective %v", none, soft)
		return
	}
}

// checkCounts: every request got 200 or a documented status, and the
// client's, the proxy's and the controller's counts add up. A 502 (the
// proxy's backend-error) fails with the proxy's transport errors. The one
// seen on a busy machine was, by every sign, the fake backends' 5 s header
// timeout missed by a starved process (see headerTimeout): the same 502 came
// in examples/proxy's replicas test under -race beside a CPU hog, and a
// short timeout in a starved process reproduces the unanswered close.
func checkCounts(t *testing.T, results []*PhaseResult) {
	t.Helper()
	for _, r := range results {
		sent := 0
		for _, c := range []*ClassResult{&r.Load.Critical, &r.Load.Sheddable} {
			require.Zero(t, c.Errors, "%s: requests without a response", r.Policy)
			require.Zero(t, c.Cut, "%s: responses cut", r.Policy)
			require.Equal(t, c.Sent, c.Answered())
			for code := range c.Status {
				require.Contains(t, []int{200, 429, 503}, code, "%s: backends %.0f %% behind real time; the proxy's transport errors: %q",
					r.Policy, 100*r.Lost, r.BackendErrors)
			}
			require.Equal(t, c.Status[200], c.Completed)
			require.Equal(t, c.Completed, len(c.E2E))
			sent += c.Sent
		}
		// The proxy answered each request exactly once.
		answered := 0
		for _, n := range r.Answers {
			answered += n
		}
		require.Equal(t, sent, answered, "%s: proxy answers %v", r.Policy, r.Answers)
		// Every accepted request ended in exactly one controller outcome.
		var outcomes uint64
		for _, b := range r.Stats.Bands {
			require.Zero(t, b.Queued)
			outcomes += b.Dispatched + b.Expired + b.Cancelled + b.Closed + b.Rejected +
				b.Refused.Closed + b.Refused.Cancelled + b.Refused.NotRunning
		}
		require.Equal(t, uint64(sent), outcomes, "%s", r.Policy)
		require.NotEmpty(t, r.Load.Critical.TTFT)
	}
}
