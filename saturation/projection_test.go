package saturation

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestKVGrowthValues(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name string
		p, o float64
		want float64
	}{
		{"codegen means", 1176, 195, (1176 + 195) / (1176 + 97.5)},
		{"chat means", 39, 300, 339 / 189.0},
		{"reasoning means", 780, 6200, 6980 / 3880.0},
		{"pure generation", 0, 100, 2},
		{"unknown output", 100, 0, 1},
		{"unknown both", 0, 0, 1},
		{"negative prompt", -1, 100, 1},
		{"negative output", 100, -1, 1},
		{"NaN prompt", nan, 100, 1},
		{"NaN output", 100, nan, 1},
		{"+Inf prompt", inf, 100, 1},
		{"+Inf output", 100, inf, 1},
		{"huge lengths", 1e308, 1e308, 4.0 / 3},
		{"output negligible", 1e308, 1e-300, 1},
	}
	for _, c := range cases {
		assert.InDelta(t, c.want, KVGrowth(c.p, c.o), 1e-12, c.name)
	}
}

func TestScorerProjectKV(t *testing.T) {
	proj := Scorer{ProjectKV: true}
	r := good(0, 100, 0.4)
	r.PromptMean, r.OutputMean = 39, 300
	// 0.4 · 339/189 / 0.8
	assert.InDelta(t, 0.4*339/189/0.8, proj.Pod(r, t0), 1e-12)
	assert.InDelta(t, 0.5, Scorer{}.Pod(r, t0), 1e-12, "off: the lengths are ignored")
	r.OutputMean = 0
	assert.InDelta(t, 0.5, proj.Pod(r, t0), 1e-12, "no finished request yet: unprojected")
	r.OutputMean = math.NaN()
	assert.InDelta(t, 0.5, proj.Pod(r, t0), 1e-12, "a bad mean does not fail the pod")
	assert.True(t, proj.Usable(r, t0))
	q := good(4, 100, 0.1)
	q.PromptMean, q.OutputMean = 0, 300
	assert.InDelta(t, 0.8, proj.Pod(q, t0), 1e-12, "the queue term still wins when larger")
}

func TestScorerAggregateMax(t *testing.T) {
	mx := Scorer{Aggregate: AggregateMax}
	require.NoError(t, mx.Validate())
	assert.InDelta(t, 0.5, mx.Pool([]Reading{good(0, 0, 0), good(0, 0, 0.4)}, t0), 1e-12)
	assert.Equal(t, 1.0, mx.Pool(nil, t0), "empty pool is fail safe")
	stale := good(0, 0, 0)
	stale.At = t0.Add(-time.Second)
	assert.Equal(t, 1.0, mx.Pool([]Reading{good(0, 0, 0), stale}, t0), "a stale pod scores 1")
	mx.IgnoreStale = true
	assert.Equal(t, 0.0, mx.Pool([]Reading{good(0, 0, 0), stale}, t0), "IgnoreStale leaves it out")
	err := Scorer{Aggregate: 7}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Scorer.Aggregate")
	assert.InDelta(t, 0.25, Scorer{Aggregate: 7}.Pool([]Reading{good(0, 0, 0), good(0, 0, 0.4)}, t0), 1e-12,
		"an invalid Aggregate is the mean, as other invalid fields take their default")
	assert.Equal(t, "mean", AggregateMean.String())
	assert.Equal(t, "max", AggregateMax.String())
	assert.Equal(t, "Aggregate(7)", Aggregate(7).String())
}

// TestKVGrowthProperties checks KVGrowth against its model over any means:
// in [1, 2], exactly (p+o)/(p+o/2) where that is computable, non-increasing
// in the prompt and non-decreasing in the output.
func TestKVGrowthProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := rapid.Float64Range(0, 1e6).Draw(t, "p")
		o := rapid.Float64Range(1e-3, 1e6).Draw(t, "o")
		g := KVGrowth(p, o)
		if g < 1 || g > 2 {
			t.Fatalf("KVGrowth(%v, %v) = %v outside [1, 2]", p, o, g)
		}
		if want := (p + o) / (p + o/2); math.Abs(g-want) > 1e-12*want {
			t.Fatalf("KVGrowth(%v, %v) = %v, model %v", p, o, g, want)
		}
		dp := rapid.Float64Range(0, 1e6).Draw(t, "dp")
		if g2 := KVGrowth(p+dp, o); g2 > g*(1+1e-12) {
			t.Fatalf("more prompt grew more: %v then %v", g, g2)
		}
		do := rapid.Float64Range(0, 1e6).Draw(t, "do")
		if g2 := KVGrowth(p, o+do); g2 < g*(1-1e-12) {
			t.Fatalf("more output grew less: %v then %v", g, g2)
		}
	})
}

// TestScorerProjectionProperties: over any pool, ProjectKV never lowers a
// pod's score and raises it by at most the growth; the max aggregate is at
// least the mean, at most the largest pod, and equal to the mean for one
// pod.
func TestScorerProjectionProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "pods")
		rs := make([]Reading, n)
		for i := range rs {
			rs[i] = good(rapid.Float64Range(0, 50).Draw(t, "waiting"), rapid.Float64Range(0, 1000).Draw(t, "running"),
				rapid.Float64Range(0, 1.2).Draw(t, "kv"))
			rs[i].PromptMean = rapid.Float64Range(0, 1e4).Draw(t, "p")
			rs[i].OutputMean = rapid.Float64Range(0, 1e4).Draw(t, "o")
			if rapid.Bool().Draw(t, "stale") {
				rs[i].At = t0.Add(-time.Hour)
			}
		}
		base := Scorer{IgnoreStale: rapid.Bool().Draw(t, "ignore")}
		proj := base
		proj.ProjectKV = true
		hi := 0.0
		for _, r := range rs {
			a, b := base.Pod(r, t0), proj.Pod(r, t0)
			g := KVGrowth(r.PromptMean, r.OutputMean)
			if b < a || b > a*g*(1+1e-12) {
				t.Fatalf("projection %v of score %v (growth %v)", b, a, g)
			}
			if base.Usable(r, t0) || !base.IgnoreStale {
				hi = max(hi, b)
			}
		}
		mean := proj.Pool(rs, t0)
		proj.Aggregate = AggregateMax
		mx := proj.Pool(rs, t0)
		if mx < mean*(1-1e-12) {
			t.Fatalf("max %v below mean %v", mx, mean)
		}
		if empty := mean == 1 && hi == 0; !empty && mx != hi {
			t.Fatalf("max %v, largest counted pod %v", mx, hi)
		}
		if n == 1 && mx != mean {
			t.Fatalf("one pod: max %v, mean %v", mx, mean)
		}
	})
}

// FuzzKVGrowth: any pair of float64 means gives a finite growth in [1, 2],
// and the projected pod score is never NaN, never below the unprojected one
// and at most twice it.
func FuzzKVGrowth(f *testing.F) {
	f.Add(1176.0, 195.0, 0.5)
	f.Add(39.0, 300.0, 0.9)
	f.Add(0.0, 0.0, 0.0)
	f.Add(math.NaN(), math.Inf(1), 1.0)
	f.Add(1e308, 1e-308, 1e308)
	f.Add(-1.0, 5e-324, 0.3)
	f.Fuzz(func(t *testing.T, p, o, kv float64) {
		g := KVGrowth(p, o)
		if !(g >= 1 && g <= 2) {
			t.Fatalf("KVGrowth(%v, %v) = %v", p, o, g)
		}
		r := good(0, 1, kv)
		r.PromptMean, r.OutputMean = p, o
		a, b := Scorer{}.Pod(r, t0), Scorer{ProjectKV: true}.Pod(r, t0)
		if math.IsNaN(b) || b < a || (!math.IsInf(b, 1) && b > 2*a) {
			t.Fatalf("kv %v, means (%v, %v): score %v, projected %v", kv, p, o, a, b)
		}
	})
}
