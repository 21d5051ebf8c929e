package saturation

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func good(waiting, running, kv float64) Reading {
	return Reading{Waiting: waiting, Running: running, KVUsage: kv, At: t0, OK: true}
}

func TestScorerPodRules(t *testing.T) {
	var s Scorer // the reference configuration
	credit := Scorer{InFlightCredit: true}
	nan, inf := math.NaN(), math.Inf(1)
	withInFlight := func(r Reading, n int64) Reading { r.InFlight = n; return r }
	stamped := func(r Reading, at time.Time) Reading { r.At = at; return r }
	cases := []struct {
		name string
		s    Scorer
		r    Reading
		now  time.Time
		want float64
	}{
		{"idle", s, good(0, 0, 0), t0, 0},
		{"queue bound", s, good(2, 0, 0.4), t0, 0.5},       // max(2/5, 0.4/0.8)
		{"kv bound", s, good(1, 0, 0.72), t0, 0.9},         // max(0.2, 0.9)
		{"overloaded", s, good(10, 0, 0.1), t0, 2},         // 10/5
		{"kv above 1 scored", s, good(0, 0, 1.2), t0, 1.5}, // not rejected
		{"not OK", s, Reading{At: t0}, t0, 1},              // no good scrape
		{"fresh at the limit", s, good(0, 0, 0), t0.Add(DefaultStaleness), 0},
		{"stale", s, good(0, 0, 0), t0.Add(DefaultStaleness + 1), 1},
		{"future reading is fresh", s, stamped(good(0, 0, 0), t0.Add(time.Hour)), t0, 0},
		{"NaN waiting", s, good(nan, 0, 0), t0, 1},
		{"NaN running", s, good(0, nan, 0), t0, 1},
		{"NaN kv", s, good(0, 0, nan), t0, 1},
		{"negative waiting", s, good(-1, 0, 0), t0, 1},
		{"-Inf kv", s, good(0, 0, math.Inf(-1)), t0, 1},
		{"+Inf waiting", s, good(inf, 0, 0), t0, 1},
		{"+Inf kv", s, good(0, 0, inf), t0, 1},
		{"+Inf running", s, good(0, inf, 0), t0, 1},
		{"huge waiting raw", s, good(1e300, 0, 0), t0, 2e299},
		{"overflow is +Inf", Scorer{QueueDepthThreshold: 1e-300}, good(1e300, 0, 0), t0, inf},
		{"credit off ignores in-flight", s, withInFlight(good(0, 0, 0), 10), t0, 0},
		{"credit", credit, withInFlight(good(1, 2, 0), 8), t0, 1.2},                // (1 + 8-3)/5
		{"credit never negative", credit, withInFlight(good(1, 9, 0), 2), t0, 0.2}, // 1/5
		{"negative in-flight ignored", credit, withInFlight(good(1, 0, 0), -50), t0, 0.2},
		{"credit with overflowing visible", credit, withInFlight(good(1, math.MaxFloat64, 0), 50), t0, 0.2},
		{"custom thresholds", Scorer{QueueDepthThreshold: 10, KVUtilThreshold: 0.5}, good(5, 0, 0.2), t0, 0.5},
		{"custom staleness", Scorer{Staleness: time.Second}, good(0, 0, 0), t0.Add(999 * time.Millisecond), 0},
		{"bad fields take defaults", Scorer{QueueDepthThreshold: -1, KVUtilThreshold: nan, Staleness: -1}, good(5, 0, 0), t0, 1},
	}
	for _, c := range cases {
		got := c.s.Pod(c.r, c.now)
		if math.IsInf(c.want, 1) {
			assert.True(t, math.IsInf(got, 1), "%s: %v", c.name, got)
			continue
		}
		assert.InDelta(t, c.want, got, 1e-12, c.name)
	}
}

func TestScorerPool(t *testing.T) {
	var s Scorer
	stale := good(0, 0, 0)
	stale.At = t0.Add(-time.Second)
	assert.Equal(t, 1.0, s.Pool(nil, t0), "empty pool is fail safe")
	assert.InDelta(t, 0.25, s.Pool([]Reading{good(0, 0, 0), good(0, 0, 0.4)}, t0), 1e-12)
	assert.InDelta(t, 0.5, s.Pool([]Reading{good(0, 0, 0), stale}, t0), 1e-12, "stale pod scores 1")
	assert.InDelta(t, 2.0/3, s.Pool([]Reading{good(0, 0, 0), {}, good(5, 0, 0)}, t0), 1e-12, "failed pod scores 1")

	ig := Scorer{IgnoreStale: true}
	assert.Equal(t, 0.0, ig.Pool([]Reading{good(0, 0, 0), stale, {}}, t0), "IgnoreStale leaves failed pods out")
	assert.Equal(t, 1.0, ig.Pool([]Reading{stale, {}}, t0), "all left out: fail safe")
	assert.Equal(t, 1.0, ig.Pod(stale, t0), "Pod still scores a stale pod 1")
	assert.False(t, ig.Usable(stale, t0))
	assert.True(t, ig.Usable(good(1, 1, 1), t0))
}

func TestScorerValidate(t *testing.T) {
	assert.NoError(t, Scorer{}.Validate())
	assert.NoError(t, Scorer{QueueDepthThreshold: 3, KVUtilThreshold: 0.9, Staleness: time.Second}.Validate())
	assert.NoError(t, Scorer{QueueDepthThreshold: 1e-9, KVUtilThreshold: 1, Staleness: MinStaleness}.Validate(), "lower edges")
	assert.NoError(t, Scorer{QueueDepthThreshold: 1e300, KVUtilThreshold: 1e-9, Staleness: MaxStaleness}.Validate(), "upper edges")
	for _, c := range []struct {
		field string
		s     Scorer
	}{
		{"QueueDepthThreshold", Scorer{QueueDepthThreshold: -1}},
		{"QueueDepthThreshold", Scorer{QueueDepthThreshold: math.NaN()}},
		{"QueueDepthThreshold", Scorer{QueueDepthThreshold: math.Inf(1)}},
		{"KVUtilThreshold", Scorer{KVUtilThreshold: math.NaN()}},
		{"KVUtilThreshold", Scorer{KVUtilThreshold: -0.1}},
		{"KVUtilThreshold", Scorer{KVUtilThreshold: 1.0000001}},
		{"KVUtilThreshold", Scorer{KVUtilThreshold: 5}},
		{"Staleness", Scorer{Staleness: -time.Millisecond}},
		{"Staleness", Scorer{Staleness: MinStaleness - 1}},
		{"Staleness", Scorer{Staleness: MaxStaleness + 1}},
		{"Staleness", Scorer{Staleness: 87600 * time.Hour}},
	} {
		err := c.s.Validate()
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", c.s)
		assert.ErrorContains(t, err, "Scorer."+c.field, "%+v", c.s)
		assert.True(t, strings.HasPrefix(err.Error(), "saturation: "), "%q", err)
	}
}

func TestScorerAllocFree(t *testing.T) {
	s := Scorer{InFlightCredit: true}
	rs := []Reading{good(1, 2, 0.3), good(0, 0, 0.9), {}}
	var sink float64
	allocs := testing.AllocsPerRun(100, func() {
		sink += s.Pool(rs, t0) + s.Pod(rs[0], t0)
	})
	assert.Zero(t, allocs)
	assert.False(t, math.IsNaN(sink))
}

// genCount draws request counts: mostly small whole numbers, as a real pod
// reports, sometimes anything at all.
func genCount() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.Map(rapid.IntRange(0, 40), func(n int) float64 { return float64(n) }),
		rapid.Map(rapid.IntRange(0, 40), func(n int) float64 { return float64(n) }),
		genAny(),
	)
}

// genReading draws readings over the whole float range, special values and
// staleness included.
func genReading(t *rapid.T, label string) Reading {
	return Reading{
		Waiting:  genCount().Draw(t, label+".waiting"),
		Running:  genCount().Draw(t, label+".running"),
		KVUsage:  rapid.OneOf(rapid.Float64Range(0, 1.2), genAny()).Draw(t, label+".kv"),
		InFlight: rapid.Int64Range(-10, 100).Draw(t, label+".inflight"),
		At:       t0.Add(-time.Duration(rapid.Int64Range(-1e9, 1e9).Draw(t, label+".age"))),
		OK:       rapid.Float64Range(0, 1).Draw(t, label+".ok") < 0.9,
	}
}

func genScorer(t *rapid.T) Scorer {
	return Scorer{
		QueueDepthThreshold: rapid.Float64Range(0, 50).Draw(t, "qdt"),
		KVUtilThreshold:     rapid.Float64Range(0, 2).Draw(t, "kvt"),
		Staleness:           time.Duration(rapid.Int64Range(0, 1e9).Draw(t, "staleness")),
		IgnoreStale:         rapid.Bool().Draw(t, "ignoreStale"),
		InFlightCredit:      rapid.Bool().Draw(t, "credit"),
	}
}

// podModel is the formula written out plainly, for valid fresh readings.
func podModel(s Scorer, r Reading) float64 {
	s = s.withDefaults()
	w := r.Waiting
	if s.InFlightCredit {
		w += math.Max(0, float64(r.InFlight)-(r.Waiting+r.Running))
	}
	return math.Max(w/s.QueueDepthThreshold, r.KVUsage/s.KVUtilThreshold)
}

func TestScorerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genScorer(t)
		rs := make([]Reading, rapid.IntRange(0, 6).Draw(t, "pods"))
		for i := range rs {
			rs[i] = genReading(t, "pod")
		}
		// Bounds: never NaN or negative (raw: +Inf when a formula
		// overflows; the dispatcher caps it).
		pool := s.Pool(rs, t0)
		if !validSat(pool) {
			t.Fatalf("pool %v out of range", pool)
		}
		// Pool is the mean of Pod over the pods it counts.
		sum, n := 0.0, 0
		for _, r := range rs {
			p := s.Pod(r, t0)
			if !validSat(p) {
				t.Fatalf("pod %v out of range for %+v", p, r)
			}
			if !s.Usable(r, t0) {
				if p != 1 {
					t.Fatalf("unusable pod scored %v", p)
				}
				if s.IgnoreStale {
					continue
				}
			} else if r.Waiting < math.Inf(1) && r.KVUsage < math.Inf(1) && r.Running < math.Inf(1) {
				if want := podModel(s, r); math.IsInf(p, 1) != math.IsInf(want, 1) || math.Abs(p-want) > 1e-9*math.Max(1, want) {
					t.Fatalf("pod %v, model %v for %+v", p, want, r)
				}
			}
			sum += p
			n++
		}
		want := 1.0
		if n > 0 {
			want = sum / float64(n)
		}
		if math.IsInf(pool, 1) != math.IsInf(want, 1) || math.Abs(pool-want) > 1e-9*math.Max(1, want) {
			t.Fatalf("pool %v, mean of pods %v", pool, want)
		}
	})
}

// tol is the rounding slack of a score: 1e-9, relative above 1 (scores are
// not capped, and float64 spacing at 1.7e7 is already 3.7e-9).
func tol(x float64) float64 { return 1e-9 * math.Max(1, math.Abs(x)) }

// TestScorerMonotone: on a usable reading, more waiting, more KV usage or more
// in-flight never lowers the score, and more running never raises it.
func TestScorerMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genScorer(t)
		r := Reading{
			Waiting:  rapid.Float64Range(0, 1e4).Draw(t, "waiting"),
			Running:  rapid.Float64Range(0, 1e4).Draw(t, "running"),
			KVUsage:  rapid.Float64Range(0, 2).Draw(t, "kv"),
			InFlight: rapid.Int64Range(0, 1e4).Draw(t, "inflight"),
			At:       t0, OK: true,
		}
		base := s.Pod(r, t0)
		up := rapid.Float64Range(0, 1e3).Draw(t, "up")
		more := r
		switch field := rapid.IntRange(0, 3).Draw(t, "field"); field {
		case 0:
			more.Waiting += up
		case 1:
			more.KVUsage += up
		case 2:
			more.InFlight += int64(up)
		case 3:
			more.Running += up
			if got := s.Pod(more, t0); got > base+tol(base) {
				t.Fatalf("more running raised %v to %v", base, got)
			}
			return
		}
		if got := s.Pod(more, t0); got < base-tol(base) {
			t.Fatalf("raising an input lowered %v to %v", base, got)
		}
		// Adding a failed pod pulls the pool toward 1 (counted as 1), or
		// leaves it alone with IgnoreStale.
		alone := s.Pool([]Reading{r}, t0)
		want := (alone + 1) / 2
		if s.IgnoreStale {
			want = alone
		}
		if got := s.Pool([]Reading{r, {}}, t0); math.Abs(got-want) > 1e-9*math.Max(1, want) {
			t.Fatalf("pool with a failed pod %v, want %v", got, want)
		}
	})
}
