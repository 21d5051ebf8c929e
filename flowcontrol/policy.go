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

// Static applies one threshold to every band: every band but band 0 is
// blocked when saturation ≥ threshold, and band 0 is paced there (see
// below). With threshold 1.0 it is the usual "constant ceiling" baseline,
// flowgate's form of llm-d's static-usage-limit-policy.
//
// Below the threshold a band is not simply open: Static paces the approach
// to its ceiling (see ceilingGate), so that a band reopening after a block
// does not release its whole backlog at once. Why: scraped saturation lags
// the pool by a scrape interval or more, and an open band releases
// everything it holds on the first tick below the threshold, so each
// reopening flooded the replicas with the backlog that built up while they
// were blocked; measured in examples/sim, that made a threshold of 1.0
// worse than no flow control at all at and past the knee (critical TTFT p99
// at codegen@16 53.2 s against 18.0 s with none; llm-d's static, which
// releases one item per cycle in strict priority order, 14.4 s). Paced, a
// reopening releases a bounded share per opportunity, less the closer the
// reading is to the threshold, and lower bands less than higher ones.
// The gates, for threshold t and sanitised saturation s:
//
//	s ≥ t                 band 0: Every MaxCriticalEvery (0 with BlockCritical);
//	                      band i ≥ 1: blocked (Every 0)
//	r = round(s/(t−s)) ≤ 1 (s ≤ t/2 and a little above): every band open
//	otherwise             band 0: Every min(r, MaxCriticalEvery);
//	                      band i ≥ 1: Every r·(1+i) (capped at MaxEvery)
//
// r is rounded half up as SoftReflective's ratios are; it is the duty cycle
// SoftReflective gives the last of two bands, with t in place of 1 (s = 0.75t
// gives 3, 0.9t gives 9).
//
// At and above t, band 0 is not blocked: it keeps one opportunity in
// MaxCriticalEvery (the Every it has just below t, so the gate does not step
// when the reading crosses t), and every lower band is blocked. Why: where
// the pool reads saturated for long stretches while its replicas could
// still admit (KV-bound work, where the KV term reads ≥ 1 from 80 % of the
// cache, and the pool mean hides a replica with room), a blocked critical
// band waits at the gateway for completions to bring the reading down,
// where with no flow control it would have been admitted at once. Measured
// in examples/sim with every band blocked at t (reasoning@0.7 and @1.2,
// critical TTFT p99 108 s and 188 s against 87.8 s and 152 s with no flow
// control), no pacing below t recovered it without holding the sheddable
// band far below t, which is a second ceiling (PriorityHoldback); pacing
// band 0 at t did (6.8 s and 136 s), with every other point as good or
// better. This is flowgate's rule, as SoftReflective never gates band 0:
// llm-d's static-usage-limit-policy blocks every band at s ≥ t, which
// StaticConfig.BlockCritical reproduces (and llmd.NewStatic with llm-d's
// whole dispatch discipline).
type Static struct {
	threshold     float64
	blockCritical bool
}

// StaticConfig configures NewStaticConfig.
type StaticConfig struct {
	// Threshold is the ceiling t of every band: 0 means
	// DefaultStaticThreshold; otherwise a number > 0 (+Inf never blocks).
	Threshold float64
	// BlockCritical, if set, blocks band 0 at and above the threshold
	// like every other band: llm-d's meaning of static-usage-limit-policy,
	// where no band is released at s ≥ t. Unset (the default), band 0 keeps
	// one opportunity in MaxCriticalEvery there (at the default Tick and
	// Burst, 500 critical releases/s while the pool reads saturated), so a
	// critical request is not held at the gateway while a replica could
	// start it. Set it to reproduce an llm-d deployment's gate exactly, or
	// where the threshold must be a hard stop for every request; see Static
	// for what it costs (measured in examples/sim).
	BlockCritical bool
}

// NewStaticConfig returns the static policy c describes, or an error
// wrapping ErrInvalidConfig naming the bad field: a Threshold that is NaN
// or negative.
func NewStaticConfig(c StaticConfig) (*Static, error) {
	t := c.Threshold
	switch {
	case t == 0:
		t = DefaultStaticThreshold
	case !(t > 0): // NaN or negative
		return nil, fmt.Errorf("%w: StaticConfig.Threshold must be a number > 0 (0 = default %v), got %v",
			ErrInvalidConfig, DefaultStaticThreshold, c.Threshold)
	}
	return &Static{threshold: t, blockCritical: c.BlockCritical}, nil
}

// MaxCriticalEvery is the largest Every Static and PriorityHoldback give band
// 0 below its ceiling: however close the reading is to the ceiling, the
// critical band keeps at least one opportunity in MaxCriticalEvery until the
// ceiling is reached (and Burst per opportunity: 500 items/s at the default
// Tick and Burst), while lower bands slow down without bound.
const MaxCriticalEvery = 2

// NewStatic returns the static policy with the given threshold (band 0 paced,
// not blocked, at and above it; StaticConfig.BlockCritical for llm-d's
// meaning). A NaN threshold is replaced by DefaultStaticThreshold. A
// threshold ≤ 0 blocks every band but band 0 at every saturation, forever;
// NewStatic allows it (a test may want a closed gate), PolicyByName refuses
// it.
func NewStatic(threshold float64) *Static {
	if threshold != threshold {
		threshold = DefaultStaticThreshold
	}
	return &Static{threshold: threshold}
}

// Threshold returns the policy's threshold.
func (p *Static) Threshold() float64 { return p.threshold }

// BlocksCritical reports whether band 0 is blocked at and above the
// threshold like every other band (StaticConfig.BlockCritical, llm-d's
// meaning) rather than paced (the default).
func (p *Static) BlocksCritical() bool { return p.blockCritical }

// Gate returns the band's gate at the threshold: when saturation ≥
// threshold, band 0 paced at Every MaxCriticalEvery (blocked, Every 0, with
// BlockCritical) and every other band blocked; paced just below it; open
// (Every 1) further below. NaN saturation counts as 1. See Static.
func (p *Static) Gate(band, bands int, saturation float64) Gate {
	s := Sanitize(saturation)
	if !p.blockCritical && band <= 0 && !(s < p.threshold) {
		// The same Every band 0 has just below the threshold, so the
		// gate does not step when the reading crosses it.
		return Gate{Ceiling: p.threshold, Every: MaxCriticalEvery}
	}
	return ceilingGate(p.threshold, band, s)
}

// ceilingGate is the gate of a band whose fixed ceiling is c, at the
// sanitised saturation s: Static's rule (see Static), shared by
// PriorityHoldback. band < 0 counts as band 0.
func ceilingGate(c float64, band int, s float64) Gate {
	if !(s < c) { // also a NaN ceiling: blocked
		return Gate{Ceiling: c, Every: 0}
	}
	// s/(c−s) rises from 0 at s = 0 to +Inf as s approaches c; c−s > 0
	// here. roundHalfUp caps at MaxEvery (and maps +Inf there).
	r := roundHalfUp(s / (c - s))
	if r <= 1 {
		return Gate{Ceiling: c, Every: 1}
	}
	if band <= 0 {
		return Gate{Ceiling: c, Every: min(r, MaxCriticalEvery)}
	}
	// r·(1+band) without overflow: r ≤ MaxEvery = 2^30 and band < 2^62
	// would overflow int64 only past MaxEvery, which caps it.
	if band >= MaxEvery || r > MaxEvery/(1+band) {
		return Gate{Ceiling: c, Every: MaxEvery}
	}
	return Gate{Ceiling: c, Every: r * (1 + band)}
}

// SoftReflective is the soft-reflective ceiling. For N bands and saturation s:
//
//	ceiling[0] = 1                   critical: never gated
//	ceiling[i] = max(0, 1 − i·s/(N−1))
//
// A band whose ceiling is at or above s dispatches on every tick (the dead
// zone); a band with a positive ceiling below s dispatches on one tick in
// round(s/ceiling), rounded half up; a band whose ceiling is 0 is blocked.
//
// Rounding: ratios are rounded half up with a relative tolerance of 1e-9, so
// that decimal inputs round as in exact arithmetic: in float64 0.6/(1−0.6) is
// 1.4999999999999998, which plain math.Round turns into 1 (no gating) where
// exact arithmetic gives 1.5 → 2 (half the ticks blocked). The tolerance is
// millions of times the float64 error of the quotient and far below any
// meaningful difference in saturation.
//
// Totality: band ≤ 0 and bands ≤ 1 are treated as the critical band (never
// gated, for any saturation, NaN included); band ≥ bands as the last band;
// NaN saturation as 1 and negative saturation as 0.
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
	if band <= 0 || bands <= 1 {
		return Gate{Ceiling: 1, Every: 1}
	}
	if band >= bands {
		band = bands - 1
	}
	s := Sanitize(saturation)
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
// them (PriorityHoldbackPolicyName too).
const (
	StaticPolicyName         = "static-usage-limit-policy"
	SoftReflectivePolicyName = "soft-reflective-ceiling-policy"
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
// values or a map: build them with HoldbackCeilings and
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
