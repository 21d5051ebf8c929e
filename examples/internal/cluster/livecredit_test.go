package cluster

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/saturation"
)

// TestLivePoolProperty: against Scorer.Pool's exact credit, LivePool (the poller's hinge)
// is equal when no term but the queue's and KV's can lead (no prompt-token term, no
// projection), never above it otherwise, and never below the score without the credit;
// without the credit it is Pool.
func TestLivePoolProperty(t *testing.T) {
	now := time.Unix(100, 0)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(t, "pods")
		rs := make([]saturation.Reading, n)
		for i := range rs {
			w := float64(rapid.IntRange(0, 30).Draw(t, "waiting"))
			r := float64(rapid.IntRange(0, 200).Draw(t, "running"))
			rs[i] = saturation.Reading{Waiting: w, Running: r, KVUsage: rapid.Float64Range(0, 1).Draw(t, "kv"),
				InFlight: int64(rapid.IntRange(0, 260).Draw(t, "inflight")), PromptMean: rapid.Float64Range(1, 4000).Draw(t, "prompt"),
				OutputMean: 500, KVCapacity: 1e5, At: now, OK: !rapid.Bool().Draw(t, "failed")}
		}
		sc := saturation.Scorer{InFlightCredit: true, QueueDepthThreshold: rapid.SampledFrom([]float64{0, 5, 6.25}).Draw(t, "q")}
		off := sc
		off.InFlightCredit = false
		if got := LivePool(off, rs, now); got != off.Pool(rs, now) {
			t.Fatalf("without the credit: %v, Pool %v", got, off.Pool(rs, now))
		}
		if got, want := LivePool(sc, rs, now), sc.Pool(rs, now); math.Abs(got-want) > 1e-9 {
			t.Fatalf("queue and KV only: LivePool %v, Pool %v", got, want)
		}
		sc.PromptTokenThreshold = rapid.SampledFrom([]float64{1024, 4096}).Draw(t, "prompt threshold")
		sc.Projection = rapid.SampledFrom([]saturation.KVProjection{saturation.ProjectNone, saturation.ProjectSteady}).Draw(t, "projection")
		off.PromptTokenThreshold, off.Projection = sc.PromptTokenThreshold, sc.Projection
		got, exact, bare := LivePool(sc, rs, now), sc.Pool(rs, now), off.Pool(rs, now)
		if got > exact+1e-9 || got < bare-1e-9 {
			t.Fatalf("with the terms: LivePool %v outside [%v, %v]", got, bare, exact)
		}
	})
}
