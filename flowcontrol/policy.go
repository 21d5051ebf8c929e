package flowcontrol

import "fmt"

// SaturationSource is what the dispatcher reads once per tick: 0 idle, 1
// full, above 1 overloaded. It is declared here, where it is used, so every
// saturation.Source satisfies it without either package importing the other.
type SaturationSource interface{ Saturation() float64 }

// Gate is a policy's decision for one band at one saturation.
type Gate struct {
	// Ceiling is the saturation at which the band starts being throttled.
	Ceiling float64
	// Every says the band may dispatch on one tick in Every: 1 = every
	// tick, 0 = blocked. The dispatcher treats a negative Every as 0 and
	// one above MaxEvery as MaxEvery. Policies in this package return
	// values in [0, MaxEvery].
	Every int
}

// CeilingPolicy decides how often each band may dispatch at a given
// saturation. Gate must be a pure function: no state, no allocation, safe
// for concurrent use, and total — it must return a valid Gate for any band,
// bands and saturation, including NaN, ±Inf and out-of-range bands.
type CeilingPolicy interface {
	Gate(band, bands int, saturation float64) Gate
}

// PolicyFunc adapts an ordinary function to CeilingPolicy, like
// http.HandlerFunc.
type PolicyFunc func(band, bands int, saturation float64) Gate

// Gate calls f(band, bands, saturation).
func (f PolicyFunc) Gate(band, bands int, saturation float64) Gate {
	return f(band, bands, saturation)
}

// Sanitize maps a raw saturation reading to the range policies expect: NaN
// becomes 1 (fail safe: sheddable bands wait, critical flows), negative
// values (-Inf included) become 0, and values above MaxSaturation (+Inf
// included) become MaxSaturation, which every ceiling reads as overloaded.
// Values in [0, MaxSaturation] are returned unchanged, so Sanitize is
// idempotent. The dispatcher calls it once per tick on the source's value;
// it is the only place inputs are sanitised (policies are nevertheless total
// over raw inputs).
func Sanitize(s float64) float64 {
	switch {
	case s != s: // NaN
		return 1
	case s < 0:
		return 0
	case s > MaxSaturation:
		return MaxSaturation
	}
	return s
}

// Static is a constant ceiling: every band is open while the saturation is
// below the threshold and blocked at and above it. With threshold 1.0 it is
// llm-d's static-usage-limit-policy, the usual baseline. The dispatcher, not
// the policy, keeps it safe: a band that reopens with a backlog is paced, and
// band 0 keeps a minimum rate unless Config.BlockCritical (see Dispatcher).
type Static struct {
	threshold float64
}

// NewStatic returns the static policy with the given threshold. A NaN
// threshold is replaced by DefaultStaticThreshold; a threshold ≤ 0 blocks
// every band at every saturation (PolicyByName refuses it).
func NewStatic(threshold float64) *Static {
	if threshold != threshold {
		threshold = DefaultStaticThreshold
	}
	return &Static{threshold: threshold}
}

// Threshold returns the policy's threshold.
func (p *Static) Threshold() float64 { return p.threshold }

// Gate returns Every 1 below the threshold and 0 (blocked) at and above it,
// for every band; NaN saturation counts as 1.
func (p *Static) Gate(_, _ int, saturation float64) Gate {
	return ceilingGate(p.threshold, Sanitize(saturation))
}

// ceilingGate is the gate of a band whose fixed ceiling is c at the
// sanitised saturation s: open below c, blocked at and above it (and for a
// NaN ceiling).
func ceilingGate(c, s float64) Gate {
	if s < c {
		return Gate{Ceiling: c, Every: 1}
	}
	return Gate{Ceiling: c, Every: 0}
}

// SoftReflective is the soft-reflective ceiling. For N bands and saturation s:
//
//	ceiling[0] = 1                   critical
//	ceiling[i] = max(0, 1 − i·s/(N−1))
//
// A band whose ceiling is at or above s dispatches on every tick (the dead
// zone); a band with a positive ceiling below s dispatches on one tick in
// round(s/ceiling), rounded half up (band 0 above s = 1 too); a band whose
// ceiling is 0 is blocked. (Whatever a policy says, the dispatcher keeps
// band 0 moving unless Config.BlockCritical: see Dispatcher. llm-d's policy
// halts every band at s ≥ 1: package llmd reproduces it.)
//
// Rounding: ratios are rounded half up with a relative tolerance of 1e-9, so
// that decimal inputs round as in exact arithmetic (in float64 0.6/(1−0.6) is
// 1.4999999999999998, which must give 2, not 1).
//
// Totality: band ≤ 0 and bands ≤ 1 are treated as the critical band; band ≥
// bands as the last band; NaN saturation as 1 and negative saturation as 0.
type SoftReflective struct{}

// NewSoftReflective returns the soft-reflective ceiling policy. It has no
// parameters: adding a band extends the reflection.
func NewSoftReflective() *SoftReflective { return &SoftReflective{} }

// roundTol is the relative tolerance of roundHalfUp; see SoftReflective.
const roundTol = 1e-9

// roundHalfUp rounds q ≥ 0 half up, counting values within a relative
// roundTol below a half as the half, and caps the result at MaxEvery.
func roundHalfUp(q float64) int {
	if !(q < MaxEvery) { // also catches NaN
		return MaxEvery
	}
	// q ≥ 0 here, so truncation is floor (and cheaper than math.Floor,
	// which is a call on amd64 without SSE4.1 guaranteed).
	return min(int(q+0.5+q*roundTol), MaxEvery)
}

// Gate implements CeilingPolicy.
func (*SoftReflective) Gate(band, bands int, saturation float64) Gate {
	s := Sanitize(saturation)
	if band <= 0 || bands <= 1 {
		// ceiling[0] = 1: the dead zone up to s = 1, then the same
		// duty cycle as every band, round(s/1).
		if s <= 1 {
			return Gate{Ceiling: 1, Every: 1}
		}
		return Gate{Ceiling: 1, Every: roundHalfUp(s)}
	}
	if band >= bands {
		band = bands - 1
	}
	n1 := float64(bands - 1)
	// num is ceiling·(N−1); working with it keeps one rounding fewer in
	// the quotient s/ceiling = s·(N−1)/num.
	num := n1 - float64(band)*s
	if num <= 0 {
		return Gate{Ceiling: 0, Every: 0}
	}
	ceiling := num / n1
	sn := s * n1
	if num >= sn { // ceiling ≥ s: the dead zone
		return Gate{Ceiling: ceiling, Every: 1}
	}
	e := roundHalfUp(sn / num)
	if e < 1 {
		e = 1
	}
	return Gate{Ceiling: ceiling, Every: e}
}

// Policy names understood by PolicyByName, as the reference gateway spells
// them.
const (
	StaticPolicyName           = "static-usage-limit-policy"
	SoftReflectivePolicyName   = "soft-reflective-ceiling-policy"
	PriorityHoldbackPolicyName = "priority-holdback-policy"
)

// PolicyByName returns the policy registered under name, configured by
// params (nil means all defaults):
//
//	"static-usage-limit-policy"      param "threshold" (default 1.0, > 0)
//	"soft-reflective-ceiling-policy" no params
//	"priority-holdback-policy"       params "minCeiling" (required, in [0, 1)) and
//	                                 "maxCeiling" (default 1.0, in (0, 1]):
//	                                 the rank domain (NewPriorityHoldback)
//
// The holdback policy's value and explicit domains need the bands' priority
// values or a map: build them with HoldbackConfig.BandCeilings and
// NewPriorityHoldbackCeilings. Unknown names, unknown params and bad values
// are errors wrapping ErrInvalidConfig.
func PolicyByName(name string, params map[string]float64) (CeilingPolicy, error) {
	switch name {
	case StaticPolicyName:
		t := DefaultStaticThreshold
		for k, v := range params {
			if k != "threshold" {
				return nil, fmt.Errorf("%w: policy %q has no parameter %q", ErrInvalidConfig, name, k)
			}
			// A threshold ≤ 0 blocks every band but band 0 at
			// every saturation: never what a host means, so it
			// is refused here (NewStatic documents it).
			if !(v > 0) {
				return nil, fmt.Errorf("%w: policy %q: threshold must be a number > 0, got %v", ErrInvalidConfig, name, v)
			}
			t = v
		}
		return NewStatic(t), nil
	case SoftReflectivePolicyName:
		for k := range params {
			return nil, fmt.Errorf("%w: policy %q has no parameter %q", ErrInvalidConfig, name, k)
		}
		return NewSoftReflective(), nil
	case PriorityHoldbackPolicyName:
		for k := range params {
			if k != "minCeiling" && k != "maxCeiling" {
				return nil, fmt.Errorf("%w: policy %q has no parameter %q (minCeiling, maxCeiling)", ErrInvalidConfig, name, k)
			}
		}
		lo, ok := params["minCeiling"]
		if !ok {
			return nil, fmt.Errorf("%w: policy %q: minCeiling is required", ErrInvalidConfig, name)
		}
		hi, ok := params["maxCeiling"]
		if ok && hi == 0 {
			// 0 means the default in NewPriorityHoldback; here it
			// was given, and llm-d refuses it.
			return nil, fmt.Errorf("%w: %s maxCeiling: must be in (0, 1], got 0", ErrInvalidConfig, name)
		}
		return NewPriorityHoldback(lo, hi)
	}
	return nil, fmt.Errorf("%w: unknown policy %q (want %q, %q or %q)", ErrInvalidConfig, name,
		StaticPolicyName, SoftReflectivePolicyName, PriorityHoldbackPolicyName)
}
