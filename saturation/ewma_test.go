package saturation

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestEWMAHalfLife(t *testing.T) {
	clk := newFakeClock()
	var v Value
	e, err := NewEWMA(&v, time.Second, clk.Now)
	require.NoError(t, err)

	assert.Equal(t, 0.0, e.Saturation(), "first read is the first sample")
	v.Set(1)
	assert.Equal(t, 0.0, e.Saturation(), "no time elapsed: the sample has no weight")
	clk.Advance(time.Second)
	assert.InDelta(t, 0.5, e.Saturation(), 1e-12, "one half-life: halfway")
	clk.Advance(time.Second)
	assert.InDelta(t, 0.75, e.Saturation(), 1e-12, "two half-lives")
	clk.Advance(-10 * time.Second)
	assert.InDelta(t, 0.75, e.Saturation(), 1e-12, "clock going backwards changes nothing")
	clk.Advance(10*time.Second + time.Second)
	assert.InDelta(t, 0.875, e.Saturation(), 1e-12, "resumes from the latest time seen")
}

// TestEWMANonFiniteInput: no input leaves the average stuck (see EWMA).
func TestEWMANonFiniteInput(t *testing.T) {
	clk := newFakeClock()
	var v Value
	e, err := NewEWMA(&v, time.Second, clk.Now)
	require.NoError(t, err)
	v.Set(math.NaN())
	assert.Equal(t, 1.0, e.Saturation(), "NaN sample counts as 1")
	v.Set(math.Inf(1))
	clk.Advance(time.Second)
	assert.True(t, math.IsInf(e.Saturation(), 1), "+Inf is reported as it is")
	v.Set(0)
	clk.Advance(time.Second)
	assert.InDelta(t, 0.25, e.Saturation(), 1e-12,
		"+Inf was not averaged: 0 folds over the 2 s since the last averaged sample")
	v.Set(-5)
	clk.Advance(100 * time.Second)
	assert.InDelta(t, 0, e.Saturation(), 1e-9, "negative counts as 0")
	v.Set(math.NaN())
	clk.Advance(time.Second)
	assert.InDelta(t, 0.5, e.Saturation(), 1e-9, "NaN again: averaged as 1")
	v.Set(0.2)
	clk.Advance(time.Second)
	assert.InDelta(t, 0.35, e.Saturation(), 1e-9, "and the average moves on: never stuck at NaN")
	v.Set(math.MaxFloat64)
	clk.Advance(time.Second)
	huge := e.Saturation()
	assert.False(t, math.IsInf(huge, 0) || math.IsNaN(huge), "a huge finite sample keeps the average finite: %v", huge)
	v.Set(-math.MaxFloat64)
	clk.Advance(time.Second)
	assert.InDelta(t, huge/2, e.Saturation(), huge*1e-12, "and decays from it")
}

// TestEWMAPartitionInvariance is what "time-based" means: feeding a constant
// x over an interval in any number of samples gives the same average as one
// sample at the end of it, so the result does not depend on the read rate.
func TestEWMAPartitionInvariance(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		start := rapid.Float64Range(0, 5).Draw(t, "start")
		x := rapid.Float64Range(0, 5).Draw(t, "x")
		halfLife := time.Duration(rapid.Int64Range(1, 1e10).Draw(t, "halfLife"))
		steps := rapid.SliceOfN(rapid.Int64Range(0, 1e10), 1, 20).Draw(t, "steps")

		run := func(parts []int64) float64 {
			clk := newFakeClock()
			var v Value
			v.Set(start)
			e, err := NewEWMA(&v, halfLife, clk.Now)
			if err != nil {
				t.Fatal(err)
			}
			e.Saturation()
			v.Set(x)
			var out float64
			for _, d := range parts {
				clk.Advance(time.Duration(d))
				out = e.Saturation()
			}
			return out
		}
		var total int64
		for _, d := range steps {
			total += d
		}
		many, once := run(steps), run([]int64{total})
		if math.Abs(many-once) > 1e-9 {
			t.Fatalf("%d samples give %v, one gives %v", len(steps), many, once)
		}
		// Bounded by the two levels, and never past x.
		lo, hi := math.Min(start, x), math.Max(start, x)
		if many < lo-1e-12 || many > hi+1e-12 {
			t.Fatalf("%v outside [%v, %v]", many, lo, hi)
		}
		// Closed form.
		want := x + (start-x)*math.Exp2(-float64(total)/float64(halfLife))
		if math.Abs(once-want) > 1e-9 {
			t.Fatalf("got %v, closed form %v", once, want)
		}
	})
}

// TestEWMABounds: whatever the inputs and timings, the average stays within
// the range of the sanitised samples seen.
func TestEWMABounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		var v Value
		e, err := NewEWMA(&v, time.Duration(rapid.Int64Range(1, 1e9).Draw(t, "halfLife")), clk.Now)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		n := rapid.IntRange(1, 30).Draw(t, "n")
		for i := 0; i < n; i++ {
			x := genAny().Draw(t, "x")
			v.Set(x)
			clk.Advance(time.Duration(rapid.Int64Range(-1e9, 1e10).Draw(t, "dt")))
			got := e.Saturation()
			if math.IsInf(x, 1) {
				// Not averaged: reported as it is.
				if !math.IsInf(got, 1) {
					t.Fatalf("read %d: +Inf sample read %v", i, got)
				}
				continue
			}
			folded := x // what the EWMA averages (see EWMA)
			if x != x {
				folded = 1
			} else if x < 0 {
				folded = 0
			}
			lo, hi = math.Min(lo, folded), math.Max(hi, folded)
			if !inRange(got) || got < lo || got > hi {
				t.Fatalf("read %d: %v outside [%v, %v]", i, got, lo, hi)
			}
		}
	})
}

// TestEWMAConcurrentReaders: concurrent reads never block and never see a
// value outside the inputs' range (run with -race).
func TestEWMAConcurrentReaders(t *testing.T) {
	var tick sync.Mutex
	ns := int64(0)
	now := func() time.Time {
		tick.Lock()
		defer tick.Unlock()
		ns += int64(time.Millisecond)
		return time.Unix(0, ns)
	}
	var v Value
	v.Set(0.5)
	e, err := NewEWMA(&v, 10*time.Millisecond, now)
	require.NoError(t, err)
	var wg sync.WaitGroup
	bad := make([]int, 4)
	for g := range bad {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000*scale(); i++ {
				if i%100 == 0 {
					v.Set(float64(i%3) / 2)
				}
				if s := e.Saturation(); s < 0 || s > 1 {
					bad[g]++
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, []int{0, 0, 0, 0}, bad)
}
