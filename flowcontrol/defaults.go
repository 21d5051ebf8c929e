package flowcontrol

import "time"

// Defaults applied by NewDispatcher and NewController to zero-valued fields.
// They are PROVISIONAL: the cluster simulator (examples/sim) is where Tick
// and Burst are tuned so that the rate cap of a throttled band,
// Burst/(Tick·Every), together with in-flight feedback actually protects
// critical traffic. Keep every default here, in one place.
const (
	// DefaultTick is the period of the dispatcher's clock in Run: gates
	// are re-evaluated, saturation is read and expiries are applied once
	// per tick.
	DefaultTick = time.Millisecond
	// DefaultBurst is how many items an open band may release per tick:
	// with DefaultTick, 32 000 items/s per band on every-tick bands.
	DefaultBurst = 32
	// DefaultStaticThreshold is the threshold of the static policy when
	// none is given (PolicyByName): 1.0, "effectively no flow control".
	DefaultStaticThreshold = 1.0
)

// Limits on configuration and policy output.
const (
	// MaxBands is the largest number of bands a dispatcher accepts.
	MaxBands = 1024
	// MaxEvery is the largest duty cycle a policy returns and the value at
	// which the dispatcher's per-band tick count saturates. At the default
	// tick it is about 12 days: for practical purposes, blocked.
	MaxEvery = 1 << 30
	// MaxSaturation is the value Sanitize clamps large inputs (+Inf
	// included) to: far above every ceiling, so it reads "overloaded".
	MaxSaturation = 1e6
)
