package main

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/memnet"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEndToEndOverload: the codegen mix at 24 QPS (model time; the
// calibrated two-replica pool saturates near 16), sent by an open-loop client
// through the proxy to two in-process fake vLLM backends running the model 5×
// fast, once with no flow control (a static gate above any saturation) and
// once with soft-reflective (4 s of arrivals each, then a drain). Critical
// TTFT p99 must drop by at least half; every request gets 200 or a documented
// status; the client's, the proxy's and the controller's counts add up.
//
// It runs in a testing/synctest bubble, over an in-memory network
// (memnet): the client, the proxy and the fake backends share the bubble's
// virtual clock, which moves only when every goroutine waits. Their CPU time
// costs no virtual time, so a busy machine, a parallel test or -race makes
// the run slower, never the latencies longer, and the claim is judged on
// every run. (Over loopback, at wall time, as ./examples/demo runs it, the
// drop was −59 % to −73 % on an idle machine, and a busy one skewed it.)
func TestEndToEndOverload(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		replica := vllm.DefaultConfig()
		load := demoLoad()
		load.QPS = 24
		load.SpeedUp = 5
		load.Duration = 4 * time.Second
		t.Logf("size: %v of arrivals per phase on virtual time, at every size", load.Duration)
		load.Drain = 60 * time.Second
		load.PlainSheddable = true // critical streams (TTFT); sheddable costs no per-token CPU
		cfg := gateway.DefaultConfig()
		cfg.Saturation.InFlightCredit = false // the published A/B: the reference formula, no credit
		spec := DemoSpec{Config: cfg, Backends: 2, Replica: replica, Load: load, Net: new(memnet.Network),
			Baseline: gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 2 * flowcontrol.MaxSaturation}}

		results, err := RunDemo(context.Background(), spec)
		require.NoError(t, err)
		require.Len(t, results, 2)
		var sb strings.Builder
		printTable(&sb, spec, results)
		t.Log(sb.String())
		checkCounts(t, results)
		for _, r := range results {
			// On virtual time nothing runs late: a lag would mean
			// something ran on the wall clock.
			require.Zero(t, r.Lost, "%s: backends behind virtual time", r.Policy)
			require.Zero(t, r.Stalled, "%s: the process stalled on virtual time", r.Policy)
		}
		none := quantile(results[0].Load.Critical.TTFT, 0.99)
		soft := quantile(results[1].Load.Critical.TTFT, 0.99)
		require.LessOrEqual(t, float64(soft), 0.5*float64(none),
			"critical TTFT p99: no flow control %v, soft-reflective %v", none, soft)
	})
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
		// Every accepted request ended in exactly one controller outcome,
		// and one more for each time it was re-queued (an eviction's
		// victim is accepted again).
		var outcomes, requeued uint64
		for _, b := range r.Stats.Bands {
			require.Zero(t, b.Queued)
			outcomes += b.Dispatched + b.Expired + b.Cancelled + b.Closed + b.Rejected +
				b.Refused.Closed + b.Refused.Cancelled + b.Refused.NotRunning
			requeued += b.Requeued
		}
		require.Equal(t, uint64(sent), outcomes-requeued, "%s: %d outcomes, %d re-queued", r.Policy, outcomes, requeued)
		require.NotEmpty(t, r.Load.Critical.TTFT)
	}
}

// evictTestLoad is TestEvictionOverHTTP's load and replica: the KV trap of
// -evict (reasoning@0.7 on two calibrated replicas, which takes minutes of
// model time and over a million streamed tokens to form) scaled down to
// what a test affords: reasoning's shape (outputs 8× the prompts, half
// critical, sheddable not streamed) at an eighth of its lengths, at 1.6
// QPS for 2 minutes, on replicas with 500 KV blocks (8,000 tokens: about
// nine mean requests) instead of 15,912. Tried: the same at a quarter of
// the lengths and blocks (36 mean requests a replica, as the calibrated
// one holds) at 3 QPS for 90 s formed no trap on seeds 1–7.
func evictTestLoad(seed uint64) (LoadSpec, vllm.Config) {
	replica := vllm.DefaultConfig()
	replica.TotalBlocks = 500
	w := workload.Reasoning
	w.Name, w.InputMean, w.OutputMean = "reasoning/8", w.InputMean/8, w.OutputMean/8
	return LoadSpec{
		Workload:       w,
		QPS:            1.6,
		SpeedUp:        1, // virtual time: the library's own stall, grace and scrape interval
		Duration:       2 * time.Minute,
		CV:             workload.DefaultCV,
		Seed:           seed,
		Drain:          30 * time.Minute, // virtual: every request is answered, none given up
		PlainSheddable: true,
	}, replica
}

// TestEvictionOverHTTP: the same load through the proxy with soft-reflective,
// eviction off and on, over memnet in a testing/synctest bubble (virtual
// time, as TestEndToEndOverload). With eviction on the proxy takes sheddable
// requests back (evictions > 0; none off; no critical one), each victim is
// sent again and its client gets exactly one response, a 200 with the whole
// completion; no streamed (critical) response is cut; the client's, proxy's
// and controller's counts add up (a victim counted twice would break them).
//
// Critical TTFT p99 is logged, not asserted: eviction lowers it on most
// seeds, not all. Seeds 1–10 at this size (2026-12-07), off → on, with the
// evictions: 5.50 s → 549 ms (33), 1.52 s → 451 ms (23), 43 ms → 145 ms
// (4), 336 → 300 ms (3), 1.44 s → 156 ms (5), 3.46 s → 246 ms (10), 42 →
// 42 ms (0), 325 → 203 ms (2), 773 → 150 ms (2), 1.12 s → 122 ms (1).
// Seed 7 forms no trap; seed 3 forms none without eviction and is worse
// with it (the freed KV lets the gate admit more sheddable work, which a
// critical request then waits behind for a stall). Over 4 minutes of
// arrivals seed 6 gave 3.25 s → 2.24 s: these small replicas (nine mean
// requests) fill with critical work too, which eviction never takes.
// The test's seed, 1, is the trap at its clearest.
func TestEvictionOverHTTP(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		results := runEvictPhases(t, 1)
		checkCounts(t, results)
		off, on := results[0], results[1]
		for _, r := range results {
			require.Zero(t, r.Lost, "%s: backends behind virtual time", r.Policy)
			require.Zero(t, r.Stalled, "%s: the process stalled on virtual time", r.Policy)
			t.Logf("%s: critical TTFT p99 %v; critical: %s; sheddable: %s; evictions %d, backend aborts %d",
				r.Policy, quantile(r.Load.Critical.TTFT, 0.99), r.Load.Critical.summary(), r.Load.Sheddable.summary(),
				(&EvictRun{PhaseResult: r}).Evicted(), r.Aborted)
		}
		require.Nil(t, off.Stats.Eviction, "eviction off: no evictor")
		require.Nil(t, off.Evictions)
		require.Zero(t, off.Aborted, "eviction off: the backends aborted nothing")
		ev := &EvictRun{PhaseResult: on}
		require.NotZero(t, ev.Evicted(), "eviction on: nothing evicted (the KV trap did not form)")
		require.Equal(t, ev.Evicted(), ev.Requeued()+on.Evictions.Declined[1], "every eviction re-queued or declined")
		require.Zero(t, on.Evictions.Ended[1], "no started response ended")
		require.Equal(t, ev.Requeued(), on.Stats.Bands[1].Requeued, "the gateway's re-queues are the controller's")
		require.Zero(t, on.Stats.Bands[0].Requeued+ev.Stats.Eviction.Evicted[0], "no critical request evicted")
		require.NotZero(t, on.Aborted, "the victims were aborted at their backends")
		require.LessOrEqual(t, on.Aborted, ev.Evicted(), "the backends aborted only victims")
		for _, r := range results {
			s := &r.Load.Sheddable
			require.True(t, OneResponse(s), "%s: sheddable: %s", r.Policy, s.summary())
			require.Equal(t, s.Sent, s.Status[200], "%s: every sheddable client got a 200: %s", r.Policy, s.summary())
			require.Equal(t, s.Sent, s.Completed, "%s: with the whole completion", r.Policy)
			require.Zero(t, r.Load.Critical.Cut+r.Load.Critical.Stopped, "%s: critical streams cut", r.Policy)
		}
	})
}

// runEvictPhases runs evictTestLoad(seed) through the proxy with
// soft-reflective, eviction off then on, in the caller's synctest bubble.
func runEvictPhases(t *testing.T, seed uint64) []*PhaseResult {
	load, replica := evictTestLoad(seed)
	spec := DemoSpec{Config: gateway.DefaultConfig(), Backends: 2, Replica: replica, Load: load, Net: new(memnet.Network)}
	soft := gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName}
	var results []*PhaseResult
	for _, on := range []bool{false, true} {
		s := spec
		s.Config.Eviction = on
		r, err := RunPhase(context.Background(), s, soft, false)
		require.NoError(t, err)
		results = append(results, r)
	}
	return results
}
