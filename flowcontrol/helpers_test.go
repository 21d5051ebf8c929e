package flowcontrol_test

import (
	"github.com/flowgate/flowgate/flowcontrol"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a virtual clock: Now returns what Advance made it.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time               { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration)      { c.ns.Add(int64(d)) }
func (c *fakeClock) Elapsed() time.Duration       { return time.Duration(c.ns.Load()) }
func newFakeClock() *fakeClock                    { c := &fakeClock{}; c.ns.Store(1e9); return c }
func (c *fakeClock) At(d time.Duration) time.Time { return time.Unix(0, 1e9+int64(d)) }

// satValue is a settable saturation source.
type satValue struct{ bits atomic.Uint64 }

func (s *satValue) Set(v float64)       { s.bits.Store(math.Float64bits(v)) }
func (s *satValue) Saturation() float64 { return math.Float64frombits(s.bits.Load()) }

func newSat(v float64) *satValue { s := &satValue{}; s.Set(v); return s }

// event is one outcome the dispatcher reported.
type event struct {
	band   int
	item   int
	reason error // nil = dispatched
}

// runtimeGosched yields while a test waits for other goroutines to reach a
// state (not for time to pass).
func runtimeGosched() { runtime.Gosched() }

// bandsOf returns n bands of the given capacity; maxWait is empty (no
// limit), one value for every band, or one value per band.
func bandsOf(n, capacity int, maxWait ...time.Duration) []flowcontrol.BandConfig {
	if n < 0 {
		n = 0
	}
	b := make([]flowcontrol.BandConfig, n)
	for i := range b {
		b[i].Capacity = capacity
		switch {
		case len(maxWait) == 1:
			b[i].MaxWait = maxWait[0]
		case i < len(maxWait):
			b[i].MaxWait = maxWait[i]
		}
	}
	return b
}

// bandsCap returns one band per capacity, with maxWait as in bandsOf.
func bandsCap(capacity []int, maxWait ...time.Duration) []flowcontrol.BandConfig {
	b := bandsOf(len(capacity), 0, maxWait...)
	for i, c := range capacity {
		b[i].Capacity = c
	}
	return b
}

// closedStatic is a static policy at threshold 1: with Config.BlockCritical
// it blocks every band, band 0 included, at and above it, a gate a test
// closes by setting the saturation to 1 or more.
func closedStatic(testing.TB) *flowcontrol.Static { return flowcontrol.NewStatic(1) }
