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

func TestSanitize(t *testing.T) {
	cases := []struct {
		in, want float64
	}{
		{math.NaN(), 1},
		{math.Inf(-1), 0},
		{-0.5, 0},
		{math.Copysign(0, -1), 0},
		{0, 0},
		{0.7, 0.7},
		{1, 1},
		{3.5, 3.5},
		{MaxSaturation, MaxSaturation},
		{MaxSaturation + 1, MaxSaturation},
		{math.Inf(1), MaxSaturation},
		{math.MaxFloat64, MaxSaturation},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Sanitize(c.in), "Sanitize(%v)", c.in)
	}
}

// genAny draws float64s that include the special values.
func genAny() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.Float64(),
		rapid.Float64Range(-2, 3),
		rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, 1, -1, MaxSaturation, math.MaxFloat64}),
	)
}

func inRange(x float64) bool { return x >= 0 && x <= MaxSaturation } // false for NaN

func TestSanitizeProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := genAny().Draw(t, "x")
		y := Sanitize(x)
		if !inRange(y) {
			t.Fatalf("Sanitize(%v) = %v out of range", x, y)
		}
		if inRange(x) && y != x {
			t.Fatalf("Sanitize changed in-range %v to %v", x, y)
		}
		if Sanitize(y) != y {
			t.Fatalf("Sanitize not idempotent at %v", x)
		}
		// Monotone over the non-NaN values.
		z := genAny().Draw(t, "z")
		if x == x && z == z && x <= z && Sanitize(x) > Sanitize(z) {
			t.Fatalf("not monotone: %v <= %v but %v > %v", x, z, Sanitize(x), Sanitize(z))
		}
	})
}

func TestValueZeroAndSet(t *testing.T) {
	var v Value
	assert.Equal(t, 0.0, v.Saturation(), "zero Value reads 0")
	v.Set(0.7)
	assert.Equal(t, 0.7, v.Saturation())
	v.Set(2.5)
	assert.Equal(t, 2.5, v.Saturation(), "overload passes through")
	v.Set(math.NaN())
	assert.Equal(t, 1.0, v.Saturation(), "NaN reads as 1")
	v.Set(-4)
	assert.Equal(t, 0.0, v.Saturation())
	v.Set(math.Inf(1))
	assert.Equal(t, MaxSaturation, v.Saturation())
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
	assert.Equal(t, 1.0, Func(func() float64 { return math.NaN() }).Saturation())
	assert.Equal(t, 0.0, Func(func() float64 { return -1 }).Saturation())
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
	assert.Equal(t, MaxSaturation, Mean(constant(math.Inf(1)), constant(math.Inf(1))).Saturation())

	// The slice is copied: later changes by the caller do not leak in.
	srcs := []Source{constant(0.1)}
	m := Max(srcs...)
	srcs[0] = constant(0.9)
	assert.Equal(t, 0.1, m.Saturation())
}

// TestMaxMeanModel compares Max and Mean with a direct model over sanitised
// inputs, and checks bounds and monotonicity.
func TestMaxMeanModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		xs := rapid.SliceOfN(genAny(), 1, 8).Draw(t, "xs")
		srcs := make([]Source, len(xs))
		wantMax, sum := 0.0, 0.0
		for i, x := range xs {
			srcs[i] = constant(x)
			s := Sanitize(x)
			wantMax = math.Max(wantMax, s)
			sum += s
		}
		gotMax, gotMean := Max(srcs...).Saturation(), Mean(srcs...).Saturation()
		if gotMax != wantMax {
			t.Fatalf("Max = %v, model %v", gotMax, wantMax)
		}
		if want := sum / float64(len(xs)); math.Abs(gotMean-want) > 1e-9*math.Max(1, want) {
			t.Fatalf("Mean = %v, model %v", gotMean, want)
		}
		if !inRange(gotMax) || !inRange(gotMean) || gotMean > gotMax+1e-12 {
			t.Fatalf("bounds: max %v mean %v", gotMax, gotMean)
		}
		// Raising one input never lowers either combinator.
		i := rapid.IntRange(0, len(xs)-1).Draw(t, "i")
		up := rapid.Float64Range(0, 10).Draw(t, "up")
		if xs[i] == xs[i] { // NaN already reads as 1; raising it is not defined
			raised := append([]Source(nil), srcs...)
			raised[i] = constant(Sanitize(xs[i]) + up)
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
