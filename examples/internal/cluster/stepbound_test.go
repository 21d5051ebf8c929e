package cluster

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestStepLineRecoversALine: steps drawn exactly on a line a + b·batch give
// back a and b; the bound then solves B/(a + b·B) = r.
func TestStepLineRecoversALine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.Float64Range(1e-3, 0.1).Draw(t, "a")
		b := rapid.Float64Range(1e-6, 1e-3).Draw(t, "b")
		var st StepStats
		n := rapid.IntRange(2, 50).Draw(t, "n")
		for i := range n {
			batch := i*rapid.IntRange(1, 20).Draw(t, "gap") + 1
			st.add(batch, a+b*float64(batch))
		}
		ga, gb, ok := st.Line()
		if st.SumBB*st.N-st.SumB*st.SumB < 1e-6*st.N*st.SumBB {
			return // all batches equal: no line (checked below)
		}
		require.True(t, ok)
		assert.InDelta(t, a, ga, 1e-9+1e-6*a)
		assert.InDelta(t, b, gb, 1e-12+1e-6*b)
		frac := rapid.Float64Range(0.1, 1).Draw(t, "frac")
		rate := rapid.Float64Range(1, 0.99/b).Draw(t, "rate") // reachable: frac·rate·b < 1
		step, batch, ms, ok := StepBound(a, b, rate, frac)
		require.True(t, ok)
		assert.InDelta(t, frac*rate, batch/(a+b*batch), 1e-9*frac*rate, "the batch emits the rate")
		assert.InDelta(t, a+b*batch, step, 1e-12)
		assert.InDelta(t, 2000*step, ms, 1e-9)
	})
}

func TestStepBoundEdges(t *testing.T) {
	var st StepStats
	st.add(10, 0.05)
	st.add(10, 0.05)
	_, _, ok := st.Line()
	assert.False(t, ok, "one batch size: no line")
	st.add(20, 0.04)
	_, _, ok = st.Line()
	assert.False(t, ok, "a falling line is not a step cost")
	_, _, _, ok = StepBound(0.01, 1e-4, 1e4, 1) // r·b = 1
	assert.False(t, ok, "a rate the line cannot reach")
	_, _, _, ok = StepBound(0.01, 1e-4, math.NaN(), 1)
	assert.False(t, ok)
	_, _, _, ok = StepBound(0.01, 1e-4, 0, 1)
	assert.False(t, ok)
	m := StepStats{N: 1, SumB: 2}.Merge(StepStats{N: 3, SumB: 4, Rate: 9})
	assert.Equal(t, StepStats{N: 4, SumB: 6}, m, "Rate is the receiver's")
}
