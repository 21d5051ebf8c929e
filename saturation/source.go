package saturation

import (
	"errors"
	"math"

	"go.uber.org/atomic"
)

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
// result is reported as it is (raw: the dispatcher applies the one
// sanitising rule, see the package documentation); a nil Func reports 1
// (fail safe).
type Func func() float64

// Saturation returns f(), or 1 for a nil Func.
func (f Func) Saturation() float64 {
	if f == nil {
		return 1
	}
	return f()
}

// Value is a settable Source for hosts that compute saturation themselves.
// The zero value is ready to use and reports 0 until Set is called.
// Saturation returns exactly the last value Set, NaN or negative included
// (raw: the dispatcher sanitises). Set and Saturation are single atomic
// operations: safe for concurrent use, lock-free and allocation-free.
type Value struct {
	v atomic.Float64
}

// Set stores x as the current saturation.
func (v *Value) Set(x float64) { v.v.Store(x) }

// Saturation returns the last value Set (0 before any Set).
func (v *Value) Saturation() float64 { return v.v.Load() }

// MaxOf reports the largest saturation among its sources. Build it with Max.
type MaxOf struct {
	srcs []Source
}

// Max returns a Source reporting the largest saturation of sources: the
// pool is as saturated as its most saturated signal. A NaN from a source
// counts as 1 (no information is not idle: it can raise the maximum to 1 but
// never hide a larger value); every other value, ±Inf included, is compared
// as it is, so the result is never NaN and +Inf wins. Nil sources are
// dropped; with no sources left it reports 1 (fail safe). The slice is
// copied.
func Max(sources ...Source) *MaxOf {
	return &MaxOf{srcs: nonNil(sources)}
}

// Saturation returns the maximum over the sources; allocation-free.
func (m *MaxOf) Saturation() float64 {
	if len(m.srcs) == 0 {
		return 1
	}
	best := math.Inf(-1)
	for _, s := range m.srcs {
		x := s.Saturation()
		if x != x { // NaN
			x = 1
		}
		if x > best {
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

// Mean returns a Source reporting the unweighted mean of the saturations of
// sources. So that one broken source can neither cancel nor hide another, a
// NaN counts as 1 and a negative value (−Inf included) as 0; +Inf, or a sum
// of huge values that overflows, makes the mean +Inf (overloaded). The
// result is never NaN nor negative. Nil sources are dropped; with no sources
// left it reports 1 (fail safe). The slice is copied.
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
		x := s.Saturation()
		switch {
		case x != x: // NaN
			x = 1
		case x < 0:
			x = 0
		}
		sum += x // terms >= 0: the sum is never NaN, at worst +Inf
	}
	return sum / float64(len(m.srcs))
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

// isBad reports whether x cannot be a count or a usage: NaN, negative or
// infinite.
func isBad(x float64) bool { return x != x || x < 0 || math.IsInf(x, 1) }
