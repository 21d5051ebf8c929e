package saturation

import (
	"errors"

	"go.uber.org/atomic"
)

// MaxSaturation is the largest value any Source in this package reports.
// Values above 1 mean "overloaded" and are passed through, but a bound keeps
// every sum and average finite and lets an EWMA recover from a spike in a few
// half-lives. Under the soft-reflective policy any saturation at or above
// bands−1 already blocks every non-critical band, so a cap of 100 loses
// nothing a policy could act on.
const MaxSaturation = 100.0

// ErrInvalidConfig is wrapped by every constructor error caused by a bad
// argument or configuration field; the message names the field.
var ErrInvalidConfig = errors.New("saturation: invalid configuration")

// Source reports how saturated a backend pool is: 0 idle, 1 full, above 1
// overloaded. Saturation must be safe for concurrent use and should be cheap:
// the dispatcher calls it once per tick.
type Source interface {
	Saturation() float64
}

// Func adapts an ordinary function to a Source, like http.HandlerFunc. Its
// result is passed through Sanitize; a nil Func reports 1 (fail safe).
type Func func() float64

// Saturation calls f and returns Sanitize of the result.
func (f Func) Saturation() float64 {
	if f == nil {
		return 1
	}
	return Sanitize(f())
}

// Sanitize maps any float64 to a usable saturation, the rule every Source in
// this package applies to what it reports:
//
//	NaN                  -> 1 (fail safe: sheddable bands wait, critical flows)
//	negative, -Inf       -> 0
//	above MaxSaturation,
//	+Inf                 -> MaxSaturation
//	anything else        -> unchanged (values above 1 mean overloaded)
func Sanitize(x float64) float64 {
	switch {
	case x != x: // NaN
		return 1
	case x < 0:
		return 0
	case x > MaxSaturation:
		return MaxSaturation
	}
	return x
}

// Value is a settable Source for hosts that compute saturation themselves.
// The zero value is ready to use and reports 0 until Set is called. Set stores
// the raw value; Saturation returns it through Sanitize, so Set(NaN) reads
// back as 1 and Set(-3) as 0. Set and Saturation are single atomic operations:
// safe for concurrent use, lock-free and allocation-free.
type Value struct {
	v atomic.Float64
}

// Set stores x as the current saturation (raw; sanitised on read).
func (v *Value) Set(x float64) { v.v.Store(x) }

// Saturation returns Sanitize of the last value Set (0 before any Set).
func (v *Value) Saturation() float64 { return Sanitize(v.v.Load()) }

// MaxOf reports the largest saturation among its sources. Build it with Max.
type MaxOf struct {
	srcs []Source
}

// Max returns a Source reporting the largest (sanitised) saturation of
// sources: the pool is as saturated as its most saturated signal. Nil sources
// are dropped; with no sources left it reports 1 (fail safe: no information).
// A NaN from any source reads as 1 (Sanitize), so it can raise but never
// hide the maximum. The slice is copied.
func Max(sources ...Source) *MaxOf {
	return &MaxOf{srcs: nonNil(sources)}
}

// Saturation returns the maximum over the sources; allocation-free.
func (m *MaxOf) Saturation() float64 {
	if len(m.srcs) == 0 {
		return 1
	}
	best := 0.0
	for _, s := range m.srcs {
		if x := Sanitize(s.Saturation()); x > best {
			best = x
		}
	}
	return best
}

// MeanOf reports the unweighted mean saturation of its sources. Build it with
// Mean.
type MeanOf struct {
	srcs []Source
}

// Mean returns a Source reporting the unweighted mean of the (sanitised)
// saturations of sources. Nil sources are dropped; with no sources left it
// reports 1 (fail safe). A NaN from any source counts as 1 (Sanitize). The
// slice is copied.
func Mean(sources ...Source) *MeanOf {
	return &MeanOf{srcs: nonNil(sources)}
}

// Saturation returns the mean over the sources; allocation-free.
func (m *MeanOf) Saturation() float64 {
	if len(m.srcs) == 0 {
		return 1
	}
	sum := 0.0
	for _, s := range m.srcs {
		sum += Sanitize(s.Saturation())
	}
	// Each term is at most MaxSaturation, so the sum cannot overflow.
	return Sanitize(sum / float64(len(m.srcs)))
}

func nonNil(sources []Source) []Source {
	out := make([]Source, 0, len(sources))
	for _, s := range sources {
		// A nil interface would panic when read; a nil Func is a typed,
		// non-nil interface value and stays (it reports 1).
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// isBad reports whether x cannot be a count or a usage: NaN or negative.
func isBad(x float64) bool { return x != x || x < 0 }
