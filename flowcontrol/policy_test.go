package flowcontrol_test

import (
	"errors"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// specialSaturations are the raw inputs every policy must survive.
var specialSaturations = []float64{
	math.NaN(), math.Inf(1), math.Inf(-1), -1, math.Copysign(0, -1), 0, 0.5, 0.6, 0.75, 0.9, 1, 1.5,
	math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 1e300, 1e-300,
	1 - 1e-16, 1 + 1e-16,
}

// saturationGen draws any float64, the special values weighted in.
func saturationGen() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.SampledFrom(specialSaturations),
		rapid.Float64Range(-1, 3),
		rapid.Float64Range(0, 1),
		rapid.Float64(),
	)
}

// The sheddable duty cycle of two bands at decimal saturations, as exact
// arithmetic gives it.
func TestSoftReflectiveTwoBandGates(t *testing.T) {
	p := flowcontrol.NewSoftReflective()
	for _, tc := range []struct {
		s     float64
		every int
	}{
		{0, 1}, {0.25, 1}, {0.5, 1}, {0.6, 2}, {0.7, 2}, {0.75, 3}, {0.8, 4},
		{0.9, 9}, {1, 0}, {1.5, 0}, {math.Inf(1), 0}, {math.NaN(), 0}, {-3, 1},
	} {
		if g := p.Gate(1, 2, tc.s); g.Every != tc.every {
			t.Errorf("Gate(1, 2, %v).Every = %d, want %d (gate %+v)", tc.s, g.Every, tc.every, g)
		}
		if g := p.Gate(0, 2, tc.s); g.Every != 1 && !(flowcontrol.Sanitize(tc.s) > 1) {
			t.Errorf("Gate(0, 2, %v) = %+v: critical is open up to s = 1", tc.s, g)
		}
	}
	// 0.7/0.3 = 2.333 → 2; 0.8/0.2 = 4 (float: 3.9999999999999996 → 4).
	// A plain math.Round on 0.6/0.4 gives 1: the rounding matters.
	// (Variables, not constants: Go folds constants exactly.)
	s := 0.6
	if got := math.Round(s / (1 - s)); got != 1 {
		t.Fatalf("float64 premise changed: math.Round(0.6/0.4) = %v", got)
	}
}

func TestSoftReflectiveFourBands(t *testing.T) {
	p := flowcontrol.NewSoftReflective()
	// N=4, s=0.75: ceilings 1, 0.75, 0.5, 0.25 → every 1, 1, round(1.5)=2, 3.
	want := []flowcontrol.Gate{{Ceiling: 1, Every: 1}, {Ceiling: 0.75, Every: 1}, {Ceiling: 0.5, Every: 2}, {Ceiling: 0.25, Every: 3}}
	for b, w := range want {
		if g := p.Gate(b, 4, 0.75); g.Every != w.Every || math.Abs(g.Ceiling-w.Ceiling) > 1e-12 {
			t.Errorf("Gate(%d, 4, 0.75) = %+v, want %+v", b, g, w)
		}
	}
	// s = 1.5 > 1: band 0 every round(1.5/1) = 2, band 1 a trickle
	// (ceiling 0.5, every 3), band 2 is
	// at ceiling 0 (blocked), band 3 clamped at 0.
	for b, every := range []int{2, 3, 0, 0} {
		if g := p.Gate(b, 4, 1.5); g.Every != every {
			t.Errorf("Gate(%d, 4, 1.5) = %+v, want every %d", b, g, every)
		}
	}
}

func TestStatic(t *testing.T) {
	p := flowcontrol.NewStatic(1)
	for _, tc := range []struct {
		s     float64
		every int
	}{
		{0, 1}, {0.5, 1}, {0.99, 1}, {1, 0}, {2, 0}, {math.NaN(), 0}, {math.Inf(1), 0}, {math.Inf(-1), 1},
	} {
		for b := range 3 {
			if g := p.Gate(b, 3, tc.s); g.Every != tc.every || g.Ceiling != 1 {
				t.Errorf("static(1).Gate(%d, 3, %v) = %+v, want every %d", b, tc.s, g, tc.every)
			}
		}
	}
	if got := flowcontrol.NewStatic(math.NaN()).Threshold(); got != flowcontrol.DefaultStaticThreshold {
		t.Errorf("NewStatic(NaN).Threshold() = %v", got)
	}
	// The demo's "no flow control" is a static threshold far above any
	// reading: it must stay open at MaxSaturation.
	if g := flowcontrol.NewStatic(2*flowcontrol.MaxSaturation).Gate(1, 2, math.Inf(1)); g.Every != 1 {
		t.Errorf("static(2·MaxSaturation) at +Inf = %+v, want open", g)
	}
}

func TestPolicyFunc(t *testing.T) {
	var p flowcontrol.CeilingPolicy = flowcontrol.PolicyFunc(func(band, bands int, s float64) flowcontrol.Gate {
		return flowcontrol.Gate{Ceiling: s, Every: band + bands}
	})
	if g := p.Gate(2, 3, 0.5); g != (flowcontrol.Gate{Ceiling: 0.5, Every: 5}) {
		t.Errorf("PolicyFunc.Gate = %+v", g)
	}
}

func TestPolicyByName(t *testing.T) {
	p, err := flowcontrol.PolicyByName("static-usage-limit-policy", nil)
	if err != nil || p.(*flowcontrol.Static).Threshold() != 1 {
		t.Fatalf("static default: %v %v", p, err)
	}
	p, err = flowcontrol.PolicyByName("static-usage-limit-policy", map[string]float64{"threshold": 0.8})
	if err != nil || p.Gate(0, 2, 0.8).Every != 0 || p.Gate(1, 2, 0.8).Every != 0 ||
		p.Gate(0, 2, 0.79).Every != 1 || p.Gate(1, 2, 0.4).Every != 1 {
		t.Fatalf("static 0.8: %v %v", p, err)
	}
	p, err = flowcontrol.PolicyByName("priority-holdback-policy", map[string]float64{"minCeiling": 0.4, "maxCeiling": 0.9})
	if h, ok := p.(*flowcontrol.PriorityHoldback); err != nil || !ok || h.Ceiling(0, 2) != 0.9 || h.Ceiling(1, 2) != 0.4 {
		t.Fatalf("priority-holdback: %v %v", p, err)
	}
	p, err = flowcontrol.PolicyByName("soft-reflective-ceiling-policy", nil)
	if _, ok := p.(*flowcontrol.SoftReflective); err != nil || !ok {
		t.Fatalf("soft-reflective: %v %v", p, err)
	}
	for _, bad := range []struct {
		name   string
		params map[string]float64
	}{
		{"nope", nil},
		{"static-usage-limit-policy", map[string]float64{"treshold": 1}},
		{"static-usage-limit-policy", map[string]float64{"threshold": math.NaN()}},
		{"static-usage-limit-policy", map[string]float64{"threshold": -1}},
		{"soft-reflective-ceiling-policy", map[string]float64{"threshold": 1}},
		{"priority-holdback-policy", nil},
		{"priority-holdback-policy", map[string]float64{"maxCeiling": 0.9}},
		{"priority-holdback-policy", map[string]float64{"minCeiling": 0.5, "maxCeiling": 0}},
		{"priority-holdback-policy", map[string]float64{"minCeiling": 0.5, "maxCeiling": 0.4}},
		{"priority-holdback-policy", map[string]float64{"minCeiling": 1}},
		{"priority-holdback-policy", map[string]float64{"minCeiling": 0.5, "domain": 1}},
	} {
		if _, err := flowcontrol.PolicyByName(bad.name, bad.params); !errors.Is(err, flowcontrol.ErrInvalidConfig) {
			t.Errorf("PolicyByName(%q, %v) err = %v, want ErrInvalidConfig", bad.name, bad.params, err)
		}
	}
}

func TestSanitizeProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := saturationGen().Draw(t, "s")
		c := flowcontrol.Sanitize(s)
		switch {
		case math.IsNaN(s):
			if c != 1 {
				t.Fatalf("Sanitize(NaN) = %v", c)
			}
		case s < 0:
			if c != 0 {
				t.Fatalf("Sanitize(%v) = %v", s, c)
			}
		case s > flowcontrol.MaxSaturation:
			if c != flowcontrol.MaxSaturation {
				t.Fatalf("Sanitize(%v) = %v", s, c)
			}
		default:
			if c != s {
				t.Fatalf("Sanitize(%v) = %v, want unchanged", s, c)
			}
		}
		if flowcontrol.Sanitize(c) != c {
			t.Fatalf("Sanitize not idempotent at %v", s)
		}
	})
}

// checkGate asserts the invariants of the soft-reflective gate for any raw
// input; shared by the rapid property and FuzzGate.
func checkGate(fail func(string, ...any), band, bands int, s float64) {
	p := flowcontrol.NewSoftReflective()
	g := p.Gate(band, bands, s)
	if g.Every < 0 || g.Every > flowcontrol.MaxEvery {
		fail("Gate(%d, %d, %v).Every = %d out of [0, MaxEvery]", band, bands, s, g.Every)
	}
	if math.IsNaN(g.Ceiling) || g.Ceiling < 0 || g.Ceiling > 1 {
		fail("Gate(%d, %d, %v).Ceiling = %v out of [0, 1]", band, bands, s, g.Ceiling)
	}
	if band <= 0 || bands <= 1 {
		want := 1
		if cs := flowcontrol.Sanitize(s); cs > 1 {
			want = min(int(cs+0.5), flowcontrol.MaxEvery)
		}
		if g.Every != want || g.Ceiling != 1 {
			fail("critical band: Gate(%d, %d, %v) = %+v, want ceiling 1, Every %d", band, bands, s, g, want)
		}
		return
	}
	// Same input after sanitising gives the same gate (policy is total and
	// consistent with the dispatcher's sanitised input).
	if g2 := p.Gate(band, bands, flowcontrol.Sanitize(s)); g2 != g {
		fail("Gate(%d, %d, %v) = %+v but %+v after Sanitize", band, bands, s, g, g2)
	}
	cs := flowcontrol.Sanitize(s)
	if cs <= g.Ceiling && g.Every != 1 {
		fail("dead zone gated: Gate(%d, %d, %v) = %+v", band, bands, s, g)
	}
	if g.Ceiling == 0 && g.Every != 0 {
		fail("zero ceiling not blocked: Gate(%d, %d, %v) = %+v", band, bands, s, g)
	}
	if g.Ceiling > 0 && g.Every == 0 {
		fail("positive ceiling blocked: Gate(%d, %d, %v) = %+v", band, bands, s, g)
	}
	if g.Ceiling > 0 && g.Ceiling < cs && g.Every < flowcontrol.MaxEvery {
		// every = round-half-up(s/ceiling): |every − s/ceiling| ≤ ½.
		q := cs / g.Ceiling
		if d := float64(g.Every) - q; d < -0.5-1e-6*q || d > 0.5+1e-6*q {
			fail("Gate(%d, %d, %v).Every = %d, ratio %v", band, bands, s, g.Every, q)
		}
	}
	// Monotone across bands: a lower band is never opened more often.
	if band+1 < bands {
		lo := p.Gate(band+1, bands, s)
		if openRate(lo) > openRate(g) {
			fail("band %d (%+v) opens more than band %d (%+v) at s=%v, bands=%d", band+1, lo, band, g, s, bands)
		}
	}
}

func openRate(g flowcontrol.Gate) float64 {
	if g.Every <= 0 {
		return 0
	}
	return 1 / float64(g.Every)
}

func TestGateInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(-2, 10).Draw(t, "bands")
		band := rapid.IntRange(-2, 12).Draw(t, "band")
		s := saturationGen().Draw(t, "s")
		checkGate(t.Fatalf, band, bands, s)
	})
}

func FuzzGate(f *testing.F) {
	for _, s := range specialSaturations {
		f.Add(1, 2, s)
		f.Add(0, 2, s)
		f.Add(3, 8, s)
		f.Add(7, 8, s)
	}
	f.Add(-1, 0, 0.5)
	f.Add(9, 3, 0.7)
	f.Fuzz(func(t *testing.T, band, bands int, s float64) {
		checkGate(t.Fatalf, band, bands, s)
	})
}

// A user policy's out-of-range Every is clamped by the dispatcher: negative
// is blocked, huge is MaxEvery (never a panic, never a band stuck open).
func TestDispatcherClampsPolicyEvery(t *testing.T) {
	for _, tc := range []struct{ every, want int }{{-5, 0}, {flowcontrol.MaxEvery + 7, flowcontrol.MaxEvery}, {3, 3}} {
		var r rec
		p := flowcontrol.PolicyFunc(func(int, int, float64) flowcontrol.Gate { return flowcontrol.Gate{Every: tc.every} })
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(1, 2), Source: newSat(0), Policy: p, BlockCritical: true}}, &r)
		_ = d.Enqueue(0, 1)
		d.Step()
		if got := d.Stats().Bands[0].Gate.Every; got != tc.want || len(r.take()) != 0 {
			t.Errorf("policy Every %d: stats Every %d, want %d", tc.every, got, tc.want)
		}
	}
}

// At a saturation above the threshold, a dispatcher under Static releases
// band 0 and nothing from band 1; with Config.BlockCritical it releases
// nothing.
func TestStaticCriticalDispatch(t *testing.T) {
	for _, tc := range []struct {
		block bool
		want  int
	}{{false, 10}, {true, 0}} {
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: bandsOf(2, 64), Source: newSat(1.5), Policy: flowcontrol.NewStatic(1), Burst: 1, BlockCritical: tc.block}}, &r)
		for i := range 20 {
			if err := d.Enqueue(i%2, i); err != nil {
				t.Fatal(err)
			}
		}
		for range 10 {
			d.Step()
		}
		got := r.take()
		for _, e := range got {
			if e.band != 0 || e.reason != nil {
				t.Fatalf("block %v: event %+v at s = 1.5: only band 0 may be released", tc.block, e)
			}
		}
		if len(got) != tc.want {
			t.Errorf("block %v: %d band-0 releases of 10 at s = 1.5, want %d", tc.block, len(got), tc.want)
		}
	}
}

func FuzzStatic(f *testing.F) {
	for _, s := range []float64{0, 0.59, 0.6, 0.99, 1, 1 + 1e-16, 1.5, math.NaN(), math.Inf(1), math.Inf(-1)} {
		f.Add(1.0, 0, 2, s)
		f.Add(1.0, 1, 2, s)
	}
	f.Add(0.0, 0, 2, 1.0)
	f.Add(0.8, -1, 0, 0.8)
	f.Add(0.8, 7, 8, 0.79)
	f.Add(math.NaN(), 0, 2, 1.0)
	f.Add(-1.0, 0, 2, 1.0)
	f.Add(math.Inf(1), 0, 2, math.Inf(1))
	f.Add(1e-300, 0, 2, 0.0)
	f.Fuzz(func(t *testing.T, threshold float64, band, bands int, s float64) {
		checkCeilingGate(t.Fatalf, flowcontrol.NewStatic(threshold), band, bands, s)
	})
}
