package flowcontrol

import (
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flowgate/flowgate/queue"
)

// BandConfig configures one priority band. Bands are given in order, band 0
// (the most critical) first.
type BandConfig struct {
	// Name labels the band in metrics, errors and HTTP answers. Empty
	// means "band<i>". Names are unique, at most MaxBandNameLen bytes of
	// printable UTF-8 (no control characters).
	Name string
	// Capacity is the number of waiters the band holds, exactly (the ring
	// underneath is rounded up to a power of two, but Enqueue reports
	// ErrQueueFull at Capacity): 1..queue.MaxCapacity. Required.
	Capacity int
	// MaxWait bounds how long an item may wait in the band before it is
	// dropped with ErrExpired, at the first tick at or after its deadline,
	// open or gated band alike. 0 means no limit. A deadline that would
	// overflow the clock saturates: the item effectively never expires.
	MaxWait time.Duration
	// MaxBytes is the band's budget of buffered request bytes, for hosts
	// that hold request bodies while they wait (flowhttp). 0 means no byte
	// limit. The dispatcher itself does not count bytes; it validates the
	// field and hands it back through Controller.Bands.
	MaxBytes int64
	// Fairness says how the band shares its releases between flows
	// (tenants; see EnqueueFlow and Controller.WaitRequest): FairnessFCFS
	// ("fcfs", the default "") keeps the band one logical FIFO, exactly
	// as without flows; FairnessRoundRobin releases one item per active
	// flow in turn; FairnessShare is start-time fair queuing on the
	// items' cost. See flows.go for the cost of each.
	Fairness string
	// FlowCapacity bounds the items one flow may hold in the band
	// (0 = no bound, else 1..Capacity): beyond it EnqueueFlow and
	// WaitRequest return ErrFlowFull (which wraps ErrQueueFull), so a
	// noisy flow is refused before it fills the band for everyone. It
	// needs a Fairness other than fcfs.
	FlowCapacity int
	// Ordering orders the items within a flow: OrderingFCFS ("fcfs", the
	// default "") or OrderingEDF ("edf": earliest deadline first, the
	// deadline being the earlier of the item's MaxWait deadline and its
	// own, EnqueueFlow's deadline or Request.Deadline). It needs a
	// Fairness other than fcfs.
	Ordering string
	// FlowIdle is how long a flow of the band with nothing queued is
	// remembered (its fair-share tags, its counters in Flows) before it
	// is forgotten: 0 means DefaultFlowIdle. It bounds the memory held
	// for flows that came once.
	FlowIdle time.Duration
}

// Names understood in configuration: fairness and ordering
// (BandConfig.Fairness, BandConfig.Ordering), the domains and the shape of
// llm-d's priority-holdback-policy (HoldbackConfig).
const (
	FairnessFCFS       = "fcfs"
	FairnessRoundRobin = "round-robin"
	FairnessShare      = "fair-share"
	OrderingFCFS       = "fcfs"
	OrderingEDF        = "edf"

	// HoldbackRank spaces the ceilings evenly by rank: band i of N gets
	// max − i·(max−min)/(N−1), whatever the bands' priority values.
	HoldbackRank = "rank"
	// HoldbackValue spaces them by priority value: a band at priority p
	// gets min + (p−pMin)/(pMax−pMin)·(max−min).
	HoldbackValue = "value"
	// HoldbackExplicit takes each band's ceiling from a priority → ceiling
	// map; a band whose priority is not in it gets 0 (always blocked).
	HoldbackExplicit = "explicit"
	// HoldbackLinear is the only interpolation shape llm-d defines.
	HoldbackLinear = "linear"
)

// Config holds what DispatcherConfig and ControllerConfig share. Zero values
// of optional fields take the documented defaults.
type Config struct {
	// Bands configures the priority bands, band 0 (the most critical)
	// first: 1..MaxBands entries. Required.
	Bands []BandConfig
	// Policy gates the bands. Nil means NewSoftReflective().
	Policy CeilingPolicy
	// Source is read, and its value passed through Sanitize, once per tick.
	// Required.
	Source SaturationSource
	// Burst is how many items a band releases per tick while it is paced:
	// gated by its duty cycle (Gate.Every > 1, on each tick that opens it)
	// or open and still draining a backlog built while it was gated (see
	// Dispatcher). Open bands without a backlog have no budget. Skipped
	// items (expired, cancelled) do not count. 0 means DefaultBurst.
	Burst int
	// Tick is the period of Run's clock: 0 means DefaultTick, otherwise at
	// least MinTick. Step-driven hosts (simulators) may ignore it.
	Tick time.Duration
	// Now is the clock for enqueue times and expiry. Nil means time.Now.
	// Tests and simulators pass a virtual clock and call Step.
	Now func() time.Time
	// BlockCritical lets the policy gate band 0 like every other band,
	// llm-d's meaning of a ceiling. Unset (the default), band 0 is open
	// whatever the policy says: a critical request is never held at the
	// gateway while a server could start it.
	BlockCritical bool
}

// noDeadline is the due time of an item that never expires. Computed
// deadlines saturate at it (see dueAt), so "none" is never the result of an
// overflow or of a deadline that happens to fall on the base time.
const noDeadline = math.MaxInt64

// dueAt returns now + wait in nanoseconds, saturating at noDeadline instead
// of overflowing; wait 0 means no deadline.
func dueAt(now, wait int64) int64 {
	if wait <= 0 || now > noDeadline-wait {
		return noDeadline
	}
	return now + wait
}

// check validates c and returns its bands with names defaulted. Errors wrap
// ErrInvalidConfig and name the field.
func (c *Config) check() ([]BandConfig, error) {
	bands, err := CheckBands(c.Bands)
	if err != nil {
		return nil, err
	}
	if c.Source == nil {
		return nil, fmt.Errorf("%w: Source is nil", ErrInvalidConfig)
	}
	if c.Burst < 0 {
		return nil, fmt.Errorf("%w: Burst must be ≥ 0 (0 = default %d), got %d", ErrInvalidConfig, DefaultBurst, c.Burst)
	}
	if c.Tick != 0 && c.Tick < MinTick {
		return nil, fmt.Errorf("%w: Tick must be 0 (default %v) or ≥ %v, got %v", ErrInvalidConfig, DefaultTick, MinTick, c.Tick)
	}
	return bands, nil
}

// CheckBands validates bands as NewDispatcher and NewController validate
// their Config.Bands (1..MaxBands entries; each band's name, Capacity, MaxWait,
// MaxBytes and fairness fields) and returns a copy with empty names
// defaulted to "band<i>". Errors wrap ErrInvalidConfig and name the field
// ("Bands[1].Capacity"). It is for hosts that build their own discipline
// over flowgate's band configuration, such as package flowcontrol/llmd.
func CheckBands(bands []BandConfig) ([]BandConfig, error) {
	n := len(bands)
	if n < 1 || n > MaxBands {
		return nil, fmt.Errorf("%w: Bands must hold 1..%d bands, got %d", ErrInvalidConfig, MaxBands, n)
	}
	out := make([]BandConfig, n)
	seen := make(map[string]int, n)
	for i, b := range bands {
		if b.Name == "" {
			b.Name = "band" + strconv.Itoa(i)
		}
		if err := checkName(b.Name); err != nil {
			return nil, fmt.Errorf("%w: Bands[%d].Name %q: %v", ErrInvalidConfig, i, b.Name, err)
		}
		if j, dup := seen[b.Name]; dup {
			return nil, fmt.Errorf("%w: Bands[%d].Name %q is also the name of Bands[%d]", ErrInvalidConfig, i, b.Name, j)
		}
		seen[b.Name] = i
		if err := queue.CheckCapacity(b.Capacity); err != nil {
			return nil, fmt.Errorf("%w: Bands[%d].Capacity: %w", ErrInvalidConfig, i, err)
		}
		if b.MaxWait < 0 {
			return nil, fmt.Errorf("%w: Bands[%d].MaxWait must be ≥ 0 (0 = no limit), got %v", ErrInvalidConfig, i, b.MaxWait)
		}
		if b.MaxBytes < 0 {
			return nil, fmt.Errorf("%w: Bands[%d].MaxBytes must be ≥ 0 (0 = no limit), got %d", ErrInvalidConfig, i, b.MaxBytes)
		}
		if err := checkFairness(i, &b); err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// checkName refuses names that would make metrics, logs or HTTP headers
// unreadable: invalid UTF-8, control characters, or overlong.
func checkName(name string) error {
	if len(name) > MaxBandNameLen {
		return fmt.Errorf("longer than %d bytes", MaxBandNameLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) || !unicode.IsPrint(r) && r != ' ' {
			return fmt.Errorf("contains the unprintable character %U", r)
		}
	}
	return nil
}

// checkFairness validates the fairness fields of band i. The defaults ("" is
// fcfs, FlowIdle 0 is DefaultFlowIdle) are resolved where they are used, not
// written back: BandConfigs returns these fields as given.
func checkFairness(i int, b *BandConfig) error {
	switch b.Fairness {
	case "", FairnessFCFS, FairnessRoundRobin, FairnessShare:
	default:
		return fmt.Errorf("%w: Bands[%d].Fairness %q: want %q, %q or %q", ErrInvalidConfig, i, b.Fairness, FairnessFCFS, FairnessRoundRobin, FairnessShare)
	}
	switch b.Ordering {
	case "", OrderingFCFS, OrderingEDF:
	default:
		return fmt.Errorf("%w: Bands[%d].Ordering %q: want %q or %q", ErrInvalidConfig, i, b.Ordering, OrderingFCFS, OrderingEDF)
	}
	if b.FlowCapacity < 0 || b.FlowCapacity > b.Capacity {
		return fmt.Errorf("%w: Bands[%d].FlowCapacity must be in 0..Capacity (%d; 0 = no bound), got %d", ErrInvalidConfig, i, b.Capacity, b.FlowCapacity)
	}
	if b.FlowIdle < 0 {
		return fmt.Errorf("%w: Bands[%d].FlowIdle must be ≥ 0 (0 = default %v), got %v", ErrInvalidConfig, i, DefaultFlowIdle, b.FlowIdle)
	}
	// An fcfs band is one ring and nothing else (today's path, at today's
	// cost): it has no per-flow state to bound or order.
	if !b.flowed() {
		if b.FlowCapacity != 0 {
			return fmt.Errorf("%w: Bands[%d].FlowCapacity needs Fairness %q or %q, not %q", ErrInvalidConfig, i, FairnessRoundRobin, FairnessShare, FairnessFCFS)
		}
		if b.Ordering == OrderingEDF {
			return fmt.Errorf("%w: Bands[%d].Ordering %q needs Fairness %q or %q, not %q", ErrInvalidConfig, i, b.Ordering, FairnessRoundRobin, FairnessShare, FairnessFCFS)
		}
	}
	return nil
}

// flowed reports whether the band keys its items by flow (a Fairness other
// than fcfs).
func (b *BandConfig) flowed() bool { return b.Fairness != "" && b.Fairness != FairnessFCFS }
