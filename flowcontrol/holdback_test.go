package flowcontrol_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// checkCeilingGate asserts the fixed-ceiling gate (Static, PriorityHoldback)
// for any raw input: open exactly below the band's ceiling, blocked at and
// above it, and monotone: a lower band or a higher saturation never opens
// more often.
func checkCeilingGate(fail func(string, ...any), p flowcontrol.CeilingPolicy, band, bands int, s float64) {
	g := p.Gate(band, bands, s)
	cs := flowcontrol.Sanitize(s)
	if g.Ceiling != g.Ceiling {
		fail("Gate(%d, %d, %v) = %+v: NaN ceiling", band, bands, s, g)
	}
	if g2 := p.Gate(band, bands, cs); g2 != g {
		fail("Gate(%d, %d, %v) = %+v but %+v after Sanitize", band, bands, s, g, g2)
	}
	if want := map[bool]int{true: 1, false: 0}[cs < g.Ceiling]; g.Every != want {
		fail("Gate(%d, %d, %v) = %+v: want Every %d (open exactly below the ceiling)", band, bands, s, g, want)
	}
	if band+1 < bands {
		lower := p.Gate(band+1, bands, s)
		if lower.Ceiling > g.Ceiling {
			fail("band %d's ceiling %v above band %d's %v", band+1, lower.Ceiling, band, g.Ceiling)
		}
		if openRate(lower) > openRate(g) {
			fail("band %d (%+v) opens more than band %d (%+v) at s=%v, bands=%d", band+1, lower, band, g, s, bands)
		}
	}
	for _, up := range []float64{cs * 1.01, cs + 0.01, cs + 0.3, g.Ceiling} {
		if h := p.Gate(band, bands, up); up > cs && openRate(h) > openRate(g) {
			fail("Gate(%d, %d, %v) = %+v opens more than at %v (%+v)", band, bands, up, h, s, g)
		}
	}
}

func TestStaticGateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		threshold := rapid.OneOf(rapid.Just(1.0), rapid.Float64Range(1e-3, 5), rapid.Just(math.Inf(1))).Draw(t, "threshold")
		bands := rapid.IntRange(-1, 10).Draw(t, "bands")
		band := rapid.IntRange(-2, 12).Draw(t, "band")
		s := saturationGen().Draw(t, "s")
		p := flowcontrol.NewStatic(threshold)
		checkCeilingGate(t.Fatalf, p, band, bands, s)
		// One threshold: every band's gate is the same.
		for b := range max(bands, 1) {
			if g := p.Gate(b, bands, s); g != p.Gate(band, bands, s) || g.Ceiling != threshold {
				t.Fatalf("static(%v).Gate(%d, %d, %v) = %+v differs from band %d's", threshold, b, bands, s, g, band)
			}
		}
	})
}

// descendingPriorities draws n strictly decreasing priority values.
func descendingPriorities(t *rapid.T, n int) []int {
	set := rapid.SliceOfNDistinct(rapid.IntRange(-1000, 1000), n, n, rapid.ID[int]).Draw(t, "priorities")
	slices.Sort(set)
	slices.Reverse(set)
	return set
}

func TestHoldbackCeilingsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		prios := descendingPriorities(t, n)
		domain := rapid.SampledFrom([]string{"", flowcontrol.HoldbackRank, flowcontrol.HoldbackValue}).Draw(t, "domain")
		lo := rapid.Float64Range(0, 0.99).Draw(t, "min")
		hi := rapid.Float64Range(lo+0.005, 1).Draw(t, "max")
		cfg := flowcontrol.HoldbackConfig{Domain: domain, MinCeiling: lo, MaxCeiling: hi}
		cs, err := cfg.BandCeilings(prios)
		if err != nil {
			t.Fatalf("HoldbackCeilings(%+v, %v): %v", cfg, prios, err)
		}
		if len(cs) != n {
			t.Fatalf("%d ceilings for %d bands", len(cs), n)
		}
		const eps = 1e-12
		for i, c := range cs {
			if c < lo-eps || c > hi+eps {
				t.Fatalf("ceiling[%d] = %v outside [%v, %v]", i, c, lo, hi)
			}
			if i > 0 && c > cs[i-1]+eps {
				t.Fatalf("ceilings increase at band %d: %v", i, cs)
			}
		}
		if cs[0] != hi {
			t.Fatalf("band 0's ceiling %v, want maxCeiling %v", cs[0], hi)
		}
		if n == 1 {
			return
		}
		if math.Abs(cs[n-1]-lo) > eps {
			t.Fatalf("last band's ceiling %v, want minCeiling %v", cs[n-1], lo)
		}
		for i := 1; i < n; i++ {
			var want float64
			if domain == flowcontrol.HoldbackValue {
				// Affine in the priority value.
				want = lo + float64(prios[i]-prios[n-1])/float64(prios[0]-prios[n-1])*(hi-lo)
			} else {
				// Equal steps by rank.
				want = hi - float64(i)*(hi-lo)/float64(n-1)
			}
			if math.Abs(cs[i]-want) > 1e-9 {
				t.Fatalf("%s: ceiling[%d] = %v, want %v (priorities %v)", domain, i, cs[i], want, prios)
			}
		}
		// The rank policy built without priorities gives the same
		// ceilings (within float rounding).
		if domain != flowcontrol.HoldbackValue {
			p, err := flowcontrol.NewPriorityHoldback(lo, hi)
			if err != nil {
				t.Fatal(err)
			}
			for i := range cs {
				if d := p.Ceiling(i, n) - cs[i]; math.Abs(d) > 1e-12 {
					t.Fatalf("NewPriorityHoldback ceiling(%d, %d) = %v, HoldbackCeilings %v", i, n, p.Ceiling(i, n), cs[i])
				}
			}
		}
	})
}

func TestHoldbackExplicit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "n")
		prios := descendingPriorities(t, n)
		// A map over some of the bands' priorities plus strangers, with
		// non-increasing values from the highest priority down.
		keys := rapid.SliceOfNDistinct(rapid.IntRange(-1000, 1000), 1, 10, rapid.ID[int]).Draw(t, "keys")
		keys = append(keys, rapid.SliceOfDistinct(rapid.SampledFrom(prios), rapid.ID[int]).Draw(t, "known")...)
		slices.Sort(keys)
		keys = slices.Compact(keys)
		vals := rapid.SliceOfN(rapid.Float64Range(0, 1), len(keys), len(keys)).Draw(t, "vals")
		slices.Sort(vals) // ascending with the keys: non-increasing from the top
		m := map[int]float64{}
		for i, k := range keys {
			m[k] = vals[i]
		}
		cs, err := (flowcontrol.HoldbackConfig{Domain: flowcontrol.HoldbackExplicit, Ceilings: m}).BandCeilings(prios)
		if err != nil {
			t.Fatal(err)
		}
		// Each band its entry (absent: 0, always held back), never above
		// the band above it.
		want := 1.0
		for i, p := range prios {
			want = min(want, m[p])
			if cs[i] != want {
				t.Fatalf("band %d (priority %d): ceiling %v, want %v (map %v)", i, p, cs[i], want, m)
			}
		}
	})
}

func TestHoldbackGateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(-1, 10).Draw(t, "bands")
		band := rapid.IntRange(-2, 12).Draw(t, "band")
		s := saturationGen().Draw(t, "s")
		lo := rapid.Float64Range(0, 0.99).Draw(t, "min")
		hi := rapid.Float64Range(lo+0.005, 1).Draw(t, "max")
		var p *flowcontrol.PriorityHoldback
		var err error
		if rapid.Bool().Draw(t, "rank") {
			p, err = flowcontrol.NewPriorityHoldback(lo, hi)
		} else {
			cs := rapid.SliceOfN(rapid.Float64Range(0, 1), 1, 10).Draw(t, "ceilings")
			slices.Sort(cs)
			slices.Reverse(cs)
			p, err = flowcontrol.NewPriorityHoldbackCeilings(cs)
		}
		if err != nil {
			t.Fatal(err)
		}
		checkCeilingGate(t.Fatalf, p, band, bands, s)
		if c := p.Gate(band, bands, s).Ceiling; c < 0 || c > 1 {
			t.Fatalf("ceiling %v outside [0, 1]", c)
		}
	})
}

func TestHoldbackConfigErrors(t *testing.T) {
	two := []int{10, 0}
	for _, tc := range []struct {
		cfg   flowcontrol.HoldbackConfig
		prios []int
		want  string // the parameter the error names
	}{
		{flowcontrol.HoldbackConfig{MinCeiling: -0.1}, two, "minCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: 1}, two, "minCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: math.NaN()}, two, "minCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, MaxCeiling: 1.5}, two, "maxCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, MaxCeiling: -1}, two, "maxCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, MaxCeiling: 0.5}, two, "minCeiling"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, Shape: "sigmoid"}, two, "shape"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, Domain: "ranks"}, two, "domain"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5, Ceilings: map[int]float64{1: 1}}, two, "ceilings"},
		{flowcontrol.HoldbackConfig{Domain: "explicit"}, two, "ceilings"},
		{flowcontrol.HoldbackConfig{Domain: "explicit", MinCeiling: 0.2, Ceilings: map[int]float64{1: 1}}, two, "minCeiling"},
		{flowcontrol.HoldbackConfig{Domain: "explicit", MaxCeiling: 0.9, Ceilings: map[int]float64{1: 1}}, two, "maxCeiling"},
		{flowcontrol.HoldbackConfig{Domain: "explicit", Shape: "linear", Ceilings: map[int]float64{1: 1}}, two, "shape"},
		{flowcontrol.HoldbackConfig{Domain: "explicit", Ceilings: map[int]float64{10: 1.2}}, two, "ceilings[10]"},
		{flowcontrol.HoldbackConfig{Domain: "explicit", Ceilings: map[int]float64{10: 0.5, 0: 0.6}}, two, "ceilings[0]"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5}, nil, "band priorities"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5}, []int{0, 10}, "decrease strictly"},
		{flowcontrol.HoldbackConfig{MinCeiling: 0.5}, []int{5, 5}, "decrease strictly"},
	} {
		_, err := tc.cfg.BandCeilings(tc.prios)
		if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "flowcontrol: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("HoldbackCeilings(%+v, %v) = %v, want ErrInvalidConfig naming %q", tc.cfg, tc.prios, err, tc.want)
		}
	}
	for _, cs := range [][]float64{nil, {0.5, 0.6}, {1.1}, {math.NaN()}, {-0.1}} {
		if _, err := flowcontrol.NewPriorityHoldbackCeilings(cs); !errors.Is(err, flowcontrol.ErrInvalidConfig) {
			t.Errorf("NewPriorityHoldbackCeilings(%v) = %v, want ErrInvalidConfig", cs, err)
		}
	}
	// llm-d's own examples load: rank 0.4..0.9, and its explicit map.
	cs, err := (flowcontrol.HoldbackConfig{Shape: "linear", Domain: "rank", MinCeiling: 0.4, MaxCeiling: 0.9}).BandCeilings([]int{100, 50, 10})
	if err != nil || !slices.Equal(cs, []float64{0.9, 0.65, 0.4}) {
		t.Errorf("rank 0.4..0.9 over 3 bands: %v %v", cs, err)
	}
	cs, err = (flowcontrol.HoldbackConfig{Domain: "value", MinCeiling: 0.4, MaxCeiling: 0.9}).BandCeilings([]int{100, 50, 0})
	if err != nil || !slices.Equal(cs, []float64{0.9, 0.65, 0.4}) {
		t.Errorf("value 0.4..0.9 over 100, 50, 0: %v %v", cs, err)
	}
	cs, err = (flowcontrol.HoldbackConfig{Domain: "explicit", Ceilings: map[int]float64{100: 0.95, 50: 0.7, 10: 0.3}}).BandCeilings([]int{100, 50, 10, 0})
	if err != nil || !slices.Equal(cs, []float64{0.95, 0.7, 0.3, 0}) {
		t.Errorf("explicit: %v %v", cs, err)
	}
	// A band missing from the map holds back every band below it.
	cs, err = (flowcontrol.HoldbackConfig{Domain: "explicit", Ceilings: map[int]float64{100: 0.9, 0: 0.3}}).BandCeilings([]int{100, 50, 0})
	if err != nil || !slices.Equal(cs, []float64{0.9, 0, 0}) {
		t.Errorf("explicit with a gap: %v %v", cs, err)
	}
}

// FuzzHoldbackCeilings checks HoldbackCeilings against a model of the
// validity rules, and the ceilings it returns against their invariants.
func FuzzHoldbackCeilings(f *testing.F) {
	f.Add("", "", 0.4, 0.9, uint8(3), int16(100), 0.5, int16(10), 0.4, false)
	f.Add("rank", "linear", 0.0, 0.0, uint8(2), int16(0), 0.0, int16(0), 0.0, false)
	f.Add("value", "", 0.5, 1.0, uint8(4), int16(7), 0.0, int16(0), 0.0, false)
	f.Add("explicit", "", 0.0, 0.0, uint8(3), int16(100), 0.9, int16(0), 0.3, true)
	f.Add("explicit", "", 0.0, 0.0, uint8(3), int16(100), 0.3, int16(0), 0.9, true)
	f.Add("explicit", "linear", 0.0, 0.0, uint8(1), int16(1), 1.5, int16(2), 0.5, true)
	f.Add("sigmoid", "", 0.4, 0.9, uint8(2), int16(0), 0.0, int16(0), 0.0, false)
	f.Add("", "", 1.0, 0.9, uint8(0), int16(0), 0.0, int16(0), 0.0, false)
	f.Add("", "", math.NaN(), math.Inf(1), uint8(2), int16(0), 0.0, int16(0), 0.0, true)
	f.Fuzz(func(t *testing.T, domain, shape string, lo, hi float64, n uint8, k1 int16, v1 float64, k2 int16, v2 float64, withMap bool) {
		// Bands at priorities 10·(n−1), …, 10, 0 (n = 0 is no band).
		prios := make([]int, n%20)
		for i := range prios {
			prios[i] = 10 * (len(prios) - 1 - i)
		}
		var m map[int]float64
		if withMap {
			m = map[int]float64{int(k1): v1, int(k2): v2}
		}
		cfg := flowcontrol.HoldbackConfig{Domain: domain, Shape: shape, MinCeiling: lo, MaxCeiling: hi, Ceilings: m}
		cs, err := cfg.BandCeilings(prios)

		in := func(v, a, b float64) bool { return v >= a && v <= b }
		valid := len(prios) > 0
		switch domain {
		case "", "rank", "value":
			max := hi
			if max == 0 {
				max = 1
			}
			valid = valid && (shape == "" || shape == "linear") && !withMap &&
				lo >= 0 && lo < 1 && max > 0 && max <= 1 && lo < max
		case "explicit":
			valid = valid && shape == "" && lo == 0 && hi == 0 && withMap && in(v1, 0, 1) && in(v2, 0, 1)
			if valid && k1 != k2 {
				hiK, loK := k1, k2
				if hiK < loK {
					hiK, loK = loK, hiK
				}
				valid = m[int(loK)] <= m[int(hiK)]
			}
		default:
			valid = false
		}
		if valid != (err == nil) {
			t.Fatalf("HoldbackCeilings(%+v, %v) = %v, model says valid=%v", cfg, prios, err, valid)
		}
		if err != nil {
			if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "flowcontrol: ") {
				t.Fatalf("error %q is not a flowcontrol ErrInvalidConfig", err)
			}
			return
		}
		p, err := flowcontrol.NewPriorityHoldbackCeilings(cs)
		if err != nil {
			t.Fatalf("ceilings %v from a valid config refused: %v", cs, err)
		}
		for b := range len(cs) + 1 {
			for _, s := range []float64{0, 0.3, 0.5, 0.7, 0.9, 0.99, 1, math.NaN()} {
				checkCeilingGate(t.Fatalf, p, b, len(cs), s)
			}
		}
	})
}
