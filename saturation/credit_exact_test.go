package saturation

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzCreditHinge fuzzes the credit's threshold and slope maths: for any
// fresh reading and Scorer, the stored hinge (T, m) is a valid one (m > 0,
// T ≥ 0 or +Inf), base + c(f) is Scorer.Pod with f in flight to within the
// documented 2^−25 (plus float rounding) while the credit is below its hold,
// c is non-decreasing in f, and a walk of dispatches, a hinge change and
// completions back to 0 leaves the excess exactly 0.
func FuzzCreditHinge(f *testing.F) {
	// waiting, running, kv, prompt, output, capacity, Q, PT, KV threshold, projection, count, steps
	f.Add(4.0, 2.0, 0.3, 1000.0, 0.0, 0.0, 6.25, 4096.0, 0.0, uint8(0), uint32(9), uint8(40))         // the wiring test's pod
	f.Add(1.0, 2.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, uint8(0), uint32(12), uint8(20))               // KV leads, reference Scorer
	f.Add(3.0, 40.0, 0.2, 1176.0, 480.0, 5e4, 6.25, 4096.0, 0.8, uint8(2), uint32(50), uint8(60))     // codegen-like, steady projection
	f.Add(0.0, 0.0, 0.0, 39.0, 300.0, 1e5, 5.0, 4096.0, 0.8, uint8(1), uint32(1), uint8(8))           // chat-like, completion projection
	f.Add(1e15, 3.0, 1.0, 4000.0, 10.0, 1e3, 1e-300, 1.0, 1.0, uint8(2), uint32(1<<24-1), uint8(255)) // huge values
	f.Add(2.0, 2.0, 0.5, 1e6, 1.0, 1.0, 5.0, 1.0, 0.5, uint8(0), uint32(100), uint8(3))               // the hold (slope 1e6)
	f.Fuzz(func(t *testing.T, w, r, kv, p, o, capacity, q, pt, kvThr float64, proj uint8, count uint32, steps uint8) {
		s := Scorer{InFlightCredit: true, QueueDepthThreshold: q, PromptTokenThreshold: pt, KVUtilThreshold: kvThr,
			Projection: KVProjection(proj % 3), Staleness: time.Hour}
		now := time.Unix(1, 0)
		rd := Reading{Waiting: w, Running: r, KVUsage: kv, PromptMean: p, OutputMean: o, KVCapacity: capacity, OK: true, At: now}
		off := s
		off.InFlightCredit = false
		if !s.Usable(rd, now) || math.IsInf(off.Pod(rd, now), 1) {
			return // the poller gives such a pod no credit
		}
		th, slope := s.creditHinge(rd)
		if !(slope > 0) || math.IsNaN(th) || th < 0 {
			t.Fatalf("hinge T %v, m %v of %+v", th, slope, rd)
		}
		h := &creditHinge{t: th, slope: slope}
		if math.IsInf(th, 1) {
			h.slope = 0
		}
		base := off.Pod(rd, now)
		n := uint64(min(count, maxPodInFlight))
		prev := int64(0)
		for _, fc := range []uint64{0, uint64(max(0, math.Floor(min(th, 1<<24)))), uint64(max(0, math.Ceil(min(th, 1<<24)))), n} {
			fc = min(fc, maxPodInFlight)
			c := h.excess(fc)
			if c < 0 || c > maxPodCredit {
				t.Fatalf("c(%d) = %d outside [0, hold]", fc, c)
			}
			if c >= maxPodCredit || th > 1<<52 {
				continue // held, or T past float64's integers: not the formula's value
			}
			x := rd
			x.InFlight = int64(fc)
			want, got := s.Pod(x, now), base+float64(c)*creditScale
			if math.IsInf(want, 1) {
				continue
			}
			if math.Abs(got-want) > math.Ldexp(1, -25)+1e-9*max(1, want) {
				t.Fatalf("f %d (T %v, m %v): base + c = %v, Pod %v", fc, th, slope, got, want)
			}
		}
		for fc := uint64(0); fc <= 64 && fc < maxPodInFlight; fc++ {
			c := h.excess(fc)
			if c < prev {
				t.Fatalf("c(%d) = %d below c(%d) = %d", fc, c, fc-1, prev)
			}
			prev = c
		}

		// A walk: up `steps`, a new hinge (the reading with one more
		// waiting request), down to 0. Every step's addition comes from
		// the same function of the state, so the excess ends at 0.
		var l liveCredit
		cr := newCredit()
		l.setHinge(cr, th, slope)
		up := int(steps)
		for range up {
			l.inc(cr)
		}
		rd2 := rd
		rd2.Waiting++
		th2, slope2 := s.creditHinge(rd2)
		l.setHinge(cr, th2, slope2)
		if got, want := l.excess.Load(), cr.hinge(cr.word.Load()).excess(uint64(up)); got != want {
			t.Fatalf("after %d up and a new hinge: excess %d, c(f) %d", up, got, want)
		}
		for range up {
			l.dec(cr)
		}
		if got := l.excess.Load(); got != 0 {
			t.Fatalf("drained: excess %d", got)
		}
		if l.unbalanced.Load() != 0 {
			t.Fatal("unbalanced")
		}
	})
}

// TestCreditHingeRace: goroutines dispatch and finish on one pod while
// another changes its hinge (T and slope both) under a lock, as the poller's
// rescores do. At rest the excess is exactly c(f) of the hinge in force, and
// drained it is exactly 0.
func TestCreditHingeRace(t *testing.T) {
	var l liveCredit
	cr := newCredit()
	var mu sync.Mutex
	workers, ops := 6, 20000*scale()
	if raceSlowdown > 1 {
		ops /= 4
	}
	t.Logf("%d workers × %d operations", workers, ops)
	var stop atomic.Bool
	var changes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(3, 4))
		for !stop.Load() {
			mu.Lock()
			if rng.IntN(10) == 0 {
				l.setHinge(cr, noCredit.t, noCredit.slope)
			} else {
				l.setHinge(cr, rng.Float64()*40, 0.05+rng.Float64()*3)
			}
			mu.Unlock()
			changes.Add(1)
		}
	}()
	left := make([]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			var mine int64
			for range ops {
				if mine > 0 && rng.IntN(2) == 0 {
					if !l.dec(cr) {
						panic("dec lost a request")
					}
					mine--
				} else if l.inc(cr) {
					mine++
				}
			}
			left[w] = mine
		}()
	}
	wg.Wait()
	stop.Store(true)
	<-done
	var total int64
	for _, n := range left {
		total += n
	}
	t.Logf("%d hinge changes during the run; %d left in flight", changes.Load(), total)
	require.Equal(t, total, cr.count())
	require.Equal(t, cr.hinge(cr.word.Load()).excess(uint64(total)), l.excess.Load(), "excess = c(f) at rest")
	for range total {
		require.True(t, l.dec(cr))
	}
	require.Zero(t, l.excess.Load(), "drained")
	require.Zero(t, l.unbalanced.Load())
}

// oneSlopeCredit is the credit as it was before each pod had its own slope:
// the count and T (2^−16 request) in one word, one slope 1/Q per pool. Kept
// only as the baseline of BenchmarkCreditTransition.
type oneSlopeCredit struct {
	word   atomic.Uint64
	excess atomic.Int64
}

const oneSlopeShift, oneSlopeTMask = 40, 1<<40 - 1

func oneSlopeHinge(w uint64) int64 {
	return max(0, int64(w>>oneSlopeShift)<<16-int64(w&oneSlopeTMask))
}

func (c *oneSlopeCredit) inc() {
	for {
		w := c.word.Load()
		nw := w + 1<<oneSlopeShift
		if c.word.CompareAndSwap(w, nw) {
			if d := oneSlopeHinge(nw) - oneSlopeHinge(w); d != 0 {
				c.excess.Add(d)
			}
			return
		}
	}
}

func (c *oneSlopeCredit) dec() {
	for {
		w := c.word.Load()
		nw := w - 1<<oneSlopeShift
		if c.word.CompareAndSwap(w, nw) {
			if d := oneSlopeHinge(nw) - oneSlopeHinge(w); d != 0 {
				c.excess.Add(d)
			}
			return
		}
	}
}

// BenchmarkCreditTransition: one dispatch and one completion on a pod, the
// per-request cost of the live credit, in two states: below the threshold
// (no credit: the common case, the CAS alone) and above it (each
// transition adds to the excess). "one-slope" is the previous credit (the
// baseline, in the same run); "exact" the per-pod slope with the hinge
// named by the word's generation.
func BenchmarkCreditTransition(b *testing.B) {
	for _, above := range []bool{false, true} {
		state := "below"
		if above {
			state = "above"
		}
		b.Run("one-slope/"+state, func(b *testing.B) {
			var c oneSlopeCredit
			t := uint64(10 << 16)
			if above {
				t = 2 << 16
			}
			c.word.Store(5<<oneSlopeShift | t)
			b.ReportAllocs()
			for b.Loop() {
				c.inc()
				c.dec()
			}
		})
		b.Run("exact/"+state, func(b *testing.B) {
			var l liveCredit
			cr := newCredit()
			th := 10.0
			if above {
				th = 2
			}
			l.setHinge(cr, th, 1000.0/4096)
			for range 5 {
				l.inc(cr)
			}
			b.ReportAllocs()
			for b.Loop() {
				l.inc(cr)
				l.dec(cr)
			}
		})
	}
}
