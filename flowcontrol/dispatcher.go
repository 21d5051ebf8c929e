package flowcontrol

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/queue"
)

// DispatcherConfig configures NewDispatcher. Zero values of optional fields
// take the documented defaults.
type DispatcherConfig[T any] struct {
	// Bands is the number of priority bands, 1..MaxBands. Band 0 is the
	// most critical, band Bands−1 the most sheddable. Required.
	Bands int
	// Capacity is the number of items each band holds, exactly (the ring
	// underneath is rounded up to a power of two, but Enqueue reports
	// ErrQueueFull at Capacity). 1..queue.MaxCapacity. Required unless
	// BandCapacity is set.
	Capacity int
	// BandCapacity, if not empty, gives each band its own capacity
	// (Bands values, each 1..queue.MaxCapacity) in place of Capacity,
	// which may then be 0.
	BandCapacity []int
	// Policy gates the bands. Nil means NewSoftReflective().
	Policy CeilingPolicy
	// Source is read, and its value passed through Sanitize, once per tick.
	// Required.
	Source SaturationSource
	// Dispatch receives every released item, on the goroutine running the
	// tick (Step, Poll or Run), in band order within a tick and FIFO within a
	// band. It must not call Step, Poll or Close (deadlock); it may call
	// Enqueue and Stats. Required.
	Dispatch func(band int, item T)
	// Burst is how many items an open band may release per tick (Poll
	// spends what the current tick left). Skipped items (expired,
	// cancelled) do not count. 0 means DefaultBurst.
	Burst int
	// Tick is the period of Run's clock. 0 means DefaultTick. Step-driven
	// users (simulators) may ignore it.
	Tick time.Duration
	// MaxWait bounds how long an item may wait before it is dropped with
	// ErrExpired: empty = no limit, one value = the limit of every band, or
	// one value per band (Bands values). 0 means no limit for that band.
	// Expiry is applied at the first tick at or after the deadline, open or
	// gated band alike.
	MaxWait []time.Duration
	// OnDrop, if set, is told of every item that is not dispatched, with
	// reason ErrExpired, ErrCancelled or ErrClosed. It runs on the tick's
	// goroutine (or Close's) under the same rules as Dispatch.
	OnDrop func(band int, item T, reason error)
	// Live, if set, is called exactly once for each item when the
	// dispatcher decides its fate: immediately before Dispatch, and before
	// OnDrop with ErrExpired or ErrClosed. Returning false ends the item as
	// cancelled instead (OnDrop with ErrCancelled, counted as cancelled)
	// without spending the band's burst. Asking before a drop too keeps
	// Stats in agreement with what the owner saw: an item its owner gave up
	// on is counted as cancelled even when the dispatcher reaches it by
	// expiry or Close. A Live that claims the item (a compare-and-swap on
	// its state) makes the choice between the dispatcher's outcome and the
	// owner's cancellation race free; this is how Controller uses it.
	Live func(item T) bool
	// Abandoned, if set, reports whether an item's owner has given up on
	// it, without side effects (it may be called many times per item, and
	// must agree with Live: an abandoned item's Live returns false). It
	// lets a band free the places of abandoned items before it reaches
	// them: after Abandon(band), the next tick (or Poll) removes every
	// abandoned item from that band, ending it with OnDrop(ErrCancelled).
	// Without it, an abandoned item keeps its place until the dispatcher
	// reaches it — which, in a hard-blocked band, may be a long time.
	Abandoned func(item T) bool
	// Now is the clock for enqueue times and expiry. Nil means time.Now.
	// Tests and simulators pass a virtual clock and call Step.
	Now func() time.Time
}

// entry is one queued item and its expiry deadline in nanoseconds since the
// dispatcher's base time (0 = none).
type entry[T any] struct {
	item T
	due  int64
}

// band is the per-band state. Fields under "tick" are touched only by the
// goroutine holding Dispatcher.mu; the atomics are written by the tick and
// read by Stats, or (queued) shared with producers.
type band[T any] struct {
	ring     *queue.Ring[entry[T]]
	capacity int64
	maxWait  int64 // ns, 0 = none
	queued   atomic.Int64

	// tick state
	held   held[T] // items out of the ring but still queued (see held)
	since  int     // ticks since the band last dispatched, saturating at MaxEvery
	budget int     // items the band may still release in the current tick

	// counters: written under mu with Store (single writer), read by Stats
	dispatched atomic.Uint64
	expired    atomic.Uint64
	cancelled  atomic.Uint64
	closed     atomic.Uint64
	rejected   atomic.Uint64 // ErrQueueFull, written by producers
	abandoned  atomic.Int64  // Abandon calls not yet reaped
	every      atomic.Int64
	ceiling    atomic.Uint64 // math.Float64bits

	_ [64]byte // keep neighbouring bands' hot words apart
}

// Dispatcher holds one lock-free ring per band and releases items through
// Dispatch, tick by tick, as the policy's gates allow.
//
// Concurrency: Enqueue is safe from any number of goroutines and never
// blocks. Ticks (Step, Poll, Run's ticks) are serialised by a mutex: exactly
// one goroutine runs a tick at a time, so calling Step while Run is going is
// safe but changes the tick rate. Close may be called from any goroutine
// but not from Dispatch or OnDrop; Stats from anywhere.
//
// Per band the dispatcher counts the ticks since the band last dispatched
// and opens it when the count reaches the gate's Every (not tick % Every):
// the gap between a band's dispatching ticks is therefore never longer than
// the largest Every seen in it, however the saturation moves. An open band
// with nothing to send stays open (its count is not reset), so the first
// item that arrives goes at once. Bands are gated independently.
type Dispatcher[T any] struct {
	bands    []band[T]
	policy   CeilingPolicy
	source   SaturationSource
	dispatch func(int, T)
	onDrop   func(int, T, error)
	live     func(T) bool
	gone     func(T) bool // DispatcherConfig.Abandoned
	now      func() time.Time
	base     time.Time
	burst    int
	tick     time.Duration
	timed    bool // some band has a MaxWait

	closed   atomic.Bool
	closedCh chan struct{}
	notify   chan struct{} // 1-buffered: Enqueue wakes Run
	running  atomic.Bool

	mu         sync.Mutex // serialises ticks and Close's drain
	ticks      atomic.Uint64
	saturation atomic.Uint64 // math.Float64bits of the last sanitised reading
}

// NewDispatcher validates cfg and returns a dispatcher. Errors wrap
// ErrInvalidConfig and name the field.
func NewDispatcher[T any](cfg DispatcherConfig[T]) (*Dispatcher[T], error) {
	if cfg.Bands < 1 || cfg.Bands > MaxBands {
		return nil, fmt.Errorf("%w: Bands must be in [1, %d], got %d", ErrInvalidConfig, MaxBands, cfg.Bands)
	}
	if len(cfg.BandCapacity) == 0 {
		if err := queue.CheckCapacity(cfg.Capacity); err != nil {
			return nil, fmt.Errorf("%w: Capacity: %w", ErrInvalidConfig, err)
		}
	} else {
		if len(cfg.BandCapacity) != cfg.Bands {
			return nil, fmt.Errorf("%w: BandCapacity must hold Bands (%d) values, got %d", ErrInvalidConfig, cfg.Bands, len(cfg.BandCapacity))
		}
		for i, c := range cfg.BandCapacity {
			if err := queue.CheckCapacity(c); err != nil {
				return nil, fmt.Errorf("%w: BandCapacity[%d]: %w", ErrInvalidConfig, i, err)
			}
		}
	}
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: Source is nil", ErrInvalidConfig)
	}
	if cfg.Dispatch == nil {
		return nil, fmt.Errorf("%w: Dispatch is nil", ErrInvalidConfig)
	}
	if cfg.Burst < 0 {
		return nil, fmt.Errorf("%w: Burst must be ≥ 0 (0 = default %d), got %d", ErrInvalidConfig, DefaultBurst, cfg.Burst)
	}
	if cfg.Tick < 0 {
		return nil, fmt.Errorf("%w: Tick must be ≥ 0 (0 = default %v), got %v", ErrInvalidConfig, DefaultTick, cfg.Tick)
	}
	if n := len(cfg.MaxWait); n > 1 && n != cfg.Bands {
		return nil, fmt.Errorf("%w: MaxWait must hold 0, 1 or Bands (%d) values, got %d", ErrInvalidConfig, cfg.Bands, n)
	}
	for i, w := range cfg.MaxWait {
		if w < 0 {
			return nil, fmt.Errorf("%w: MaxWait[%d] must be ≥ 0, got %v", ErrInvalidConfig, i, w)
		}
	}
	d := &Dispatcher[T]{
		bands:    make([]band[T], cfg.Bands),
		policy:   cfg.Policy,
		source:   cfg.Source,
		dispatch: cfg.Dispatch,
		onDrop:   cfg.OnDrop,
		live:     cfg.Live,
		gone:     cfg.Abandoned,
		now:      cfg.Now,
		burst:    cfg.Burst,
		tick:     cfg.Tick,
		closedCh: make(chan struct{}),
		notify:   make(chan struct{}, 1),
	}
	if d.policy == nil {
		d.policy = NewSoftReflective()
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.burst == 0 {
		d.burst = DefaultBurst
	}
	if d.tick == 0 {
		d.tick = DefaultTick
	}
	d.base = d.now()
	d.saturation.Store(0)
	for i := range d.bands {
		b := &d.bands[i]
		capacity := cfg.Capacity
		if len(cfg.BandCapacity) > 0 {
			capacity = cfg.BandCapacity[i]
		}
		b.ring = queue.NewRing[entry[T]](capacity)
		b.capacity = int64(capacity)
		switch len(cfg.MaxWait) {
		case 1:
			b.maxWait = int64(cfg.MaxWait[0])
		case cfg.Bands:
			b.maxWait = int64(cfg.MaxWait[i])
		}
		if b.maxWait > 0 {
			d.timed = true
		}
		b.every.Store(1)
		b.ceiling.Store(0x3ff0000000000000) // 1.0 until the first tick
	}
	return d, nil
}

// nowNanos is the clock in nanoseconds since the dispatcher's base time.
func (d *Dispatcher[T]) nowNanos() int64 { return int64(d.now().Sub(d.base)) }

// Bands returns the number of bands.
func (d *Dispatcher[T]) Bands() int { return len(d.bands) }

// Tick returns the tick length Run uses.
func (d *Dispatcher[T]) Tick() time.Duration { return d.tick }

// Enqueue appends item to band. It never blocks and, in steady state, never
// allocates. Errors: ErrUnknownBand, ErrQueueFull (the band holds Capacity
// items), ErrClosed. An accepted item ends in exactly one outcome: Dispatch,
// or OnDrop with ErrExpired, ErrCancelled or ErrClosed.
func (d *Dispatcher[T]) Enqueue(bandIdx int, item T) error {
	if uint(bandIdx) >= uint(len(d.bands)) {
		return ErrUnknownBand
	}
	b := &d.bands[bandIdx]
	// Reserve a slot first, then check closed. Close stores closed and
	// then waits for queued to drain to 0; with sequentially consistent
	// atomics either we see closed (and back out) or Close sees our
	// reservation (and waits for our push). Nothing slips past the drain.
	if b.queued.Add(1) > b.capacity {
		b.queued.Add(-1)
		if d.closed.Load() {
			return ErrClosed
		}
		b.rejected.Add(1)
		return ErrQueueFull
	}
	if d.closed.Load() {
		b.queued.Add(-1)
		return ErrClosed
	}
	e := entry[T]{item: item}
	if b.maxWait > 0 {
		e.due = d.nowNanos() + b.maxWait
	}
	if !b.ring.TryPush(e) {
		// Unreachable: queued ≤ Capacity ≤ ring capacity. Kept so a
		// broken invariant is an error, not a lost item.
		b.queued.Add(-1)
		b.rejected.Add(1)
		return ErrQueueFull
	}
	select {
	case d.notify <- struct{}{}:
	default:
	}
	return nil
}

// Step runs exactly one tick: it reads and sanitises the saturation once,
// asks the policy for every band's gate, advances each band's tick count,
// expires items whose deadline has passed (in gated bands too), and releases
// up to Burst live items from each open band. Step after Close does nothing.
func (d *Dispatcher[T]) Step() { d.run(true) }

// Poll releases what open bands may still send in the current tick (the
// burst the last Step left unspent), without advancing the tick: no new
// saturation reading, no tick counted. Run calls it when an item is
// enqueued, so an item on an open band does not wait for the next tick;
// simulators may call it to model that wake-up.
func (d *Dispatcher[T]) Poll() { d.run(false) }

// run is the single tick code path shared by Step, Poll and Run.
func (d *Dispatcher[T]) run(advance bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return
	}
	var now int64
	if d.timed {
		now = d.nowNanos()
	}
	n := len(d.bands)
	if advance {
		s := Sanitize(d.source.Saturation())
		d.saturation.Store(floatBits(s))
		d.ticks.Add(1)
		for i := range d.bands {
			b := &d.bands[i]
			g := d.policy.Gate(i, n, s)
			// A user policy may return anything: negative means
			// blocked, above MaxEvery is MaxEvery (since saturates
			// there, so a larger Every would never open).
			g.Every = min(max(g.Every, 0), MaxEvery)
			if b.since < MaxEvery {
				b.since++
			}
			if g.Every > 0 && b.since >= g.Every {
				b.budget = d.burst
			} else {
				b.budget = 0
			}
			b.every.Store(int64(g.Every))
			b.ceiling.Store(floatBits(g.Ceiling))
			if b.maxWait > 0 {
				d.expireHead(i, b, now)
			}
		}
	}
	for i := range d.bands {
		b := &d.bands[i]
		if b.abandoned.Load() > 0 {
			d.reap(i, b)
		}
		if b.budget > 0 {
			d.release(i, b, now)
		}
	}
}

// Abandon tells the dispatcher that an item queued on band has been given up
// by its owner (DispatcherConfig.Abandoned now reports it). The next tick or
// Poll removes the band's abandoned items, so their places are free for new
// items even while the band is gated; Run polls at once. Without an
// Abandoned hook, or for an unknown band, it does nothing. Safe from any
// goroutine; it never blocks.
func (d *Dispatcher[T]) Abandon(band int) {
	if d.gone == nil || uint(band) >= uint(len(d.bands)) {
		return
	}
	d.bands[band].abandoned.Add(1)
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// reap removes the abandoned items of band i, keeping the others in order.
// It moves the whole band into held (the ring holds only what was pushed
// after the last item moved, so order is kept) and costs O(queued) — paid
// only on ticks after an Abandon, never on the dispatch path. An Abandon
// that races with the sweep leaves its count for the next tick; a count
// whose item was already reached makes one sweep find nothing, harmlessly.
func (d *Dispatcher[T]) reap(i int, b *band[T]) {
	b.abandoned.Store(0)
	keep := func(e entry[T]) {
		if d.gone(e.item) {
			b.queued.Add(-1)
			d.drop(i, b, e.item, ErrCancelled)
			return
		}
		b.held.push(e)
	}
	for n := b.held.n; n > 0; n-- {
		e, _ := b.held.pop()
		keep(e)
	}
	for {
		e, ok := b.ring.TryPop()
		if !ok {
			break
		}
		keep(e)
	}
}

// expireHead drops the expired items at the front of a band, open or gated.
// Within a band every item has the same MaxWait, so deadlines follow the
// FIFO order and an item behind a live head is not yet due. (Concurrent
// producers may push in a slightly different order than they read the
// clock; such an item expires when the item in front of it does, at most
// that race window — nanoseconds — late, typically the same tick.) To look
// at the head the dispatcher moves it from the ring into b.held, where it
// stays queued.
func (d *Dispatcher[T]) expireHead(i int, b *band[T], now int64) {
	for {
		head, ok := b.front()
		if !ok || head.due == 0 || now < head.due {
			break
		}
		e, _ := b.take()
		item := e.item
		b.queued.Add(-1)
		d.drop(i, b, item, ErrExpired)
	}
}

// drop ends an item of band b that is not dispatched. Live is asked first
// (see DispatcherConfig.Live), so an item whose owner already gave up ends
// as cancelled whatever the dispatcher found. The band's counter is updated
// before OnDrop runs, so an owner woken by OnDrop already sees its outcome
// in Stats.
func (d *Dispatcher[T]) drop(i int, b *band[T], item T, reason error) {
	if d.live != nil && !d.live(item) {
		reason = ErrCancelled
	}
	switch reason {
	case ErrExpired:
		bump(&b.expired)
	case ErrCancelled:
		bump(&b.cancelled)
	default:
		bump(&b.closed)
	}
	if d.onDrop != nil {
		d.onDrop(i, item, reason)
	}
}

// bump adds one to a band counter. Only the goroutine holding Dispatcher.mu
// writes the counters, so a load and a store suffice (no read-modify-write);
// Stats reads them concurrently.
func bump(c *atomic.Uint64) { c.Store(c.Load() + 1) }

// release sends up to b.budget live items of band i. Expired and cancelled
// items are dropped without spending the budget.
func (d *Dispatcher[T]) release(i int, b *band[T], now int64) {
	for b.budget > 0 {
		e, ok := b.take()
		if !ok {
			break
		}
		b.queued.Add(-1)
		if e.due != 0 && now >= e.due {
			d.drop(i, b, e.item, ErrExpired)
			continue
		}
		if d.live != nil && !d.live(e.item) {
			bump(&b.cancelled)
			if d.onDrop != nil {
				d.onDrop(i, e.item, ErrCancelled)
			}
			continue
		}
		b.budget--
		b.since = 0
		// Count before Dispatch wakes the owner (see drop).
		bump(&b.dispatched)
		d.dispatch(i, e.item)
	}
}

// Run ticks at once and then every Tick on the real clock and, between
// ticks, calls Poll as soon as an item is enqueued, until ctx ends (it returns ctx.Err()) or the
// dispatcher is closed (it returns ErrClosed). Items still queued when ctx
// ends stay queued. Only one Run may be going at a time; a second returns
// ErrRunning.
func (d *Dispatcher[T]) Run(ctx context.Context) error {
	if d.closed.Load() {
		return ErrClosed
	}
	if !d.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer d.running.Store(false)
	t := time.NewTicker(d.tick)
	defer t.Stop()
	// Tick once at the start, so bands are open (or not) from the first
	// instant rather than a Tick later.
	d.Step()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.closedCh:
			return ErrClosed
		case <-t.C:
			d.Step()
		case <-d.notify:
			d.Poll()
		}
	}
}

// Close stops accepting items (Enqueue returns ErrClosed), ends every queued
// item with OnDrop(ErrClosed) — nothing is lost — and makes Run return. It
// waits for a tick in progress to finish. Idempotent.
func (d *Dispatcher[T]) Close() {
	if !d.closed.CompareAndSwap(false, true) {
		return
	}
	close(d.closedCh)
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.bands {
		b := &d.bands[i]
		for {
			e, ok := b.take()
			if !ok {
				// A producer that reserved a slot before seeing
				// closed is still pushing: wait for it (it never
				// blocks).
				if b.queued.Load() == 0 {
					break
				}
				runtime.Gosched()
				continue
			}
			b.queued.Add(-1)
			d.drop(i, b, e.item, ErrClosed)
		}
		b.budget = 0
	}
}

// Closed reports whether Close has been called.
func (d *Dispatcher[T]) Closed() bool { return d.closed.Load() }
