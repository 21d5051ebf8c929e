package saturation

import (
	"math"
	"strings"
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
	proj := Scorer{Projection: ProjectCompletion}
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

func TestScorerProjectSteady(t *testing.T) {
	st := Scorer{Projection: ProjectSteady}
	r := good(0, 100, 0.1)
	r.PromptMean, r.OutputMean, r.KVCapacity = 1000, 200, 1e6
	// young batch: 100 · (1000 + 100) / 1e6 = 0.11 > 0.1 read
	assert.InDelta(t, 0.11/0.8, st.Pod(r, t0), 1e-12)
	r.KVUsage = 0.3 // holds more than a steady batch would: as scraped
	assert.InDelta(t, 0.3/0.8, st.Pod(r, t0), 1e-12)
	r.KVUsage, r.KVCapacity = 0.1, 0
	assert.InDelta(t, 0.1/0.8, st.Pod(r, t0), 1e-12, "capacity unknown: unprojected")
	assert.Equal(t, 0.0, SteadyKV(100, 1000, 0, 1e6), "output unknown")
	assert.Equal(t, 0.0, SteadyKV(math.NaN(), 1, 1, 1))
	assert.Equal(t, 0.0, SteadyKV(1, 1, 1, math.Inf(1)))
	assert.InDelta(t, 1e308/1e300*(1+0.5), SteadyKV(1e308, 1, 1, 1e300), 1e296)
	err := Scorer{Projection: 9}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Scorer.Projection")
	assert.Equal(t, "none", ProjectNone.String())
	assert.Equal(t, "completion", ProjectCompletion.String())
	assert.Equal(t, "steady", ProjectSteady.String())
	assert.Equal(t, "KVProjection(9)", KVProjection(9).String())
}

// TestSteadyKVProperties: SteadyKV matches its model, is linear in the
// running count, and ProjectSteady never scores below the scraped usage nor
// above the larger of it and the steady level.
func TestSteadyKVProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		run := rapid.Float64Range(0, 2000).Draw(t, "running")
		p := rapid.Float64Range(0, 1e5).Draw(t, "p")
		o := rapid.Float64Range(1e-3, 1e5).Draw(t, "o")
		c := rapid.Float64Range(1, 1e7).Draw(t, "c")
		v := SteadyKV(run, p, o, c)
		// Relative tolerance, plus an absolute one far below any real
		// score: a subnormal result (running ≈ 1e-310) has no relative
		// precision left.
		if want := run * (p + o/2) / c; math.Abs(v-want) > 1e-9*want+1e-300 {
			t.Fatalf("SteadyKV = %v, model %v", v, want)
		}
		if v2 := SteadyKV(2*run, p, o, c); math.Abs(v2-2*v) > 1e-9*v+1e-300 {
			t.Fatalf("not linear in running: %v, %v", v, v2)
		}
		r := good(0, run, rapid.Float64Range(0, 1.2).Draw(t, "kv"))
		r.PromptMean, r.OutputMean, r.KVCapacity = p, o, c
		got := Scorer{Projection: ProjectSteady}.Pod(r, t0)
		base := Scorer{}.Pod(r, t0)
		if got < base || got > max(base, v/DefaultKVUtilThreshold)*(1+1e-12) {
			t.Fatalf("steady score %v, scraped %v, steady level %v", got, base, v)
		}
	})
}

func TestScorerPoolMax(t *testing.T) {
	var s Scorer
	assert.InDelta(t, 0.5, s.PoolMax([]Reading{good(0, 0, 0), good(0, 0, 0.4)}, t0), 1e-12)
	assert.Equal(t, 1.0, s.PoolMax(nil, t0), "empty pool is fail safe")
	stale := good(0, 0, 0)
	stale.At = t0.Add(-time.Second)
	assert.Equal(t, 1.0, s.PoolMax([]Reading{good(0, 0, 0), stale}, t0), "a stale pod scores 1")
	s.IgnoreStale = true
	assert.Equal(t, 0.0, s.PoolMax([]Reading{good(0, 0, 0), stale}, t0), "IgnoreStale leaves it out")
	assert.Equal(t, 1.0, s.PoolMax([]Reading{stale}, t0), "no pod counted: fail safe")
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
		proj.Projection = ProjectCompletion
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
		mean, mx := proj.Pool(rs, t0), proj.PoolMax(rs, t0)
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
// SteadyKV is never NaN nor negative, the prompt-token term is never NaN
// nor below the reference score, and the projected pod score is never NaN, never below the unprojected one
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
		// The same three floats as running, lengths and capacity.
		if v := SteadyKV(kv, p, o, kv+p); !(v >= 0) {
			t.Fatalf("SteadyKV(%v, %v, %v, %v) = %v", kv, p, o, kv+p, v)
		}
		r := good(0, 1, kv)
		r.PromptMean, r.OutputMean = p, o
		a, b := Scorer{}.Pod(r, t0), Scorer{Projection: ProjectCompletion}.Pod(r, t0)
		if math.IsNaN(b) || b < a || (!math.IsInf(b, 1) && b > 2*a) {
			t.Fatalf("kv %v, means (%v, %v): score %v, projected %v", kv, p, o, a, b)
		}
		// The prompt-token term with the same floats as waiting count and
		// threshold: never NaN, never below the reference.
		q := good(math.Abs(o), 0, 0)
		q.PromptMean = p
		pt := Scorer{PromptTokenThreshold: max(1, math.Abs(kv))}
		if v, ref := pt.Pod(q, t0), (Scorer{}).Pod(q, t0); math.IsNaN(v) || v < ref {
			t.Fatalf("prompt-token score %v for waiting %v, mean %v", v, math.Abs(o), p)
		}
	})
}

// TestParseMetricsLengthMeans: ParseMetrics reads the prompt and output
// length means from vLLM's histograms (Σ _sum / Σ _count over the engines),
// and a page without them, or with a bad count, parses with the means 0.
func TestParseMetricsLengthMeans(t *testing.T) {
	page := `# HELP vllm:num_requests_waiting w
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 2
vllm:num_requests_running{engine="0"} 7
vllm:kv_cache_usage_perc{engine="0"} 0.25
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf"} 3
vllm:request_prompt_tokens_sum{engine="0"} 300
vllm:request_prompt_tokens_count{engine="0"} 3
vllm:request_prompt_tokens_sum{engine="1"} 100
vllm:request_prompt_tokens_count{engine="1"} 2
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="+Inf"} 5
vllm:request_generation_tokens_sum{engine="0"} 1500
vllm:request_generation_tokens_count{engine="0"} 5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="15912"} 1.0
`
	r, err := ParseMetrics(strings.NewReader(page), VLLM())
	require.NoError(t, err)
	assert.InDelta(t, 80, r.PromptMean, 1e-12) // (300 + 100) / (3 + 2)
	assert.InDelta(t, 300, r.OutputMean, 1e-12)
	assert.Equal(t, 15912.0*16, r.KVCapacity)
	assert.Equal(t, 2.0, r.Waiting)
	assert.Equal(t, 0.25, r.KVUsage)

	bare := "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n"
	r, err = ParseMetrics(strings.NewReader(bare), VLLM())
	require.NoError(t, err)
	assert.Zero(t, r.PromptMean)
	assert.Zero(t, r.OutputMean)
	assert.Zero(t, r.KVCapacity)

	bad := bare + "vllm:request_generation_tokens_sum 10\nvllm:request_generation_tokens_count -1\n" +
		"vllm:request_prompt_tokens_sum NaN\nvllm:request_prompt_tokens_count 2\n" +
		"vllm:cache_config_info{block_size=\"x\",num_gpu_blocks=\"15912\"} 1\n"
	r, err = ParseMetrics(strings.NewReader(bad), VLLM())
	require.NoError(t, err, "a bad length histogram does not fail the scrape")
	assert.Zero(t, r.OutputMean)
	assert.Zero(t, r.PromptMean)
	assert.Zero(t, r.KVCapacity, "an unparsable block size")
}

func TestScorerPromptTokenThreshold(t *testing.T) {
	s := Scorer{PromptTokenThreshold: 2048}
	require.NoError(t, s.Validate())
	r := good(3, 10, 0.1)
	r.PromptMean = 1176
	assert.InDelta(t, 3*1176/2048.0, s.Pod(r, t0), 1e-12, "three code-generation prompts waiting")
	r.PromptMean = 39
	assert.InDelta(t, 3/5.0, s.Pod(r, t0), 1e-12, "three chat prompts: the request count wins")
	r.PromptMean = 0
	assert.InDelta(t, 3/5.0, s.Pod(r, t0), 1e-12, "no mean yet: no term")
	r.PromptMean = math.NaN()
	assert.InDelta(t, 3/5.0, s.Pod(r, t0), 1e-12, "a bad mean: no term, not failed")
	c := Scorer{PromptTokenThreshold: 1000, InFlightCredit: true}
	q := good(1, 1, 0)
	q.InFlight, q.PromptMean = 4, 500
	assert.InDelta(t, 3*500/1000.0, c.Pod(q, t0), 1e-12, "the credited waiting count is the one weighed")
	for _, bad := range []float64{-1, 0.5, math.NaN(), math.Inf(1)} {
		err := Scorer{PromptTokenThreshold: bad}.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, "%v", bad)
		assert.Contains(t, err.Error(), "Scorer.PromptTokenThreshold")
		assert.InDelta(t, 3/5.0, Scorer{PromptTokenThreshold: bad}.Pod(good(3, 0, 0), t0), 1e-12, "invalid = off")
	}
}

// TestPromptTokenTermProperties: the prompt-token term never lowers a score,
// is exactly the larger of the reference score and waiting·p/T, and is
// monotone in the waiting count.
func TestPromptTokenTermProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.Float64Range(0, 1e4).Draw(t, "waiting")
		p := rapid.Float64Range(0, 1e5).Draw(t, "p")
		th := rapid.Float64Range(1, 1e6).Draw(t, "threshold")
		r := good(w, rapid.Float64Range(0, 1e3).Draw(t, "running"), rapid.Float64Range(0, 1.2).Draw(t, "kv"))
		r.PromptMean = p
		s := Scorer{PromptTokenThreshold: th}
		base, got := Scorer{}.Pod(r, t0), s.Pod(r, t0)
		want := max(base, w/th*p)
		if math.Abs(got-want) > 1e-12*max(1, want) {
			t.Fatalf("score %v, model %v", got, want)
		}
		r2 := r
		r2.Waiting = w + rapid.Float64Range(0, 1e4).Draw(t, "more")
		if s.Pod(r2, t0) < got {
			t.Fatalf("more waiting scored lower")
		}
	})
}

// TestCreditThresholdWithProjection: the live credit's hinge (T, m) is the
// in-flight count at which Pod with the credit starts to exceed Pod without
// it and the rate at which it then grows, with the projection on as with it
// off and with the prompt-token term, so the poller's hinge is the scorer's
// credit at every count.
func TestCreditThresholdWithProjection(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := Scorer{InFlightCredit: true, Projection: rapid.SampledFrom([]KVProjection{ProjectNone, ProjectCompletion, ProjectSteady}).Draw(t, "projection"),
			PromptTokenThreshold: rapid.SampledFrom([]float64{0, 1024, 4096}).Draw(t, "prompt threshold")}
		r := good(rapid.Float64Range(0, 20).Draw(t, "w"), rapid.Float64Range(0, 50).Draw(t, "r"), rapid.Float64Range(0, 1).Draw(t, "kv"))
		r.PromptMean, r.OutputMean, r.KVCapacity = rapid.Float64Range(0, 4000).Draw(t, "p"), 500, 1e4
		th, slope := s.creditHinge(r)
		off := s
		off.InFlightCredit = false
		base := off.Pod(r, t0)
		for _, f := range []float64{th - 1, th, th + 1, th + 7} {
			if f < 0 {
				continue
			}
			q := r
			q.InFlight = int64(math.Floor(f))
			want := base + max(0, float64(q.InFlight)-th)*slope
			if got := s.Pod(q, t0); math.Abs(got-want) > 1e-9*max(1, want) {
				t.Fatalf("in flight %d, T %v, m %v: Pod %v, hinge %v", q.InFlight, th, slope, got, want)
			}
		}
	})
}
