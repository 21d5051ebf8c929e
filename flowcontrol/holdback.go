package flowcontrol

import (
	"fmt"
	"maps"
	"slices"
)

// HoldbackConfig is the configuration of llm-d's priority-holdback-policy:
// fixed ceilings, from MaxCeiling for the highest band down to MinCeiling for
// the lowest, spaced by Domain; or, with Domain HoldbackExplicit, given per
// priority. Validate states the rules; BandCeilings applies them to a
// host's bands.
type HoldbackConfig struct {
	// Shape is the interpolation curve: "" or HoldbackLinear. It must be
	// "" with HoldbackExplicit.
	Shape string
	// Domain is HoldbackRank ("" too), HoldbackValue or HoldbackExplicit.
	Domain string
	// MinCeiling is the lowest band's ceiling, in [0, 1) and below
	// MaxCeiling (llm-d requires it: there is no default that suits every
	// pool; a host reading llm-d's file checks that it is given). 0 blocks
	// the lowest band at any saturation. Must be 0 with HoldbackExplicit.
	MinCeiling float64
	// MaxCeiling is the highest band's ceiling, in (0, 1]; 0 means
	// DefaultHoldbackMaxCeiling. Must be 0 with HoldbackExplicit.
	MaxCeiling float64
	// Ceilings maps a priority value to its band's ceiling, each in [0, 1]
	// and non-increasing from the highest priority down. Required with
	// HoldbackExplicit, and only allowed there.
	Ceilings map[int]float64
}

// Validate checks c on its own (BandCeilings also checks the bands'
// priorities). Errors wrap ErrInvalidConfig and name the parameter as llm-d's
// configuration does (minCeiling, maxCeiling, ceilings, shape, domain).
func (c HoldbackConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidConfig, PriorityHoldbackPolicyName, fmt.Sprintf(format, args...))
	}
	switch c.Domain {
	case "", HoldbackRank, HoldbackValue:
	case HoldbackExplicit:
		switch {
		case c.Shape != "":
			return bad("shape: must not be set with domain %q", HoldbackExplicit)
		case c.MinCeiling != 0:
			return bad("minCeiling: must not be set with domain %q", HoldbackExplicit)
		case c.MaxCeiling != 0:
			return bad("maxCeiling: must not be set with domain %q", HoldbackExplicit)
		case len(c.Ceilings) == 0:
			return bad("ceilings: required with domain %q", HoldbackExplicit)
		}
		prios := slices.Sorted(maps.Keys(c.Ceilings))
		for _, p := range prios {
			if v := c.Ceilings[p]; !(v >= 0 && v <= 1) {
				return bad("ceilings[%d]: must be in [0, 1], got %v", p, v)
			}
		}
		// Highest priority first: each ceiling at most the one above.
		for i := len(prios) - 2; i >= 0; i-- {
			hi, lo := prios[i+1], prios[i]
			if c.Ceilings[lo] > c.Ceilings[hi] {
				return bad("ceilings[%d]: %v is above the ceiling of the higher priority %d (%v); ceilings must not increase as priority falls",
					lo, c.Ceilings[lo], hi, c.Ceilings[hi])
			}
		}
		return nil
	default:
		return bad("domain: must be %q, %q or %q, got %q", HoldbackRank, HoldbackValue, HoldbackExplicit, c.Domain)
	}
	if c.Shape != "" && c.Shape != HoldbackLinear {
		return bad("shape: must be %q, got %q", HoldbackLinear, c.Shape)
	}
	if len(c.Ceilings) > 0 {
		return bad("ceilings: only with domain %q", HoldbackExplicit)
	}
	if !(c.MinCeiling >= 0 && c.MinCeiling < 1) {
		return bad("minCeiling: must be in [0, 1), got %v", c.MinCeiling)
	}
	hi := c.maxCeiling()
	if !(hi > 0 && hi <= 1) {
		return bad("maxCeiling: must be in (0, 1], got %v", c.MaxCeiling)
	}
	if c.MinCeiling >= hi {
		return bad("minCeiling: %v must be below maxCeiling (%v)", c.MinCeiling, hi)
	}
	return nil
}

func (c HoldbackConfig) maxCeiling() float64 {
	if c.MaxCeiling == 0 {
		return DefaultHoldbackMaxCeiling
	}
	return c.MaxCeiling
}

// BandCeilings returns the ceiling of every band under c, band 0 first,
// given the bands' priority values (band 0 the highest: strictly
// decreasing, 1..MaxBands of them). With one band, the rank and value
// domains give it MaxCeiling (llm-d's single-priority bypass); the explicit
// domain gives every band its map entry, or 0 without one, and no band a
// ceiling above that of a band above it (llm-d halts its cycle at the first
// band held back, so the bands below it are held too). Errors wrap
// ErrInvalidConfig.
func (c HoldbackConfig) BandCeilings(priorities []int) ([]float64, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	n := len(priorities)
	if n < 1 || n > MaxBands {
		return nil, fmt.Errorf("%w: %s: %d band priorities, want 1..%d", ErrInvalidConfig, PriorityHoldbackPolicyName, n, MaxBands)
	}
	for i := 1; i < n; i++ {
		if priorities[i] >= priorities[i-1] {
			return nil, fmt.Errorf("%w: %s: band priorities must decrease strictly from band 0, got %d after %d at band %d",
				ErrInvalidConfig, PriorityHoldbackPolicyName, priorities[i], priorities[i-1], i)
		}
	}
	out := make([]float64, n)
	lo, hi := c.MinCeiling, c.maxCeiling()
	switch {
	case c.Domain == HoldbackExplicit:
		for i, p := range priorities {
			out[i] = c.Ceilings[p]
			// A band without an entry gets 0, and llm-d's cycle
			// halts at it, so no band below it dispatches either:
			// carrying the minimum down keeps that, and keeps the
			// ceilings non-increasing for a dispatcher that gates
			// bands independently.
			if i > 0 {
				out[i] = min(out[i], out[i-1])
			}
		}
	case n == 1:
		out[0] = hi
	case c.Domain == HoldbackValue:
		pMin, pMax := float64(priorities[n-1]), float64(priorities[0])
		for i, p := range priorities {
			switch float64(p) {
			case pMax: // exactly maxCeiling: lo + 1·(hi−lo) can round off it
				out[i] = hi
			case pMin:
				out[i] = lo
			default:
				out[i] = lo + (float64(p)-pMin)/(pMax-pMin)*(hi-lo)
			}
		}
	default: // rank
		for i := range out {
			out[i] = rankCeiling(lo, hi, i, n)
		}
	}
	return out, nil
}

// rankCeiling is band i's ceiling of n ≥ 2 in the rank domain.
func rankCeiling(lo, hi float64, i, n int) float64 {
	return hi - float64(i)*(hi-lo)/float64(n-1)
}

// PriorityHoldback is llm-d's priority-holdback-policy: each band has a
// fixed ceiling, non-increasing from band 0 down, and is open while the
// saturation is below its ceiling and blocked at and above it. So as
// saturation rises, the lowest band is held back first, and each band in
// turn above it. Bands are gated independently (the dispatcher paces a band
// that reopens with a backlog and keeps band 0 moving; see Dispatcher).
//
// Built with NewPriorityHoldback (the rank domain, a function of (band,
// bands) alone) or NewPriorityHoldbackCeilings (one ceiling per band, as
// HoldbackConfig.BandCeilings computes them for any domain). Gate is pure and total:
// band < 0 is band 0, a band past the last ceiling gets the last.
type PriorityHoldback struct {
	lo, hi   float64
	ceilings []float64 // nil: the rank domain over the dispatcher's bands
}

// NewPriorityHoldback returns the rank-domain policy: with N bands, band i's
// ceiling is maxCeiling − i·(maxCeiling−minCeiling)/(N−1), and a single band
// gets maxCeiling. maxCeiling 0 means DefaultHoldbackMaxCeiling. Errors, as
// HoldbackConfig.Validate's, wrap ErrInvalidConfig.
func NewPriorityHoldback(minCeiling, maxCeiling float64) (*PriorityHoldback, error) {
	c := HoldbackConfig{MinCeiling: minCeiling, MaxCeiling: maxCeiling}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &PriorityHoldback{lo: c.MinCeiling, hi: c.maxCeiling()}, nil
}

// NewPriorityHoldbackCeilings returns the policy with the given ceiling per
// band, band 0 first (copied): 1..MaxBands values, each in [0, 1],
// non-increasing. Give it one per band of the dispatcher it gates. Errors
// wrap ErrInvalidConfig.
func NewPriorityHoldbackCeilings(ceilings []float64) (*PriorityHoldback, error) {
	if n := len(ceilings); n < 1 || n > MaxBands {
		return nil, fmt.Errorf("%w: %s: %d ceilings, want 1..%d", ErrInvalidConfig, PriorityHoldbackPolicyName, n, MaxBands)
	}
	for i, c := range ceilings {
		if !(c >= 0 && c <= 1) {
			return nil, fmt.Errorf("%w: %s: ceiling of band %d must be in [0, 1], got %v", ErrInvalidConfig, PriorityHoldbackPolicyName, i, c)
		}
		if i > 0 && c > ceilings[i-1] {
			return nil, fmt.Errorf("%w: %s: ceiling of band %d (%v) is above band %d's (%v); ceilings must not increase from band 0 down",
				ErrInvalidConfig, PriorityHoldbackPolicyName, i, c, i-1, ceilings[i-1])
		}
	}
	return &PriorityHoldback{ceilings: slices.Clone(ceilings)}, nil
}

// Ceiling returns band's ceiling among bands: what Gate compares the
// saturation with.
func (p *PriorityHoldback) Ceiling(band, bands int) float64 {
	band = max(band, 0)
	if p.ceilings != nil {
		return p.ceilings[min(band, len(p.ceilings)-1)]
	}
	if bands <= 1 {
		return p.hi
	}
	// Float rounding must not take the last band below minCeiling.
	return max(rankCeiling(p.lo, p.hi, min(band, bands-1), bands), p.lo)
}

// Gate implements CeilingPolicy.
func (p *PriorityHoldback) Gate(band, bands int, saturation float64) Gate {
	return ceilingGate(p.Ceiling(band, bands), Sanitize(saturation))
}
