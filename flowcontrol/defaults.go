package flowcontrol

import "time"

// Defaults applied by NewDispatcher and NewController to zero-valued fields.
// Keep every default here, in one place.
//
// Why these: open bands release everything on arrival (no budget), so the
// defaults only shape gated bands. examples/sim/README.md's pacing sweep ("Dispatch
// discipline: the pacing sweep") compared tick, completion, reading and
// floor pacing, with and without Recheck and in-flight credit, at every
// published point over five seeds: the candidates that protect critical
// traffic most (completion-clocked) starve sheddable traffic and lose
// throughput where completions are rare or the pool is near its knee, so
// the zero Pacing (ticks) stays the default, and Burst 1 — one release per
// opening — is the burst that improved every overloaded point on both
// calibrations without moving an under-capacity point or throughput. A
// host that wants more protection and accepts that cost sets Pacing (see
// the table).
const (
	// DefaultTick is the period of the dispatcher's clock in Run: gates
	// are re-evaluated, saturation is read and expiries are applied once
	// per tick.
	DefaultTick = time.Millisecond
	// DefaultBurst is how many items a gated band (duty cycle Every > 1)
	// may release per dispatch opportunity. Open bands have no budget.
	DefaultBurst = 1
	// DefaultStaticThreshold is the threshold of the static policy when
	// none is given (PolicyByName): 1.0, "effectively no flow control".
	DefaultStaticThreshold = 1.0
)

// Limits on configuration and policy output.
const (
	// MaxBands is the largest number of bands a dispatcher accepts.
	MaxBands = 1024
	// MaxEvery is the largest duty cycle a policy returns and the value at
	// which the dispatcher's per-band tick count saturates: at any
	// practical tick, for practical purposes, blocked.
	MaxEvery = 1 << 30
	// MaxSaturation is the value Sanitize clamps large inputs (+Inf
	// included) to: far above every ceiling, so it reads "overloaded".
	MaxSaturation = 1e6
)
