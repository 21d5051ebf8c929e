package saturation

import (
	"fmt"
	"math"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// EWMA smooths another Source with an exponentially weighted moving average
// whose memory is a half-life in time, not in samples: a reading taken dt
// after the previous one gets the weight 1 − 2^(−dt/halfLife). Irregular
// sampling is therefore handled correctly (two reads close together move the
// average far less than two reads far apart) and the result does not depend
// on how often the dispatcher happens to tick. A source that steps from a to
// b, read at the step and again one half-life later, reads (a+b)/2.
//
// Each sample is taken to have held since the previous read, so read the EWMA
// at least as often as the signal changes (the dispatcher reads it every
// tick); a sample taken after a long pause gets a large weight.
//
// What it does with values that are not ordinary numbers, so that no input
// can leave the average stuck: a NaN sample is averaged as 1 (no
// information counts as full, as in Max and Mean), a negative one as 0; a
// +Inf sample is not averaged at all: that read reports +Inf (overloaded;
// the dispatcher caps it) and leaves the average as it was, so the EWMA
// reads the smoothed value again at the first finite sample. Finite samples,
// however large, are averaged as they are, and the average always stays
// within the range of the samples averaged: finite, never NaN.
//
// The average is updated by Saturation itself, which samples the inner
// source. Saturation never blocks: if another goroutine is updating at that
// moment it returns the last published value. Readers pay one atomic load
// plus, for the updater, one sample, one exp2 and an uncontended TryLock.
type EWMA struct {
	src      Source
	halfLife float64 // seconds
	now      func() time.Time

	mu   sync.Mutex // guards avg, last and seen; taken with TryLock only
	avg  float64
	last time.Time
	seen bool

	out atomic.Float64 // the published average; what concurrent readers see
}

// NewEWMA returns an EWMA of src with the given half-life. now is the clock
// (nil means time.Now); inject a fake clock for deterministic tests and
// simulations. The first read returns the first sample unchanged. If the clock
// does not advance (or goes backwards) between two reads the average is left
// unchanged: a sample with zero elapsed time has zero weight.
//
// It fails with ErrInvalidConfig when src is nil or halfLife is not positive.
func NewEWMA(src Source, halfLife time.Duration, now func() time.Time) (*EWMA, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: NewEWMA src is nil", ErrInvalidConfig)
	}
	if halfLife <= 0 {
		return nil, fmt.Errorf("%w: NewEWMA halfLife must be > 0, got %v", ErrInvalidConfig, halfLife)
	}
	if now == nil {
		now = time.Now
	}
	e := &EWMA{src: src, halfLife: halfLife.Seconds(), now: now}
	// Until the first sample the EWMA reports 1 (fail safe) to concurrent
	// readers that lose the TryLock race against the very first update.
	e.out.Store(1)
	return e, nil
}

// Saturation samples the inner source, folds the sample into the average
// and returns the average (or +Inf for a +Inf sample; see EWMA).
func (e *EWMA) Saturation() float64 {
	if !e.mu.TryLock() {
		return e.out.Load()
	}
	x := e.src.Saturation()
	switch {
	case x != x: // NaN
		x = 1
	case x < 0:
		x = 0
	}
	v := x
	if !math.IsInf(x, 1) {
		t := e.now()
		if !e.seen {
			e.avg, e.last, e.seen = x, t, true
		} else if dt := t.Sub(e.last).Seconds(); dt > 0 {
			// avg moves toward x by the fraction 1 − 2^(−dt/h), as the
			// convex combination w·avg + (1−w)·x (avg − x could overflow
			// for huge samples), clamped into [min, max] of the two
			// against rounding.
			w := math.Exp2(-dt / e.halfLife)
			lo, hi := min(e.avg, x), max(e.avg, x)
			e.avg = min(max(w*e.avg+(1-w)*x, lo), hi)
			e.last = t
		}
		v = e.avg
	}
	e.out.Store(v)
	e.mu.Unlock()
	return v
}
