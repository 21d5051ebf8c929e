package workload

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestStreamMatchesTheWorkload(t *testing.T) {
	for _, w := range All() {
		g, err := NewGenerator(w, 10, DefaultCV, 1, 0)
		require.NoError(t, err)
		const n = 20000
		var in, out, crit float64
		var last Arrival
		for range n {
			a := g.Next()
			require.Greater(t, a.At, last.At, "arrivals are strictly ordered")
			require.GreaterOrEqual(t, a.Input, 1)
			require.GreaterOrEqual(t, a.Output, 1)
			require.LessOrEqual(t, a.Input, int(4*w.InputMean))
			require.LessOrEqual(t, a.Input+a.Output, MaxModelLen)
			in += float64(a.Input)
			out += float64(a.Output)
			if a.Critical {
				crit++
			}
			last = a
		}
		require.InEpsilon(t, w.InputMean, in/n, 0.03, w.Name)
		require.InEpsilon(t, w.OutputMean, out/n, 0.03, w.Name)
		require.InDelta(t, w.CriticalShare, crit/n, 0.015, w.Name)
		require.InEpsilon(t, 10, n/last.At.Seconds(), 0.03, "Poisson rate")
	}
}

func TestSameSeedsSameStream(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed, stream := rapid.Uint64().Draw(t, "seed"), rapid.Uint64().Draw(t, "stream")
		qps := rapid.Float64Range(0.01, 1000).Draw(t, "qps")
		a, err := NewGenerator(Reasoning, qps, 0.5, seed, stream)
		require.NoError(t, err)
		b, _ := NewGenerator(Reasoning, qps, 0.5, seed, stream)
		for range 50 {
			require.Equal(t, a.Next(), b.Next())
		}
	})
}

func TestConstantLengthsWithZeroCV(t *testing.T) {
	g, _ := NewGenerator(Codegen, 1, 0, 1, 1)
	for range 100 {
		a := g.Next()
		require.Equal(t, 1176, a.Input)
		require.Equal(t, 195, a.Output)
	}
}

func TestErrors(t *testing.T) {
	_, err := ByName("poetry")
	require.True(t, errors.Is(err, ErrUnknown))
	for _, c := range []struct{ qps, cv float64 }{{0, 0.5}, {math.Inf(1), 0.5}, {1, -1}, {1, math.NaN()}} {
		_, err := NewGenerator(Chat, c.qps, c.cv, 1, 1)
		require.Error(t, err)
	}
	_, err = NewGenerator(Workload{Name: "x", InputMean: 0, OutputMean: 1}, 1, 0, 1, 1)
	require.Error(t, err)
}
