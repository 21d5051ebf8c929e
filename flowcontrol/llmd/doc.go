// Package llmd is a reference for comparison, never a gate to deploy: it
// reproduces the flow controller of llm-d-router (the dispatch cycle of its
// processor and its usage-limit policies) over flowgate's band configuration, so
// that llm-d's discipline and flowgate's can be measured side by side on the same
// workload, the same pool and the same saturation signal.
//
// A proxy gates with package flowcontrol
// (Controller, or Dispatcher for items of its own type) and flowcontrol/flowhttp.
// Results measured with this package are llm-d's; never quote them as flowgate's,
// nor flowgate's as llm-d's.
//
// # Semantics
//
// The rules are llm-d's, as read from its public source (llm-d-router, commit
// ebab6879); where they differ from flowgate's, llm-d's are kept:
//
//   - One item per cycle. A dispatch cycle (Dispatcher.Cycle) reads the saturation
//     once, asks the UsageLimitPolicy for every band's ceiling once, and dispatches
//     at most one item. llm-d runs a cycle after every enqueue and on a 1 ms ticker
//     (Tick), so its dispatch rate is about arrivals plus ticks per second.
//   - Head-of-line block. Bands are visited from band 0 down; at the first band
//     with saturation >= ceiling the cycle stops, checked before looking at whether
//     the band has items: a gated band blocks every band below it, even when it is
//     empty.
//   - Soft-reflective halts band 0 at s ≥ 1. SoftReflective gives band 0 the
//     ceiling 1.0, and the gate is saturation >= ceiling, so at saturation 1 or
//     more every band halts, band 0 included. flowcontrol's dispatcher never
//     gates band 0 unless flowcontrol.Config.BlockCritical.
//   - A shared duty-cycle counter. Below its reflective ceiling 1 − i·s/(N−1) a
//     band is open or closed by one counter shared by all gated bands (so they open
//     together), advanced once per cycle while 0.5 ≤ s < 1, with period
//     max(1, round(s/(1−s+1e−9))) (Period). flowgate's dispatcher keeps a count
//     per band instead.
//   - Priority holdback is fixed ceilings. PriorityHoldback gives band i of N the
//     ceiling maxCeiling − i·(maxCeiling−minCeiling)/(N−1) (rank), one spaced by
//     priority value (value), or one from a map (explicit); nothing depends on the
//     saturation or on state, so a band below its ceiling is open on every cycle.
//   - Expiry by a sweep every second (CleanupInterval, Dispatcher.Sweep), not at
//     each tick.
//
// Not modelled: fairness other than llm-d's default global-strict (one FIFO per
// band; other values of BandConfig.Fairness are refused), byte budgets (MaxBytes is
// validated, not counted), and anything flowgate adds
// (bursts, the paced reopening, in-flight credit, admission, the blocking
// Controller facade).
//
// # Relation to flowcontrol
//
// Imports point one way: this package uses flowcontrol's BandConfig (validated by
// flowcontrol.CheckBands), SaturationSource, Sanitize and sentinel errors
// (flowcontrol.ErrInvalidConfig, ErrQueueFull, ErrUnknownBand, ErrExpired,
// ErrCancelled, all errors.Is-able as there); flowcontrol does not know this package.
// flowcontrol.PolicyByName registers flowgate's policies under llm-d's type names
// ("soft-reflective-ceiling-policy" there is flowgate's semantics); llm-d's own
// policies are built here, by NewStatic, NewSoftReflective and NewPriorityHoldback
// (whose parameters, flowcontrol.HoldbackConfig, and ceiling maths,
// flowcontrol.HoldbackConfig.BandCeilings, are shared with flowgate's PriorityHoldback), and have
// no registry.
package llmd
