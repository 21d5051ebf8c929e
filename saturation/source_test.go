package saturation

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// genAny draws float64s that include the special values.
func genAny() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.Float64(),
		rapid.Float64Range(-2, 3),
		rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, 1, -1, 100, 1e6, math.MaxFloat64, -math.MaxFloat64}),
	)
}

// inRange: finite and not negative (false for NaN).
func inRange(x float64) bool { return x >= 0 && x <= math.MaxFloat64 }

// validSat: a raw saturation a source may report: never NaN nor negative,
// +Inf allowed (the dispatcher caps it).
func validSat(x float64) bool { return x >= 0 }

func TestValueZeroAndSet(t *testing.T) {
	var v Value
	assert.Equal(t, 0.0, v.Saturation(), "zero Value reads 0")
	v.Set(0.7)
	assert.Equal(t, 0.7, v.Saturation())
	v.Set(2.5)
	assert.Equal(t, 2.5, v.Saturation(), "overload passes through")
	// Raw: the dispatcher applies the one sanitising rule.
	v.Set(math.NaN())
	assert.True(t, math.IsNaN(v.Saturation()), "NaN reads back as NaN")
	v.Set(-4)
	assert.Equal(t, -4.0, v.Saturation())
	v.Set(math.Inf(1))
	assert.Equal(t, math.Inf(1), v.Saturation())
	v.Set(1e300)
	assert.Equal(t, 1e300, v.Saturation())
}

func TestValueConcurrent(t *testing.T) {
	// Readers only ever see a value some writer stored (no torn reads).
	var v Value
	allowed := map[float64]bool{0: true}
	const writers, per = 4, 2000
	for w := 0; w < writers; w++ {
		for i := 0; i < per; i++ {
			allowed[float64(w*per+i)/float64(writers*per)] = true
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				v.Set(float64(w*per+i) / float64(writers*per))
			}
		}()
	}
	bad := 0
	for i := 0; i < writers*per; i++ {
		if !allowed[v.Saturation()] {
			bad++
		}
	}
	wg.Wait()
	assert.Zero(t, bad)
}

func TestFunc(t *testing.T) {
	assert.Equal(t, 0.25, Func(func() float64 { return 0.25 }).Saturation())
	assert.True(t, math.IsNaN(Func(func() float64 { return math.NaN() }).Saturation()), "raw")
	assert.Equal(t, -1.0, Func(func() float64 { return -1 }).Saturation(), "raw")
	var nilFunc Func
	assert.Equal(t, 1.0, nilFunc.Saturation(), "nil Func is fail safe")
}

func constant(x float64) Source { return Func(func() float64 { return x }) }

func TestMaxMeanRules(t *testing.T) {
	assert.Equal(t, 1.0, Max().Saturation(), "empty Max is fail safe")
	assert.Equal(t, 1.0, Mean().Saturation(), "empty Mean is fail safe")
	assert.Equal(t, 1.0, Max(nil, nil).Saturation(), "nil sources are dropped")
	assert.Equal(t, 0.3, Max(nil, constant(0.3)).Saturation())
	assert.Equal(t, 0.3, Mean(constant(0.3), nil).Saturation(), "nil does not count in the mean")
	assert.Equal(t, 0.9, Max(constant(0.2), constant(0.9), constant(0.5)).Saturation())
	assert.InDelta(t, 0.5, Mean(constant(0.2), constant(0.8)).Saturation(), 1e-15)
	assert.Equal(t, 1.0, Max(constant(0.2), constant(math.NaN())).Saturation(), "NaN counts as 1")
	assert.InDelta(t, 0.6, Mean(constant(0.2), constant(math.NaN())).Saturation(), 1e-15)
	assert.Equal(t, math.Inf(1), Mean(constant(math.Inf(1)), constant(math.Inf(1))).Saturation(), "+Inf: overloaded")
	assert.Equal(t, math.Inf(1), Mean(constant(math.Inf(1)), constant(math.Inf(-1))).Saturation(), "-Inf counts as 0, cannot cancel +Inf")
	assert.Equal(t, math.Inf(1), Mean(constant(math.MaxFloat64), constant(math.MaxFloat64)).Saturation(), "overflow: +Inf, not NaN")
	assert.Equal(t, 0.5, Mean(constant(1), constant(-1e300)).Saturation(), "a negative source cannot hide another")
	assert.Equal(t, math.Inf(1), Max(constant(0.2), constant(math.Inf(1)), constant(math.NaN())).Saturation())
	assert.Equal(t, -3.0, Max(constant(-3), constant(math.Inf(-1))).Saturation(), "Max is raw below 0: the dispatcher reads 0")
	assert.Equal(t, 1.0, Max(constant(math.NaN()), constant(math.NaN())).Saturation(), "all NaN: 1")

	// The slice is copied: later changes by the caller do not leak in.
	srcs := []Source{constant(0.1)}
	m := Max(srcs...)
	srcs[0] = constant(0.9)
	assert.Equal(t, 0.1, m.Saturation())
}

// TestMaxMeanModel compares Max and Mean with a direct model of their
// documented input rules, and checks bounds and monotonicity.
func TestMaxMeanModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		xs := rapid.SliceOfN(genAny(), 1, 8).Draw(t, "xs")
		srcs := make([]Source, len(xs))
		wantMax, sum := math.Inf(-1), 0.0
		for i, x := range xs {
			srcs[i] = constant(x)
			if x != x { // NaN counts as 1 in both
				x = 1
			}
			wantMax = math.Max(wantMax, x)
			sum += math.Max(x, 0) // Mean counts a negative as 0
		}
		gotMax, gotMean := Max(srcs...).Saturation(), Mean(srcs...).Saturation()
		if gotMax != wantMax {
			t.Fatalf("Max = %v, model %v", gotMax, wantMax)
		}
		want := sum / float64(len(xs))
		if math.IsInf(want, 1) != math.IsInf(gotMean, 1) || math.Abs(gotMean-want) > 1e-9*math.Max(1, want) {
			t.Fatalf("Mean = %v, model %v", gotMean, want)
		}
		if math.IsNaN(gotMax) || !validSat(gotMean) || gotMean > math.Max(gotMax, 0)*(1+1e-12)+1e-12 {
			t.Fatalf("bounds: max %v mean %v", gotMax, gotMean)
		}
		// Raising one input never lowers either combinator.
		i := rapid.IntRange(0, len(xs)-1).Draw(t, "i")
		up := rapid.Float64Range(0, 10).Draw(t, "up")
		if xs[i] == xs[i] { // NaN already reads as 1; raising it is not defined
			raised := append([]Source(nil), srcs...)
			raised[i] = constant(xs[i] + up)
			if Max(raised...).Saturation() < gotMax || Mean(raised...).Saturation() < gotMean-1e-12 {
				t.Fatalf("raising input %d by %v lowered a combinator", i, up)
			}
		}
	})
}

func TestConstructorErrorsAreTyped(t *testing.T) {
	_, err := NewInFlight(0)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInvalidConfig))
	assert.Contains(t, err.Error(), "capacity")
	assert.Contains(t, err.Error(), "saturation: ")

	_, err = NewEWMA(nil, 1, nil)
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "src")
	_, err = NewEWMA(constant(0), 0, nil)
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "halfLife")
}
