package flowcontrol

import "time"

// Defaults applied by NewDispatcher and NewController to zero-valued fields.
// Keep every default here, in one place. Open bands without a backlog
// release everything on arrival, so the defaults only shape paced bands.
const (
	// DefaultTick is the period of the dispatcher's clock in Run: gates
	// are re-evaluated, saturation is read and expiries are applied once
	// per tick.
	DefaultTick = time.Millisecond
	// DefaultBurst is how many items a paced band (gated, or draining a
	// backlog after reopening) releases per tick: one release per opening
	// keeps a reopening from flooding the pool between two readings.
	DefaultBurst = 1
	// DefaultStaticThreshold is the threshold of the static policy when
	// none is given (PolicyByName): 1.0, the pool full.
	DefaultStaticThreshold = 1.0
	// DefaultFlow is the flow of an item enqueued without one (Enqueue,
	// Wait, or an empty flow id), as llm-d names it.
	DefaultFlow = "default-flow"
	// DefaultFlowIdle is BandConfig.FlowIdle's default: longer than any
	// sensible MaxWait and a few scrape intervals, short enough that a
	// gateway seeing many one-off ids holds only those of the last minute.
	DefaultFlowIdle = time.Minute
	// DefaultHoldbackMaxCeiling is a priority-holdback maxCeiling when the
	// configuration gives none: the highest band is held back only at full
	// saturation.
	DefaultHoldbackMaxCeiling = 1.0
)

// Limits on configuration and policy output.
const (
	// MaxBands is the largest number of bands a dispatcher accepts.
	MaxBands = 1024
	// MinTick is the shortest Tick accepted: below it Run spends a large
	// share of a core on ticks without releasing anything sooner.
	MinTick = 100 * time.Microsecond
	// MaxBandNameLen is the longest band name accepted, in bytes.
	MaxBandNameLen = 64
	// MaxEvery is the largest duty cycle a policy returns and the value at
	// which the dispatcher's per-band tick count saturates: at any
	// practical tick, for practical purposes, blocked.
	MaxEvery = 1 << 30
	// MaxSaturation is the value Sanitize clamps large inputs (+Inf
	// included) to: far above every ceiling, so it reads "overloaded".
	MaxSaturation = 1e6
)
