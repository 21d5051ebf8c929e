package llmd

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

type setSat struct{ v float64 }

func (s *setSat) Saturation() float64 { return s.v }

type sent struct{ band, item int }

func newDispatcher(t *testing.T, p UsageLimitPolicy, bands int, src flowcontrol.SaturationSource) (*Dispatcher[int], *[]sent) {
	t.Helper()
	var out []sent
	bs := make([]flowcontrol.BandConfig, bands)
	for i := range bs {
		bs[i].Capacity = 64
	}
	d, err := NewDispatcher(DispatcherConfig[int]{Bands: bs, Policy: p, Source: src,
		Dispatch: func(b, it int) { out = append(out, sent{b, it}) }})
	require.NoError(t, err)
	return d, &out
}

func TestPeriodTable(t *testing.T) {
	for s, want := range map[float64]int64{0.5: 1, 0.55: 1, 0.6: 1, 0.65: 2, 0.7: 2, 0.75: 3, 0.8: 4, 0.9: 9, 0.99: 99} {
		require.Equal(t, want, Period(s), "s=%v", s)
	}
}

// openSequence returns, for k cycles at saturation s with two bands, whether band 1 was
// open on each.
func openSequence(p *SoftReflective, s float64, k int) []bool {
	c := make([]float64, 2)
	var seq []bool
	for range k {
		p.ComputeLimit(s, c)
		seq = append(seq, !(s >= c[1]))
	}
	return seq
}

func TestSoftReflectiveDutyCycleSequence(t *testing.T) {
	require.Equal(t, []bool{false, true, false, true}, openSequence(NewSoftReflective(), 0.7, 4), "period 2: closed, open, closed, open")
	require.Equal(t, []bool{false, false, true, false, false, true}, openSequence(NewSoftReflective(), 0.75, 6), "period 3: closed, closed, open")
	require.Equal(t, []bool{true, true, true}, openSequence(NewSoftReflective(), 0.6, 3), "period 1: always open")
	// The counter is incremented before the test and advances only while 0.5 <= s < 1.
	p := NewSoftReflective()
	openSequence(p, 0.3, 5)
	openSequence(p, 1.0, 5)
	openSequence(p, 7, 5)
	require.Zero(t, p.Counter(), "no advance outside the duty-cycle regime")
	openSequence(p, 0.5, 1)
	require.EqualValues(t, 1, p.Counter(), "s = 0.5 is in the regime")
	require.Equal(t, []bool{true}, openSequence(p, 0.7, 1), "counter 2 after the increment: open at period 2")
}

func TestSoftReflectiveCeilings(t *testing.T) {
	c := make([]float64, 3)
	p := NewSoftReflective()
	p.ComputeLimit(0.4, c)
	require.Equal(t, []float64{1, 1, 1}, c, "below every reflective ceiling: open")
	p.ComputeLimit(1, c)
	require.Equal(t, []float64{1, 0, 0}, c, "s >= 1: band 0 keeps 1.0 (and halts since s >= 1), the others 0")
	require.Zero(t, p.Counter())
	// One counter shared by all gated bands: at s = 0.75 with 3 bands both band 1
	// (reflective 0.625) and band 2 (0.25) are in the duty cycle, period 3; they open
	// together and the counter moves once per cycle.
	var opens [][]float64
	for range 3 {
		p.ComputeLimit(0.75, c)
		opens = append(opens, append([]float64(nil), c...))
	}
	require.Equal(t, [][]float64{{1, 0, 0}, {1, 0, 0}, {1, 1, 1}}, opens)
	require.EqualValues(t, 3, p.Counter(), "one increment per cycle, not per band")
	// At s = 0.6 band 1 (reflective 0.7) is open, band 2 (0.4) in the duty cycle.
	p.ComputeLimit(0.6, c)
	require.Equal(t, []float64{1, 1, 1}, c, "period 1")
	require.EqualValues(t, 4, p.Counter())
	// Idle advances exactly as ComputeLimit would.
	q := NewSoftReflective()
	q.Idle(0.75, 3, 3)
	q.Idle(0.6, 3, 1)
	q.Idle(0.3, 3, 100)
	q.Idle(1.5, 3, 100)
	require.Equal(t, p.Counter(), q.Counter())
	require.EqualValues(t, 1, NewSoftReflective().TopCeiling(0.9))
}

func TestOneItemPerCycleStrictPriority(t *testing.T) {
	src := &setSat{0.2}
	d, out := newDispatcher(t, NewSoftReflective(), 2, src)
	for i := range 3 {
		require.NoError(t, d.Enqueue(1, 10+i))
		require.NoError(t, d.Enqueue(0, i))
	}
	for range 6 {
		require.True(t, d.Cycle())
	}
	require.False(t, d.Cycle(), "nothing left")
	require.Equal(t, []sent{{0, 0}, {0, 1}, {0, 2}, {1, 10}, {1, 11}, {1, 12}}, *out,
		"one item per cycle, band 0 first, an empty band skipped, FIFO within a band")
}

func TestHaltsAtFirstGatedBand(t *testing.T) {
	// Band 0 halts at s >= 1 under llm-d's soft-reflective, so nothing goes.
	src := &setSat{1}
	d, out := newDispatcher(t, NewSoftReflective(), 2, src)
	require.NoError(t, d.Enqueue(0, 1))
	require.NoError(t, d.Enqueue(1, 2))
	require.True(t, d.Halted())
	require.False(t, d.Cycle())
	require.Empty(t, *out, "band 0 halts at s >= 1, band 0 included")
	src.v = 0.99
	require.False(t, d.Halted())
	require.True(t, d.Cycle())
	require.Equal(t, []sent{{0, 1}}, *out)

	// A gated band halts the cycle before its emptiness is looked at: 3 bands at
	// s = 0.75, band 1 empty and closed, band 2 has an item.
	src.v = 0.75
	d, out = newDispatcher(t, NewSoftReflective(), 3, src)
	require.NoError(t, d.Enqueue(2, 7))
	require.False(t, d.Cycle(), "counter 1: closed")
	require.False(t, d.Cycle(), "counter 2: closed")
	require.True(t, d.Cycle(), "counter 3: open")
	require.Equal(t, []sent{{2, 7}}, *out)

	// With a policy whose ceilings are not monotone (a user's), the halt at the first
	// gated band is visible: band 1 gated, band 2 open, band 2's item does not go.
	d, out = newDispatcher(t, tablePolicy{{1, 0.1, 1}}, 3, src)
	require.NoError(t, d.Enqueue(2, 9))
	require.False(t, d.Cycle(), "halted at band 1, band 2 not considered")
	require.Empty(t, *out)

	// llm-d static: one threshold for every band, the gate s >= threshold.
	src.v = 0.8
	d, out = newDispatcher(t, NewStatic(0.8), 2, src)
	require.NoError(t, d.Enqueue(1, 1))
	require.True(t, d.Halted())
	require.False(t, d.Cycle(), "an empty gated band 0 still halts band 1")
	src.v = 0.79
	require.True(t, d.Cycle())
	require.Equal(t, []sent{{1, 1}}, *out)

	// llm-d priority holdback, rank 0.4..1 over three bands: ceilings 1, 0.7,
	// 0.4. At 0.5 band 2 is held back while band 1 goes; at 0.7 band 1 is held
	// too (and halts the cycle), band 0 goes; at 1 every band halts.
	h, err := NewPriorityHoldback(flowcontrol.HoldbackConfig{MinCeiling: 0.4}, []int{100, 50, 0})
	require.NoError(t, err)
	require.Equal(t, []float64{1, 0.7, 0.4}, h.Ceilings())
	src.v = 0.5
	d, out = newDispatcher(t, h, 3, src)
	require.NoError(t, d.Enqueue(2, 20))
	require.NoError(t, d.Enqueue(1, 10))
	require.True(t, d.Cycle())
	require.False(t, d.Cycle(), "band 2 held back at s=0.5 ≥ 0.4")
	src.v = 0.7
	require.NoError(t, d.Enqueue(0, 1))
	require.NoError(t, d.Enqueue(1, 11))
	require.True(t, d.Cycle())
	require.False(t, d.Cycle(), "band 1 held back at s=0.7 ≥ 0.7")
	src.v = 1
	require.NoError(t, d.Enqueue(0, 2))
	require.True(t, d.Halted())
	require.False(t, d.Cycle(), "band 0 halts at maxCeiling")
	src.v = 0.39
	require.True(t, d.Cycle())
	require.True(t, d.Cycle())
	require.True(t, d.Cycle())
	require.Equal(t, []sent{{1, 10}, {0, 1}, {0, 2}, {1, 11}, {2, 20}}, *out)
}

func TestSweepAndAbandon(t *testing.T) {
	now := time.Unix(100, 0)
	gone := map[int]bool{}
	var drops []string
	var out []int
	d, err := NewDispatcher(DispatcherConfig[int]{Bands: []flowcontrol.BandConfig{{Capacity: 8}, {Capacity: 8, MaxWait: 10 * time.Second}},
		Source: &setSat{2}, Dispatch: func(_, it int) { out = append(out, it) }, Now: func() time.Time { return now },
		Abandoned: func(it int) bool { return gone[it] },
		OnDrop: func(b, it int, r error) {
			drops = append(drops, map[error]string{flowcontrol.ErrExpired: "expired", flowcontrol.ErrCancelled: "cancelled"}[r])
		}})
	require.NoError(t, err)
	require.NoError(t, d.Enqueue(1, 1))
	now = now.Add(5 * time.Second)
	require.NoError(t, d.Enqueue(1, 2))
	require.NoError(t, d.Enqueue(1, 3))
	require.NoError(t, d.Enqueue(1, 4))
	d.Sweep()
	require.Equal(t, 4, d.Len(1), "nothing past its TTL yet")
	now = now.Add(6 * time.Second)
	d.Sweep()
	require.Equal(t, []string{"expired"}, drops, "item 1 waited 11 s > TTL")
	gone[3] = true
	d.Abandon(1)
	d.Sweep()
	require.Equal(t, []string{"expired", "cancelled"}, drops)
	require.Equal(t, 2, d.Len(1))
	gone[2] = true // abandoned without a sweep: dropped when reached, without using the cycle
	d.source = &setSat{0}
	require.True(t, d.Cycle())
	require.Equal(t, []int{4}, out, "order kept, the abandoned head skipped")
	st := d.Stats()
	require.Equal(t, BandStats{Queued: 0, Dispatched: 1, Expired: 1, Cancelled: 2}, st.Bands[1])
}

func TestConfigErrors(t *testing.T) {
	ok := func(int, int) {}
	one := []flowcontrol.BandConfig{{Capacity: 1}}
	for field, cfg := range map[string]DispatcherConfig[int]{
		"Bands":             {Source: &setSat{}, Dispatch: ok},
		"Bands[1].Capacity": {Bands: []flowcontrol.BandConfig{{Capacity: 1}, {}}, Source: &setSat{}, Dispatch: ok},
		"Bands[0].MaxWait":  {Bands: []flowcontrol.BandConfig{{Capacity: 1, MaxWait: -1}}, Source: &setSat{}, Dispatch: ok},
		"Policy":            {Bands: one, Policy: NewStatic(0), Source: &setSat{}, Dispatch: ok},
		"Source":            {Bands: one, Dispatch: ok},
		"Dispatch":          {Bands: one, Source: &setSat{}},
		"Bands[0].Fairness": {Bands: []flowcontrol.BandConfig{{Capacity: 1, Fairness: flowcontrol.FairnessRoundRobin}}, Source: &setSat{}, Dispatch: ok},
	} {
		_, err := NewDispatcher(cfg)
		require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig, field)
		require.True(t, strings.Contains(err.Error(), field), "%q names %s", err, field)
	}
	h, err := NewPriorityHoldback(flowcontrol.HoldbackConfig{MinCeiling: 0.5}, []int{1, 0})
	require.NoError(t, err)
	_, err = NewDispatcher(DispatcherConfig[int]{Bands: one, Policy: h, Source: &setSat{}, Dispatch: ok})
	require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig, "two priorities for one band")
	require.Contains(t, err.Error(), "Policy")
	_, err = NewPriorityHoldback(flowcontrol.HoldbackConfig{MinCeiling: 1.5}, []int{1, 0})
	require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig)
	require.Contains(t, err.Error(), "minCeiling")
	for _, th := range []float64{math.NaN(), -1, 1.5} {
		_, err := NewDispatcher(DispatcherConfig[int]{Bands: one, Policy: NewStatic(th), Source: &setSat{}, Dispatch: ok})
		require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig)
	}
	d, err := NewDispatcher(DispatcherConfig[int]{Bands: one, Source: &setSat{}, Dispatch: ok})
	require.NoError(t, err)
	require.Equal(t, []flowcontrol.BandConfig{{Name: "band0", Capacity: 1}}, d.BandConfigs())
	require.ErrorIs(t, d.Enqueue(1, 0), flowcontrol.ErrUnknownBand)
	require.NoError(t, d.Enqueue(0, 0))
	require.ErrorIs(t, d.Enqueue(0, 0), flowcontrol.ErrQueueFull)
	require.EqualValues(t, 1, d.Stats().Bands[0].Rejected)
}

func TestRun(t *testing.T) {
	got := make(chan int, 4)
	d, err := NewDispatcher(DispatcherConfig[int]{Bands: []flowcontrol.BandConfig{{Capacity: 4}, {Capacity: 4}}, Policy: NewSoftReflective(), Source: &setSat{0.1},
		Dispatch: func(_, it int) { got <- it }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	require.NoError(t, d.Enqueue(1, 1))
	require.NoError(t, d.Enqueue(0, 2))
	a, b := <-got, <-got
	require.ElementsMatch(t, []int{1, 2}, []int{a, b})
	cancel()
	require.True(t, errors.Is(<-done, context.Canceled))
}

// tablePolicy is a test policy whose ceilings cycle through a table, whatever the
// saturation: not monotone, so it exposes the head-of-line halt.
type tablePolicy [][]float64

func (p tablePolicy) ComputeLimit(_ float64, c []float64) {
	copy(c, p[0])
	if len(p) > 1 {
		first := append([]float64(nil), p[0]...)
		copy(p, p[1:])
		p[len(p)-1] = first
	}
}
func (p tablePolicy) Idle(float64, int, int64)   {}
func (p tablePolicy) TopCeiling(float64) float64 { return p[0][0] }

// model is the discipline restated as plainly as possible, to check the dispatcher
// and the policies against.
type model struct {
	bands   [][]int
	soft    bool
	thr     float64
	counter int64
	table   [][]float64 // a non-monotone test policy, if set
	cycles  int
}

func (m *model) cycle(s float64) (sent, bool) {
	n := len(m.bands)
	ceil := make([]float64, n)
	for i := range ceil {
		ceil[i] = m.thr
	}
	if m.table != nil {
		copy(ceil, m.table[m.cycles%len(m.table)])
	}
	m.cycles++
	if m.soft {
		inDuty := false
		for i := 1; i < n; i++ {
			r := 1 - float64(i)*s/float64(n-1)
			if !(s < r) && s < 1 {
				inDuty = true
			}
		}
		if inDuty {
			m.counter++
		}
		period := int64(math.Max(1, math.Round(s/(1-s+1e-9))))
		for i := range ceil {
			r := 1 - float64(i)*s/float64(n-1)
			switch {
			case i == 0 || s < r:
				ceil[i] = 1
			case s >= 1:
				ceil[i] = 0
			case m.counter%period == 0:
				ceil[i] = 1
			default:
				ceil[i] = 0
			}
		}
	}
	for i := range n {
		if s >= ceil[i] {
			return sent{}, false
		}
		if len(m.bands[i]) > 0 {
			it := m.bands[i][0]
			m.bands[i] = m.bands[i][1:]
			return sent{i, it}, true
		}
	}
	return sent{}, false
}

func TestDispatcherAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(t, "bands")
		kind := rapid.IntRange(0, 3).Draw(t, "policy") // static, soft-reflective, a table, priority holdback
		thr := rapid.SampledFrom([]float64{1, 0.8, 0.5}).Draw(t, "threshold")
		m := &model{bands: make([][]int, n), soft: kind == 1, thr: thr}
		var p UsageLimitPolicy = NewStatic(thr)
		switch kind {
		case 1:
			p = NewSoftReflective()
		case 2:
			rows := rapid.IntRange(1, 3).Draw(t, "rows")
			var tab tablePolicy
			for range rows {
				row := make([]float64, n)
				for i := range row {
					row[i] = rapid.SampledFrom([]float64{0, 0.5, 1, 2}).Draw(t, "ceiling")
				}
				tab = append(tab, row)
				m.table = append(m.table, append([]float64(nil), row...))
			}
			p = tab
		case 3:
			// Rank domain, restated: band i of n at hi − i·(hi−lo)/(n−1).
			lo := rapid.SampledFrom([]float64{0, 0.3, 0.5}).Draw(t, "min")
			hi := rapid.SampledFrom([]float64{0.7, 0.9, 1}).Draw(t, "max")
			row := make([]float64, n)
			prios := make([]int, n)
			for i := range row {
				row[i], prios[i] = hi, 10*(n-i)
				if n > 1 {
					row[i] = hi - float64(i)*(hi-lo)/float64(n-1)
				}
			}
			m.table = [][]float64{row}
			h, err := NewPriorityHoldback(flowcontrol.HoldbackConfig{MinCeiling: lo, MaxCeiling: hi}, prios)
			if err != nil {
				t.Fatal(err)
			}
			p = h
		}
		src := &setSat{}
		var out []sent
		bs := make([]flowcontrol.BandConfig, n)
		for i := range bs {
			bs[i].Capacity = 1000
		}
		d, err := NewDispatcher(DispatcherConfig[int]{Bands: bs, Policy: p, Source: src,
			Dispatch: func(b, it int) { out = append(out, sent{b, it}) }})
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		sats := []float64{0, 0.3, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 0.99, 1, 1.5, 0.4, 0.45, 0.55}
		for range rapid.IntRange(1, 200).Draw(t, "ops") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				b := rapid.IntRange(0, n-1).Draw(t, "band")
				if err := d.Enqueue(b, next); err != nil {
					t.Fatal(err)
				}
				m.bands[b] = append(m.bands[b], next)
				next++
			case 1:
				src.v = rapid.SampledFrom(sats).Draw(t, "sat")
			case 2:
				// Skip stands for cycles only when nothing can be dispatched.
				k := rapid.Int64Range(1, 50).Draw(t, "skip")
				if kind != 2 && (d.Empty() || d.Halted()) {
					d.Skip(k)
					for range k {
						if _, ok := m.cycle(src.v); ok {
							t.Fatalf("model dispatched during a skip")
						}
					}
					continue
				}
				fallthrough
			default:
				before := len(out)
				got := d.Cycle()
				want, ok := m.cycle(src.v)
				if got != ok {
					t.Fatalf("Cycle at s=%v dispatched %v, model %v", src.v, got, ok)
				}
				if ok && out[before] != want {
					t.Fatalf("dispatched %v, model %v", out[before], want)
				}
			}
			for b := range n {
				if d.Len(b) != len(m.bands[b]) {
					t.Fatalf("band %d holds %d, model %d", b, d.Len(b), len(m.bands[b]))
				}
			}
		}
	})
}
