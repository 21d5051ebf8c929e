package saturation

import (
	"fmt"

	"go.uber.org/atomic"
)

// InFlight counts requests dispatched to the backend and not yet finished,
// over a capacity. Its Saturation (count/capacity) moves the instant a request
// is dispatched, so it gives feedback between metric scrapes that a dispatcher
// releasing a burst per tick would otherwise outrun. Combine it with a poller
// through Max.
//
// Wire it to the flowcontrol Controller (whose optional InFlight field takes
// any interface{ Inc(); Dec() }) or by hand: Inc when a request is sent, Dec
// when it finishes. All methods are lock-free, allocation-free and safe for
// concurrent use. The zero value is not usable; call NewInFlight.
type InFlight struct {
	n         atomic.Int64
	capacity  float64
	underflow atomic.Int64
}

// NewInFlight returns a counter at 0 over capacity requests (e.g. the pool's
// total max_num_seqs, or what the host considers full). It fails with
// ErrInvalidConfig when capacity < 1.
func NewInFlight(capacity int) (*InFlight, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("%w: NewInFlight capacity must be >= 1, got %d", ErrInvalidConfig, capacity)
	}
	return &InFlight{capacity: float64(capacity)}, nil
}

// Inc records one more request in flight.
func (f *InFlight) Inc() { f.n.Inc() }

// Dec records one request finished. It never takes the count below zero: a
// Dec that finds the count at zero is ignored and counted in Underflows. A
// negative count would make the pool look emptier than it is for the rest of
// the process (and a saturation below 0); clamping confines the damage of a
// double done() to the moment it happens, and Underflows makes it visible.
func (f *InFlight) Dec() {
	for {
		c := f.n.Load()
		if c <= 0 {
			f.underflow.Inc()
			return
		}
		if f.n.CompareAndSwap(c, c-1) {
			return
		}
	}
}

// Count returns the number of requests in flight (never negative).
func (f *InFlight) Count() int64 { return f.n.Load() }

// Underflows returns how many Dec calls found the count at zero and were
// ignored. Non-zero means a caller finishes requests it never started;
// export it as an error metric.
func (f *InFlight) Underflows() int64 { return f.underflow.Load() }

// Saturation returns Count/capacity: never negative, always finite.
func (f *InFlight) Saturation() float64 {
	return float64(f.n.Load()) / f.capacity
}
