package llmd

import (
	"fmt"
	"math"
	"slices"

	"github.com/flowgate/flowgate/flowcontrol"
)

// UsageLimitPolicy is llm-d's usage-limit policy: once per dispatch cycle it gives
// every band a ceiling, and a band whose ceiling is at or below the pool's saturation
// halts the cycle (saturation >= ceiling). Band 0 is the highest priority. Ceilings are
// non-increasing by priority. Static, SoftReflective and PriorityHoldback implement
// it. It is not flowcontrol.CeilingPolicy, which is a pure per-band gate.
type UsageLimitPolicy interface {
	// ComputeLimit writes the ceiling of every band (len(ceilings) bands) for one cycle
	// at the given saturation. It is called exactly once per cycle and may advance
	// the policy's state (SoftReflective's duty-cycle counter).
	ComputeLimit(saturation float64, ceilings []float64)
	// Idle advances the policy's state exactly as n calls of ComputeLimit at this
	// saturation with this many bands would, without computing ceilings. It lets a
	// host on a virtual clock skip cycles on which nothing can be dispatched.
	Idle(saturation float64, bands int, n int64)
	// TopCeiling returns band 0's ceiling at this saturation. It must be what
	// ComputeLimit gives band 0 and must not depend on the policy's state.
	TopCeiling(saturation float64) float64
}

// DefaultThreshold is the threshold of llm-d's static-usage-limit-policy when its
// configuration gives none. NewStatic(DefaultThreshold) is also the policy of a
// DispatcherConfig that sets none.
const DefaultThreshold = 1.0

// Static is llm-d's static-usage-limit-policy: one threshold for every band.
// A cycle halts when saturation >= threshold, whatever the band, band 0
// included. Stateless.
type Static struct{ threshold float64 }

// NewStatic returns llm-d's static usage-limit policy with the given threshold, which
// must be in (0, 1] (llm-d's default is DefaultThreshold); NewDispatcher refuses
// others.
func NewStatic(threshold float64) *Static { return &Static{threshold: threshold} }

// Threshold returns the policy's threshold.
func (p *Static) Threshold() float64 { return p.threshold }

// ComputeLimit implements UsageLimitPolicy: every band's ceiling is the threshold.
func (p *Static) ComputeLimit(_ float64, ceilings []float64) {
	for i := range ceilings {
		ceilings[i] = p.threshold
	}
}

// Idle implements UsageLimitPolicy; the policy has no state.
func (p *Static) Idle(float64, int, int64) {}

// TopCeiling implements UsageLimitPolicy.
func (p *Static) TopCeiling(float64) float64 { return p.threshold }

// validate is called by NewDispatcher.
func (p *Static) validate() error {
	if !(p.threshold > 0 && p.threshold <= 1) {
		return fmt.Errorf("%w: Policy: llmd.NewStatic threshold must be in (0, 1], got %v", flowcontrol.ErrInvalidConfig, p.threshold)
	}
	return nil
}

// SoftReflective is llm-d's soft-reflective-ceiling-policy, with its
// semantics, not those of flowcontrol.SoftReflective (which never gates band 0 and
// gives each band its own duty count). For N bands and saturation s:
//
//   - band 0: ceiling 1.0, so at s >= 1 every band halts, band 0 included;
//   - band i >= 1: reflective = 1 − i·s/(N−1); s < reflective → 1.0 (open);
//     s >= 1 → 0.0 (closed); otherwise the duty cycle decides, 1.0 or 0.0.
//
// The duty cycle: period = max(1, round(s/(1−s+1e−9))) (s = 0.6 gives 1, 0.65 and 0.7
// give 2, 0.75 gives 3, 0.9 gives 9); one counter shared by all gated bands, so they
// open together, incremented once per cycle in which some band is in the duty-cycle
// regime (which needs 0.5 ≤ s < 1), before the test; the gated bands are open when
// counter % period == 0 (period 2: closed, open, closed, open; period 3: closed,
// closed, open). Cycles outside that regime leave the counter alone.
//
// NaN saturation is read as 1 and negative as 0 (flowcontrol.Sanitize). Not safe for
// concurrent use (one dispatcher's cycles use it).
type SoftReflective struct{ counter int64 }

// NewSoftReflective returns llm-d's soft-reflective ceiling policy. It has no
// parameters. Give each dispatcher its own: the counter is the policy's state.
func NewSoftReflective() *SoftReflective { return &SoftReflective{} }

// Counter returns the shared duty-cycle counter (the number of cycles spent in the
// duty-cycle regime so far).
func (p *SoftReflective) Counter() int64 { return p.counter }

// Period is the duty-cycle period of llm-d's soft-reflective policy at saturation
// s: max(1, round(s/(1−s+1e−9))), with Go's math.Round (half away from zero).
func Period(s float64) int64 {
	return int64(math.Max(1, math.Round(s/(1.0-s+1e-9))))
}

// reflective is band i's reflective ceiling among n bands.
func reflective(i, n int, s float64) float64 { return 1.0 - float64(i)*s/float64(n-1) }

// duty reports whether some band i >= 1 of n is in the duty-cycle regime at s.
func duty(n int, s float64) bool {
	if n < 2 || s >= 1 {
		return false
	}
	// The reflective ceiling falls with i, so the last band is the first to reach it.
	return !(s < reflective(n-1, n, s))
}

// ComputeLimit implements UsageLimitPolicy.
func (p *SoftReflective) ComputeLimit(saturation float64, ceilings []float64) {
	n := len(ceilings)
	if n == 0 {
		return
	}
	s := flowcontrol.Sanitize(saturation)
	ceilings[0] = 1
	if n == 1 {
		return
	}
	open := false
	if duty(n, s) {
		p.counter++
		open = p.counter%Period(s) == 0
	}
	for i := 1; i < n; i++ {
		switch {
		case s < reflective(i, n, s):
			ceilings[i] = 1
		case s >= 1:
			ceilings[i] = 0
		case open:
			ceilings[i] = 1
		default:
			ceilings[i] = 0
		}
	}
}

// Idle implements UsageLimitPolicy.
func (p *SoftReflective) Idle(saturation float64, bands int, n int64) {
	if n > 0 && duty(bands, flowcontrol.Sanitize(saturation)) {
		p.counter += n
	}
}

// TopCeiling implements UsageLimitPolicy: band 0's ceiling is always 1.0.
func (p *SoftReflective) TopCeiling(float64) float64 { return 1 }

// PriorityHoldback is llm-d's priority-holdback-policy: a fixed ceiling per band,
// from maxCeiling for band 0 down to minCeiling for the last, spaced by rank or by
// priority value, or given per priority (flowcontrol.HoldbackConfig states the
// parameters and flowcontrol.HoldbackConfig.BandCeilings computes them, as llm-d does for its
// active priorities). A cycle halts at the first band whose ceiling is at or below
// the saturation, so as saturation rises the lowest band is held back first, then
// each band above it; at maxCeiling (1.0 by default) band 0 too. Stateless: no duty
// cycle, and a band below its ceiling is open on every cycle (one item per cycle,
// as every llm-d policy).
type PriorityHoldback struct{ ceilings []float64 }

// NewPriorityHoldback returns llm-d's priority-holdback policy for bands at the given
// priority values (band 0 the highest, strictly decreasing: one per band of the
// dispatcher it is given to, which NewDispatcher checks). Errors wrap
// flowcontrol.ErrInvalidConfig and name the parameter.
func NewPriorityHoldback(cfg flowcontrol.HoldbackConfig, priorities []int) (*PriorityHoldback, error) {
	c, err := cfg.BandCeilings(priorities)
	if err != nil {
		return nil, err
	}
	return &PriorityHoldback{ceilings: c}, nil
}

// Ceilings returns a copy of the ceilings, band 0 first.
func (p *PriorityHoldback) Ceilings() []float64 { return slices.Clone(p.ceilings) }

// ComputeLimit implements UsageLimitPolicy: every band's ceiling is its own, whatever
// the saturation. A dispatcher with more bands than ceilings (which NewDispatcher
// refuses) would give the extra bands the last one.
func (p *PriorityHoldback) ComputeLimit(_ float64, ceilings []float64) {
	for i := range ceilings {
		ceilings[i] = p.ceilings[min(i, len(p.ceilings)-1)]
	}
}

// Idle implements UsageLimitPolicy; the policy has no state.
func (p *PriorityHoldback) Idle(float64, int, int64) {}

// TopCeiling implements UsageLimitPolicy: band 0's ceiling (maxCeiling in the rank
// and value domains).
func (p *PriorityHoldback) TopCeiling(float64) float64 { return p.ceilings[0] }

// validateBands is called by NewDispatcher with its number of bands.
func (p *PriorityHoldback) validateBands(n int) error {
	if len(p.ceilings) != n {
		return fmt.Errorf("%w: Policy: llmd.NewPriorityHoldback was given %d band priorities for %d bands", flowcontrol.ErrInvalidConfig, len(p.ceilings), n)
	}
	return nil
}
