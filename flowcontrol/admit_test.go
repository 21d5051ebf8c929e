package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// countingSource is a rand.Source that counts its draws.
type countingSource struct {
	src   rand.Source
	draws atomic.Int64
}

func (c *countingSource) Uint64() uint64 { c.draws.Add(1); return c.src.Uint64() }

func newProbabilistic(t testing.TB, src flowcontrol.SaturationSource, seed uint64) (*flowcontrol.Probabilistic, *countingSource) {
	t.Helper()
	rnd := &countingSource{src: rand.NewPCG(seed, 0x5eed)}
	a, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: src, Rand: rnd})
	require.NoError(t, err)
	return a, rnd
}

// TestProbabilisticRate: the refusal frequency of a sheddable band matches
// min(1, 300·s^5) within 4.5 binomial standard deviations (a fixed seed,
// so the test is deterministic; the bound is what makes it able to fail).
func TestProbabilisticRate(t *testing.T) {
	const n = 200_000
	for _, s := range []float64{0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.31} {
		a, rnd := newProbabilistic(t, constSat(s), 42)
		p := min(1, 300*math.Pow(s, 5))
		require.InDelta(t, p, a.ShedProbability(s), 1e-15, "s=%v", s)
		shed := 0
		for range n {
			if !a.Admit(1, 2) {
				shed++
			}
		}
		sigma := math.Sqrt(n * p * (1 - p))
		require.InDelta(t, n*p, float64(shed), 4.5*sigma+1e-9,
			"s=%v: %d of %d shed, want %.1f ± %.1f", s, shed, n, n*p, 4.5*sigma)
		require.Equal(t, int64(n), rnd.draws.Load(), "one draw per sheddable Admit with 0 < p < 1")
	}
}

// TestProbabilisticDeterministic: the same seed gives the same refusals.
func TestProbabilisticDeterministic(t *testing.T) {
	a, _ := newProbabilistic(t, constSat(0.25), 7)
	b, _ := newProbabilistic(t, constSat(0.25), 7)
	c, _ := newProbabilistic(t, constSat(0.25), 8)
	same, differ := true, false
	for range 1000 {
		x, y, z := a.Admit(1, 2), b.Admit(1, 2), c.Admit(1, 2)
		same = same && x == y
		differ = differ || x != z
	}
	require.True(t, same, "same seed, same sequence")
	require.True(t, differ, "another seed, another sequence")
}

// TestProbabilisticBands: band 0 is never shed, whatever the saturation and
// K; FirstSheddable and LastBandOnly choose the others.
func TestProbabilisticBands(t *testing.T) {
	inf := constSat(math.Inf(1))
	for _, cfg := range []flowcontrol.ProbabilisticConfig{
		{Source: inf},
		{Source: inf, K: math.MaxFloat64, Power: 0.001},
		{Source: inf, FirstSheddable: 2},
		{Source: inf, LastBandOnly: true},
	} {
		a, err := flowcontrol.NewProbabilistic(cfg)
		require.NoError(t, err)
		for _, bands := range []int{1, 2, 3, 4, 5, 8, flowcontrol.MaxBands} {
			require.True(t, a.Admit(0, bands), "band 0 of %d, %+v", bands, cfg)
			require.False(t, a.Sheddable(0, bands))
			require.False(t, a.Sheddable(bands, bands), "no such band")
			for band := 1; band < bands; band++ {
				want := band >= max(1, cfg.FirstSheddable)
				if cfg.LastBandOnly {
					want = band == bands-1
				}
				require.Equal(t, want, a.Sheddable(band, bands), "band %d of %d", band, bands)
				require.Equal(t, !want, a.Admit(band, bands), "band %d of %d at s=+Inf", band, bands)
			}
		}
	}
}

// TestProbabilisticUnknownAdmits: a NaN reading (unknown) admits, as does a
// saturation at or below 0, and neither draws; +Inf and a probability of 1
// refuse without drawing.
func TestProbabilisticUnknownAdmits(t *testing.T) {
	for _, tc := range []struct {
		s     float64
		admit bool
	}{{math.NaN(), true}, {0, true}, {-3, true}, {math.Inf(-1), true}, {math.Inf(1), false}, {0.5, false}, {1, false}} {
		a, rnd := newProbabilistic(t, constSat(tc.s), 1)
		for range 100 {
			require.Equal(t, tc.admit, a.Admit(1, 2), "s=%v", tc.s)
		}
		require.Zero(t, rnd.draws.Load(), "s=%v: no draw when the answer is certain", tc.s)
	}
	a, _ := newProbabilistic(t, constSat(0), 1)
	require.Zero(t, a.ShedProbability(math.NaN()))
	require.Equal(t, 1.0, a.ShedProbability(math.Inf(1)))
	require.Equal(t, 1.0, a.ShedProbability(1e300), "overflow is certain refusal")
}

func TestProbabilisticValidation(t *testing.T) {
	src := constSat(0)
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		field string
		cfg   flowcontrol.ProbabilisticConfig
	}{
		{"ProbabilisticConfig.Source", flowcontrol.ProbabilisticConfig{}},
		{"ProbabilisticConfig.K", flowcontrol.ProbabilisticConfig{Source: src, K: -1}},
		{"ProbabilisticConfig.K", flowcontrol.ProbabilisticConfig{Source: src, K: nan}},
		{"ProbabilisticConfig.K", flowcontrol.ProbabilisticConfig{Source: src, K: inf}},
		{"ProbabilisticConfig.Power", flowcontrol.ProbabilisticConfig{Source: src, Power: -5}},
		{"ProbabilisticConfig.Power", flowcontrol.ProbabilisticConfig{Source: src, Power: nan}},
		{"ProbabilisticConfig.Power", flowcontrol.ProbabilisticConfig{Source: src, Power: inf}},
		{"ProbabilisticConfig.FirstSheddable", flowcontrol.ProbabilisticConfig{Source: src, FirstSheddable: -1}},
	} {
		a, err := flowcontrol.NewProbabilistic(tc.cfg)
		require.Nil(t, a)
		require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
		require.True(t, strings.HasPrefix(err.Error(), "flowcontrol: "), "%q", err)
	}
	a, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: src, K: math.SmallestNonzeroFloat64, Power: math.MaxFloat64})
	require.NoError(t, err)
	require.Zero(t, a.ShedProbability(0.999))
	require.Equal(t, 1.0, a.ShedProbability(1.001))
}

// FuzzShedProbability: for any valid K and Power and any s, the probability
// is in [0, 1], 0 for NaN and s ≤ 0, non-decreasing in s, and agrees with
// exp(ln K + Power·ln s) wherever that is strictly inside (0, 1).
func FuzzShedProbability(f *testing.F) {
	f.Add(0.2, 0.0, 0.0)
	f.Add(0.3196, 300.0, 5.0)
	f.Add(math.NaN(), 300.0, 5.0)
	f.Add(-1.0, 1.0, 0.5)
	f.Add(math.Inf(1), 1e-300, 1e-300)
	f.Add(1e-300, 1e300, 1e300)
	f.Add(0.5, -1.0, 5.0)
	f.Add(0.5, 300.0, math.Inf(1))
	f.Add(5e-324, 300.0, 0.5)
	f.Fuzz(func(t *testing.T, s, k, p float64) {
		a, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: constSat(s), K: k, Power: p})
		valid := (k == 0 || k > 0 && !math.IsInf(k, 1)) && (p == 0 || p > 0 && !math.IsInf(p, 1))
		if valid != (err == nil) {
			t.Fatalf("K=%v Power=%v: err %v, valid %v", k, p, err, valid)
		}
		if err != nil {
			require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig)
			return
		}
		if k == 0 {
			k = flowcontrol.DefaultShedK
		}
		if p == 0 {
			p = flowcontrol.DefaultShedPower
		}
		got := a.ShedProbability(s)
		if !(got >= 0 && got <= 1) {
			t.Fatalf("ShedProbability(%v) = %v with K=%v Power=%v", s, got, k, p)
		}
		if !(s > 0) && got != 0 {
			t.Fatalf("ShedProbability(%v) = %v, want 0", s, got)
		}
		for _, bigger := range []float64{s * 1.5, s + 1, math.Inf(1)} {
			if s > 0 && a.ShedProbability(bigger) < got {
				t.Fatalf("not monotone: P(%v) = %v > P(%v) = %v", s, got, bigger, a.ShedProbability(bigger))
			}
		}
		// math.Log of a subnormal is off on amd64 (Log(5e-324) = −709.09, not
		// −744.44), so the reference is taken over normal numbers only.
		if s >= 0x1p-1022 && !math.IsInf(s, 1) {
			ref := math.Exp(math.Log(k) + p*math.Log(s))
			if ref > 1e-300 && ref < 1-1e-9 && got > 0 && got < 1 && math.Abs(got-ref) > 1e-9*ref*max(1, math.Abs(p*math.Log(s))) {
				t.Fatalf("ShedProbability(%v) = %v, reference %v (K=%v Power=%v)", s, got, ref, k, p)
			}
		}
		want := a.ShedProbability(s)
		admitted := a.Admit(1, 2)
		if want == 0 && !admitted || want == 1 && admitted {
			t.Fatalf("Admit at probability %v returned %v", want, admitted)
		}
		if !a.Admit(0, 2) {
			t.Fatal("band 0 shed")
		}
	})
}

// admitFunc adapts a function to flowcontrol.Admitter.
type admitFunc func(band, bands int) bool

func (f admitFunc) Admit(band, bands int) bool { return f(band, bands) }

// TestControllerShed: a refusal is ErrShed before the queue, counted in
// Stats.Refused.Shed, not reported to OnOutcome; the admitter is not asked
// for an unknown band, a done context, a stopped or a closed controller.
func TestControllerShed(t *testing.T) {
	var asked atomic.Int64
	outcomes := 0
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Config:    flowcontrol.Config{Bands: bandsOf(2, 4), Source: constSat(0)},
		OnOutcome: func(int, error, time.Duration) { outcomes++ },
		Admitter: admitFunc(func(band, bands int) bool {
			asked.Add(1)
			if bands != 2 {
				panic("bands")
			}
			return band == 0
		}),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	_, err = c.Wait(ctx, 1)
	require.ErrorIs(t, err, flowcontrol.ErrNotRunning, "not running: not asked")
	require.Zero(t, asked.Load())

	runErr := c.Start(ctx)
	_, err = c.Wait(ctx, 1)
	require.ErrorIs(t, err, flowcontrol.ErrShed)
	require.Equal(t, "flowcontrol: shed", err.Error())
	p, err := c.Wait(ctx, 0)
	require.NoError(t, err)
	p.Done()
	_, err = c.Wait(ctx, 2)
	require.ErrorIs(t, err, flowcontrol.ErrUnknownBand)
	dead, kill := context.WithCancel(ctx)
	kill()
	_, err = c.Wait(dead, 1)
	require.ErrorIs(t, err, flowcontrol.ErrCancelled)
	require.Equal(t, int64(2), asked.Load())

	st := c.Stats()
	require.Equal(t, uint64(1), st.Bands[1].Refused.Shed)
	require.Zero(t, st.Bands[0].Refused.Shed)
	require.Equal(t, uint64(1), st.Bands[0].Dispatched)
	require.Equal(t, 1, outcomes, "only the dispatched Wait is an outcome")

	c.Close()
	_, err = c.Wait(context.Background(), 1)
	require.ErrorIs(t, err, flowcontrol.ErrClosed, "closed: not asked")
	require.Equal(t, int64(2), asked.Load())
	cancel()
	<-runErr
}

// TestControllerShedStatsAddUp: a rapid property. Waits on random bands,
// with the admitter's saturation, cancelled contexts and unknown bands
// drawn at random, against a twin admitter of the same seed: every call is
// counted exactly once in Stats, shed calls exactly where the twin sheds.
func TestControllerShedStatsAddUp(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(1, 4).Draw(t, "bands")
		seed := rapid.Uint64().Draw(t, "seed")
		first := rapid.IntRange(0, 4).Draw(t, "firstSheddable")
		sat, twinSat := newSat(0), newSat(0)
		mk := func(src flowcontrol.SaturationSource) *flowcontrol.Probabilistic {
			a, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{
				Source: src, FirstSheddable: first, Rand: rand.NewPCG(seed, 1)})
			require.NoError(t, err)
			return a
		}
		adm, twin := mk(sat), mk(twinSat)
		c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
			Config:   flowcontrol.Config{Bands: bandsOf(bands, 8), Source: constSat(0), Burst: 64},
			Admitter: adm,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		runErr := c.Start(ctx)
		dead, kill := context.WithCancel(ctx)
		kill()

		want := make([]flowcontrol.BandStats, bands)
		unknown, calls := uint64(0), 0
		for range rapid.IntRange(0, 60).Draw(t, "calls") {
			band := rapid.IntRange(-1, bands).Draw(t, "band")
			s := rapid.SampledFrom([]float64{0, 0.1, 0.2, 0.25, 0.3, 0.5, math.NaN()}).Draw(t, "s")
			sat.Set(s)
			twinSat.Set(s)
			cancelled := rapid.IntRange(0, 9).Draw(t, "ctx") == 0
			wctx := ctx
			if cancelled {
				wctx = dead
			}
			calls++
			p, err := c.Wait(wctx, band)
			switch {
			case band < 0 || band >= bands:
				require.ErrorIs(t, err, flowcontrol.ErrUnknownBand)
				unknown++
			case cancelled:
				require.ErrorIs(t, err, flowcontrol.ErrCancelled)
				want[band].Refused.Cancelled++
			case !twin.Admit(band, bands):
				require.ErrorIs(t, err, flowcontrol.ErrShed, "band %d s %v", band, s)
				want[band].Refused.Shed++
			default:
				require.NoError(t, err, "band %d s %v", band, s)
				want[band].Dispatched++
				p.Done()
			}
		}
		st := c.Stats()
		require.Equal(t, unknown, st.UnknownBand)
		total := unknown
		for i := range bands {
			b := st.Bands[i]
			require.Equal(t, want[i].Dispatched, b.Dispatched, "band %d", i)
			require.Equal(t, want[i].Refused, b.Refused, "band %d", i)
			require.Zero(t, b.Queued)
			total += b.Dispatched + b.Dropped() + b.Rejected + b.Refused.Closed +
				b.Refused.Cancelled + b.Refused.NotRunning + b.Refused.Shed
		}
		require.Equal(t, uint64(calls), total, "every call counted exactly once")
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		c.Close()
	})
}

// Shed sheddable work at the door with llm-d's probabilistic admitter, in
// front of flow control: critical requests are never shed; a sheddable one
// is refused with probability min(1, 300·s^5) at the admitter's saturation s.
func ExampleNewProbabilistic() {
	admitterSat := newSat(0) // e.g. a saturation.Poller with the zero Scorer
	adm, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{
		Source: admitterSat,
		Rand:   rand.NewPCG(1, 2), // deterministic; nil = the global generator
	})
	if err != nil {
		panic(err)
	}
	for _, s := range []float64{0.1, 0.2, 0.3, 0.35} {
		fmt.Printf("s=%.2f: shed %.1f%%\n", s, 100*adm.ShedProbability(s))
	}
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Config: flowcontrol.Config{
			Bands:  []flowcontrol.BandConfig{{Name: "critical", Capacity: 64}, {Name: "sheddable", Capacity: 64}},
			Source: constSat(0), // flow control's own source
		},
		Admitter: adm,
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer c.Close()
	c.Start(ctx)

	admitterSat.Set(0.5) // overloaded: every sheddable request is shed
	for _, band := range []int{0, 1} {
		p, err := c.Wait(ctx, band)
		if err != nil {
			fmt.Printf("band %d: %v\n", band, err)
			continue
		}
		fmt.Printf("band %d: dispatched\n", band)
		p.Done()
	}
	fmt.Println("shed:", c.Stats().Bands[1].Refused.Shed)
	// Output:
	// s=0.10: shed 0.3%
	// s=0.20: shed 9.6%
	// s=0.30: shed 72.9%
	// s=0.35: shed 100.0%
	// band 0: dispatched
	// band 1: flowcontrol: shed
	// shed: 1
}

// TestProbabilisticAdmitAllocs: Admit allocates nothing, with an injected
// source or the global generator.
func TestProbabilisticAdmitAllocs(t *testing.T) {
	seeded, _ := newProbabilistic(t, constSat(0.25), 3)
	global, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: constSat(0.25)})
	require.NoError(t, err)
	for _, a := range []*flowcontrol.Probabilistic{seeded, global} {
		require.Zero(t, testing.AllocsPerRun(1000, func() { a.Admit(1, 2) }))
	}
}

// BenchmarkProbabilisticAdmit: one sheddable Admit at s = 0.25 (a draw every
// call), with a seeded source (a mutex) and with the global generator.
func BenchmarkProbabilisticAdmit(b *testing.B) {
	seeded, _ := newProbabilistic(b, constSat(0.25), 3)
	global, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: constSat(0.25)})
	require.NoError(b, err)
	for name, a := range map[string]*flowcontrol.Probabilistic{"seeded": seeded, "global": global} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					a.Admit(1, 2)
				}
			})
		})
	}
}

// BenchmarkControllerWaitAdmitter: back-to-back Waits on an open sheddable
// band, without and with a probabilistic admitter that admits (s = 0), at
// a large burst so that the tick budget does not bound the rate.
func BenchmarkControllerWaitAdmitter(b *testing.B) {
	adm, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{Source: constSat(0)})
	require.NoError(b, err)
	for name, a := range map[string]flowcontrol.Admitter{"none": nil, "probabilistic": adm} {
		b.Run(name, func(b *testing.B) {
			c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
				Config:   flowcontrol.Config{Bands: bandsOf(2, 1024), Source: constSat(0), Burst: 4096},
				Admitter: a,
			})
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(context.Background())
			runErr := c.Start(ctx)
			b.ReportAllocs()
			for b.Loop() {
				p, err := c.Wait(ctx, 1)
				if err != nil {
					b.Fatal(err)
				}
				p.Done()
			}
			cancel()
			<-runErr
			c.Close()
		})
	}
}
