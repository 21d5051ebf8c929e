package flowcontrol

import "time"

// Defaults applied by NewDispatcher and NewController to zero-valued fields.
// Tick and Burst were chosen by the Tick × Burst × in-flight-credit sweep of
// the cluster simulator (go run ./examples/sim -sweep; table and reasoning in
// the README's Simulator section): a release of Burst sheddable requests at
// once is a spike the pool's 50 ms-stale metrics cannot see, so the smallest
// bursts protect critical traffic best, and a 1 ms tick keeps the latency a
// tick adds negligible. Keep every default here, in one place.
const (
	// DefaultTick is the period of the dispatcher's clock in Run: gates
	// are re-evaluated, saturation is read and expiries are applied once
	// per tick.
	DefaultTick = time.Millisecond
	// DefaultBurst is how many items an open band may release per tick
	// (at DefaultTick, Burst thousand items per second per band). The
	// simulator's Tick × Burst sweep chose the smallest bursts (README,
	// Simulator section). A host whose per-band arrival rate exceeds
	// Burst/Tick must raise Burst.
	DefaultBurst = 2
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
