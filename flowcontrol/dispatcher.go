package flowcontrol

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/queue"
)

// DispatcherConfig configures NewDispatcher: the shared Config plus the
// callbacks through which the dispatcher hands items back.
type DispatcherConfig[T any] struct {
	Config
	// Dispatch receives every released item, on the goroutine running the
	// tick (Step, Flush or Run), in band order within a tick and FIFO within a
	// band. It must not call Step, Flush or Close (deadlock); it may call
	// Enqueue and Stats. Required.
	Dispatch func(band int, item T)
	// OnDrop, if set, is told of every accepted item that is not
	// dispatched, with reason ErrExpired, ErrCancelled or ErrClosed. It
	// runs on the tick's goroutine (or Close's) under the same rules as
	// Dispatch.
	OnDrop func(band int, item T, reason error)
	// Abandoned, if set, reports whether an item's owner has given up on
	// it. It is the dispatcher's one way to let abandoned items give their
	// place back: the dispatcher asks it before it decides an item's fate
	// (an abandoned item ends with OnDrop(ErrCancelled), is counted as
	// cancelled and never spends the band's burst, even when the
	// dispatcher reaches it by expiry or Close), and after Abandon(band)
	// the next tick (or Flush) sweeps the band, freeing the places of its
	// abandoned items even while it is gated. It must be cheap and free of
	// side effects (it may be called many times per item).
	Abandoned func(item T) bool
}

// entry is one queued item and its expiry deadline in nanoseconds since the
// dispatcher's base time (noDeadline = none).
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
	budget int     // items the band may still release until the next tick
	gate   int     // the effective Every at the last tick (-1, closed, before the first)
	// guarded is set at a tick (or a Flush: an arrival) that finds the
	// band gated or blocked with items queued, and cleared by a run that
	// leaves it empty: an open band
	// that is still guarded is draining a backlog built while it was gated,
	// and releases Burst per tick, re-reading its gate after each release,
	// instead of everything at once.
	guarded bool

	// counters: written under mu with Store (single writer), read by Stats
	dispatched atomic.Uint64
	expired    atomic.Uint64
	cancelled  atomic.Uint64
	closed     atomic.Uint64
	// refusals, written by producers
	full       atomic.Uint64 // ErrQueueFull
	doorClosed atomic.Uint64 // ErrClosed before the queue
	abandoned  atomic.Int64  // Abandon calls not yet reaped
	requeued   atomic.Uint64 // Requeue calls accepted (under mu)
	every      atomic.Int64
	ceiling    atomic.Uint64 // math.Float64bits

	// flows is the per-flow state of a band whose Fairness is not fcfs
	// (nil for fcfs bands, which use ring and held only). Such a band
	// takes its items from flows.ring, not ring. See flows.go.
	flows *flows[T]

	_ [64]byte // keep neighbouring bands' hot words apart
}

// Dispatcher holds one lock-free ring per band and releases items through
// Dispatch, tick by tick, as the policy's gates allow.
//
// Concurrency: Enqueue is safe from any number of goroutines and never
// blocks. Ticks (Step, Flush, Run's ticks) are serialised by a mutex: exactly
// one goroutine runs a tick at a time, so calling Step while Run is going is
// safe but changes the tick rate. Close may be called from any goroutine
// but not from Dispatch or OnDrop; Stats from anywhere.
//
// The discipline, per band and tick (the same for every policy):
//
//   - Duty cycle. The dispatcher counts the ticks since the band last
//     released and lets it release when the count reaches the gate's Every
//     (not tick % Every), Burst items at a time: the gap between a band's
//     releases is never longer than the largest Every seen in it, however
//     the saturation moves. Every 0 blocks the band.
//   - Open bands release on arrival. A band whose gate is open (Every 1)
//     and that holds no backlog has no budget: what arrives goes at once.
//   - Reopening is paced. A band that was gated or blocked with items
//     queued and opens before they are gone releases Burst per tick,
//     re-reading its gate after each release, until it is empty; then it
//     releases on arrival again.
//     Why: a scraped saturation lags the pool, so a backlog released in one
//     tick floods the servers before any reading shows it; paced, each tick
//     reads the saturation again (and a source that counts releases at
//     once, an in-flight credit, closes the gate as soon as they fill the
//     pool).
//   - Critical is never gated. Band 0 is open whatever the policy says, so a
//     critical item is released on arrival (or at the next Flush or tick).
//     Config.BlockCritical lets the policy gate band 0 like any other band
//     (llm-d's meaning, where band 0 halts at its ceiling too).
//
// Bands are gated independently.
type Dispatcher[T any] struct {
	bands    []band[T]
	configs  []BandConfig // validated, names defaulted
	policy   CeilingPolicy
	source   SaturationSource
	dispatch func(int, T)
	onDrop   func(int, T, error)
	// live is asked once per item when the dispatcher decides its fate;
	// false ends it as cancelled. gone is the side-effect-free check the
	// sweep after Abandon uses. For a generic host both come from
	// DispatcherConfig.Abandoned; Controller installs its claim protocol
	// (see newDispatcher).
	live func(T) bool
	gone func(T) bool
	now  func() time.Time
	base time.Time
	// burst and tick are the effective values (defaults applied).
	burst  int
	tick   time.Duration
	timed  bool // some band has a MaxWait (or edf deadlines)
	flowed bool // some band has flows: runs read the clock for idle flows

	closed   atomic.Bool
	closedCh chan struct{}
	notify   chan struct{} // 1-buffered: Enqueue and Abandon wake Run
	running  atomic.Bool
	awake    atomic.Bool // Run is ticking (not asleep): gates are at most a tick old
	// directed is set by every direct release and cleared by Run's tick:
	// a tick that finds the bands empty but directed set does not put Run
	// to sleep, because traffic is flowing through the fast path (which
	// needs Run awake) and merely never queues.
	directed atomic.Bool

	// blockCritical is Config.BlockCritical: band 0 obeys the policy like
	// every other band, without the critical floor.
	blockCritical bool

	mu         sync.Mutex // serialises ticks and Close's drain
	ticks      atomic.Uint64
	unknown    atomic.Uint64 // ErrUnknownBand refusals
	saturation atomic.Uint64 // math.Float64bits of the last sanitised reading
}

// NewDispatcher validates cfg and returns a dispatcher. Errors wrap
// ErrInvalidConfig and name the field.
func NewDispatcher[T any](cfg DispatcherConfig[T]) (*Dispatcher[T], error) {
	var live, gone func(T) bool
	if cfg.Abandoned != nil {
		gone = cfg.Abandoned
		live = func(item T) bool { return !gone(item) }
	}
	return newDispatcher(cfg, live, gone)
}

// newDispatcher is NewDispatcher with the liveness hooks given explicitly:
// Controller passes its claim (a compare-and-swap that decides, race free,
// between the dispatcher's outcome and the waiter's cancellation) as live.
func newDispatcher[T any](cfg DispatcherConfig[T], live, gone func(T) bool) (*Dispatcher[T], error) {
	configs, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if cfg.Dispatch == nil {
		return nil, fmt.Errorf("%w: Dispatch is nil", ErrInvalidConfig)
	}
	d := &Dispatcher[T]{
		bands:    make([]band[T], len(configs)),
		configs:  configs,
		policy:   cfg.Policy,
		source:   cfg.Source,
		dispatch: cfg.Dispatch,
		onDrop:   cfg.OnDrop,
		live:     live,
		gone:     gone,
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
	d.blockCritical = cfg.BlockCritical
	for i, bc := range configs {
		b := &d.bands[i]
		b.capacity = int64(bc.Capacity)
		b.maxWait = int64(bc.MaxWait)
		if b.maxWait > 0 {
			d.timed = true
		}
		if bc.flowed() {
			b.flows = newFlows[T](bc)
			d.flowed = true
			d.timed = d.timed || b.flows.timed
		} else {
			b.ring = queue.NewRing[entry[T]](bc.Capacity)
		}
		b.every.Store(1)
		b.gate = -1                         // closed until the first tick reads a gate
		b.ceiling.Store(0x3ff0000000000000) // 1.0 until the first tick
	}
	return d, nil
}

// nowNanos is the clock in nanoseconds since the dispatcher's base time.
func (d *Dispatcher[T]) nowNanos() int64 { return int64(d.now().Sub(d.base)) }

// Bands returns the number of bands.
func (d *Dispatcher[T]) Bands() int { return len(d.bands) }

// BandConfigs returns a copy of the validated band configurations, names
// defaulted.
func (d *Dispatcher[T]) BandConfigs() []BandConfig { return append([]BandConfig(nil), d.configs...) }

// Tick returns the tick length Run uses.
func (d *Dispatcher[T]) Tick() time.Duration { return d.tick }

// Enqueue appends item to band. It never blocks and, in steady state, never
// allocates. Errors: ErrUnknownBand, ErrQueueFull (the band holds Capacity
// items), ErrClosed. An accepted item ends in exactly one outcome: Dispatch,
// or OnDrop with ErrExpired, ErrCancelled or ErrClosed.
func (d *Dispatcher[T]) Enqueue(bandIdx int, item T) error {
	if uint(bandIdx) >= uint(len(d.bands)) {
		d.unknown.Add(1)
		return ErrUnknownBand
	}
	b := &d.bands[bandIdx]
	if b.flows != nil {
		_, err := d.enqueueFlow(b, DefaultFlow, 1, time.Time{}, item, false)
		return err
	}
	// Reserve a slot first, then check closed. Close stores closed and
	// then waits for queued to drain to 0; with sequentially consistent
	// atomics either we see closed (and back out) or Close sees our
	// reservation (and waits for our push). Nothing slips past the drain.
	if b.queued.Add(1) > b.capacity {
		b.queued.Add(-1)
		if d.closed.Load() {
			b.doorClosed.Add(1)
			return ErrClosed
		}
		b.full.Add(1)
		return ErrQueueFull
	}
	if d.closed.Load() {
		b.queued.Add(-1)
		b.doorClosed.Add(1)
		return ErrClosed
	}
	e := entry[T]{item: item, due: noDeadline}
	if b.maxWait > 0 {
		e.due = dueAt(d.nowNanos(), b.maxWait)
	}
	if !b.ring.TryPush(e) {
		// Unreachable: queued ≤ Capacity ≤ ring capacity. Kept so a
		// broken invariant is an error, not a lost item.
		b.queued.Add(-1)
		b.full.Add(1)
		return ErrQueueFull
	}
	d.wake()
	return nil
}

// wake nudges Run (a no-op when it already has a nudge pending).
func (d *Dispatcher[T]) wake() {
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// Step runs exactly one tick: it reads and sanitises the saturation once,
// asks the policy for every band's gate, advances each band's tick count,
// expires items whose deadline has passed (in gated bands too), and releases
// what each band may send (see Dispatcher). Step after Close does nothing.
func (d *Dispatcher[T]) Step() { d.run(true, true) }

// Flush releases what bands may still send in the current tick (everything
// queued on an open band, the burst a gated band has left), without
// advancing the tick: no new saturation reading, no tick counted. Run calls
// it when an item is enqueued, so an item on an open band does not wait for
// the next tick; simulators call it to model that wake-up.
func (d *Dispatcher[T]) Flush() { d.run(false, false) }

// gateOf is the policy's gate for band i at the sanitised saturation s, made
// safe: Every clamped to [0, MaxEvery] (a user policy may return anything)
// and, unless BlockCritical, band 0 open whatever the policy says.
func (d *Dispatcher[T]) gateOf(i int, s float64) Gate {
	g := d.policy.Gate(i, len(d.bands), s)
	g.Every = min(max(g.Every, 0), MaxEvery)
	if i == 0 && !d.blockCritical {
		g.Every = 1
	}
	return g
}

// run is the single tick code path shared by Step, Flush and Run. arm says
// whether the tick may arm the reopening guard of a gated band holding
// items: false for the tick a sleeping Run runs when it wakes, which stands
// for the grid tick before the arrival that woke it, when every band was
// empty.
func (d *Dispatcher[T]) run(advance, arm bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return
	}
	var now int64
	if d.timed || d.flowed {
		now = d.nowNanos()
	}
	if advance {
		s := Sanitize(d.source.Saturation())
		d.saturation.Store(floatBits(s))
		d.ticks.Add(1)
		for i := range d.bands {
			b := &d.bands[i]
			g := d.gateOf(i, s)
			if g.Every != 1 {
				// Gated or blocked with items queued: the backlog is
				// drained at Burst per tick when the band opens. (An
				// empty gated band arms nothing, so a sleeping Run,
				// which never ticks empty bands, agrees with a
				// ticking one.)
				if arm && b.queued.Load() > 0 {
					b.guarded = true
				}
				if b.gate == 1 {
					b.budget = 0 // the open band's release is not carried over
				}
			}
			b.gate = g.Every
			b.every.Store(int64(g.Every))
			b.ceiling.Store(floatBits(g.Ceiling))
			if b.flows != nil {
				d.drain(b, now)
				if b.flows.timed {
					d.expireFlows(i, b, now)
				}
				b.flows.forget(now)
			} else if b.maxWait > 0 {
				d.expireHead(i, b, now)
			}
		}
	}
	for i := range d.bands {
		b := &d.bands[i]
		if advance {
			b.since = min(b.since+1, MaxEvery)
		} else if b.gate != 1 && b.queued.Load() > 0 {
			// A Flush (an arrival, an Abandon) on a band the last tick
			// found gated arms it too: a backlog that builds up and
			// meets a reopening within one tick (a gate that opens at
			// the next reading, a tick that comes late) is paced like
			// one a tick saw.
			b.guarded = true
		}
		switch {
		case b.gate == 1 && !b.guarded:
			// Open bands are work-conserving: no per-tick budget.
			b.budget = math.MaxInt
		case !advance:
			// A Flush between ticks spends what is left.
		case b.gate >= 1 && b.since >= b.gate:
			// Open by its duty cycle, or open and draining a
			// backlog: a fresh Burst this tick.
			b.budget = d.burst
		default:
			b.budget = 0
		}
		if b.flows != nil {
			d.drain(b, now)
			if b.abandoned.Load() > 0 {
				d.reapFlows(i, b, now)
			}
			if b.budget > 0 {
				d.releaseFlows(i, b, now)
			}
		} else {
			if b.abandoned.Load() > 0 {
				d.reap(i, b)
			}
			if b.budget > 0 {
				d.release(i, b, now)
			}
		}
		if b.guarded && b.queued.Load() == 0 {
			b.guarded = false // caught up: an open band releases on arrival again
		}
	}
}

// credit counts k ticks on which nothing was queued, without running them:
// on such a tick continuous ticking would only read the saturation, count
// the tick and advance every band's tick count (no band has anything to
// expire, reap or release), so crediting them leaves tick counts and duty
// cycles exactly where ticking through would have. Run uses it after
// sleeping through an idle stretch.
func (d *Dispatcher[T]) credit(k int64) {
	if k <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ticks.Add(uint64(k))
	for i := range d.bands {
		b := &d.bands[i]
		b.since = int(min(int64(b.since)+k, MaxEvery))
		if b.gate != 1 || b.guarded {
			// After a tick on which it released nothing, a paced
			// band holds a fresh Burst if its duty cycle is open
			// and nothing otherwise (never a leftover): decide as
			// the last of the k ticks would have.
			b.budget = 0
			if b.gate >= 1 && b.since >= b.gate {
				b.budget = d.burst
			}
		}
	}
}

// owed reports whether a made-up tick could release something: some band
// is paced (gated by its duty cycle, or open and draining a backlog) and
// holds items. Unguarded open bands released everything at the tick just
// run (an item enqueued since has nudged Run, which flushes it as soon as
// the catch-up returns) and blocked ones release nothing, so for them, and
// for empty bands, a further tick at the same instant is what credit does.
func (d *Dispatcher[T]) owed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.bands {
		b := &d.bands[i]
		if (b.gate > 1 || b.gate == 1 && b.guarded) && b.queued.Load() > 0 {
			return true
		}
	}
	return false
}

// empty reports whether no band holds anything, nor owes a sweep.
func (d *Dispatcher[T]) empty() bool {
	for i := range d.bands {
		b := &d.bands[i]
		if b.queued.Load() != 0 || b.abandoned.Load() != 0 {
			return false
		}
	}
	return true
}

// Abandon tells the dispatcher that an item queued on band has been given up
// by its owner (DispatcherConfig.Abandoned now reports it). The next tick or
// Flush removes the band's abandoned items, so their places are free for new
// items even while the band is gated; Run polls at once. Without an
// Abandoned hook, or for an unknown band, it does nothing. Safe from any
// goroutine; it never blocks.
func (d *Dispatcher[T]) Abandon(band int) {
	if d.gone == nil || uint(band) >= uint(len(d.bands)) {
		return
	}
	d.bands[band].abandoned.Add(1)
	d.wake()
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
		if !ok || now < head.due {
			break
		}
		e, _ := b.take()
		b.queued.Add(-1)
		d.drop(i, b, e.item, ErrExpired)
	}
}

// drop ends an item of band b that is not dispatched. Live is asked first,
// so an item whose owner already gave up ends as cancelled whatever the
// dispatcher found (Stats then agrees with what the owner saw). The band's
// counter is updated before OnDrop runs, so an owner woken by OnDrop already
// sees its outcome in Stats.
func (d *Dispatcher[T]) drop(i int, b *band[T], item T, reason error) {
	if reason != ErrCancelled && d.live != nil && !d.live(item) {
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
		if now >= e.due {
			d.drop(i, b, e.item, ErrExpired)
			continue
		}
		if d.live != nil && !d.live(e.item) {
			d.drop(i, b, e.item, ErrCancelled)
			continue
		}
		b.budget--
		b.since = 0
		// Count before Dispatch wakes the owner (see drop).
		bump(&b.dispatched)
		d.dispatch(i, e.item)
		if b.gate == 1 && b.guarded && b.budget > 0 {
			d.regate(i, b)
		}
	}
}

// regate re-reads the gate of a band draining a backlog after one of its
// releases (with a Burst above 1): a source that counts releases at once
// (an in-flight credit) closes the band before the rest of the tick's
// Burst goes, as a fresh tick would have.
func (d *Dispatcher[T]) regate(i int, b *band[T]) {
	g := d.gateOf(i, Sanitize(d.source.Saturation()))
	if g.Every != 1 {
		b.gate, b.budget = g.Every, 0
		b.every.Store(int64(g.Every))
		b.ceiling.Store(floatBits(g.Ceiling))
	}
}

// Run ticks at once and then every Tick on the real clock and, between
// ticks, calls Flush as soon as an item is enqueued, until ctx ends (it
// returns ctx.Err()) or the dispatcher is closed (it returns ErrClosed).
// Items still queued when ctx ends stay queued. Only one Run may be going at
// a time; a second returns ErrRunning.
//
// Idle costs nothing: when a tick finds every band empty and nothing was
// released on the Controller's fast path (open band, nothing queued) since
// the previous tick, Run stops its timer and sleeps until the next Enqueue
// (or Abandon). Traffic that only ever takes the fast path keeps Run
// ticking: the fast path needs a gate at most a tick old, and a Run that
// slept between requests would send the next arrivals through the queue
// and a hand-off to Run's goroutine, at a fraction of the throughput. On
// waking it credits
// the ticks it slept through (see Stats.Ticks) and runs the tick that is
// due, so tick counts, duty cycles and expiry are exactly what ticking
// through the idle stretch would have given.
//
// Late timers lose nothing: a timer that fires late (a busy process or
// host) runs the ticks it missed, up to a bound (200 ms of ticks), so a
// gated band's rate does not depend on CPU contention.
func (d *Dispatcher[T]) Run(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	return d.loop(ctx)
}

// begin marks the dispatcher as running, or says why it cannot run.
func (d *Dispatcher[T]) begin() error {
	if d.closed.Load() {
		return ErrClosed
	}
	if !d.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	return nil
}

// loop is Run after begin; it clears the running mark when it returns.
func (d *Dispatcher[T]) loop(ctx context.Context) error {
	defer d.running.Store(false)
	defer d.awake.Store(false)
	var s schedule[T]
	t := time.NewTimer(s.start(d))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.closedCh:
			return ErrClosed
		case <-t.C:
			if wait, ok := s.fire(); ok {
				t.Reset(wait)
			}
		case <-d.notify:
			if wait, ok := s.nudge(); ok {
				t.Reset(wait)
			}
		}
	}
}

// schedule is Run's clock: ticks fall on a grid of Tick from Run's start,
// the timer is stopped while the dispatcher is idle, and a wake-up credits
// the grid points slept through. It is separate from Run so that tests can
// drive it on a fake clock.
type schedule[T any] struct {
	d      *Dispatcher[T]
	last   int64 // grid point of the last tick run, ns since d.base
	asleep bool
}

// start runs the first tick (so bands are open, or not, from the first
// instant rather than a Tick later) and returns the wait until the next.
func (s *schedule[T]) start(d *Dispatcher[T]) time.Duration {
	s.d = d
	s.last = d.nowNanos()
	d.Step()
	d.awake.Store(true)
	return d.tick
}

// catchUp bounds how late a tick Run still makes up. A timer that fires
// late (a busy process or host, a container throttled by its CPU quota)
// finds k grid points passed since the last tick it ran; Run then runs the
// due tick plus the missed ones, at most catchUp of them (in whole ticks, at
// least one), back to back, so a gated band's rate, Burst/(Tick·Every), does
// not fall with the timer's lateness.
//
// Why bounded: the missed ticks run at one instant, so what a gated band
// releases at once grows with the catch-up. Each made-up tick is a full tick
// (it reads the saturation and asks the policy again), so a source that
// counts releases at once closes the gate during the catch-up as between
// punctual ticks. A longer stall is an outage, not contention: its remaining
// grid points are dropped, as a time.Ticker drops ticks, so an outage does
// not end in a flood. 200 ms covers a busy host's timer lateness and one CFS
// period (BenchmarkGatedRate measures it). Step-driven hosts are unaffected.
const catchUp = 200 * time.Millisecond

// catchUpTicks is the number of missed grid points a late timer makes up
// at a given tick: catchUp in whole ticks, rounded up, at least one.
func catchUpTicks(tick time.Duration) int64 {
	return max(1, int64((catchUp+tick-1)/tick))
}

// fire handles the timer: it runs the due tick and, when the timer fired
// late, the grid points it missed, up to catchUpTicks of them (see
// catchUp; the rest are skipped, as a time.Ticker drops ticks), and
// returns the wait until the next one, or false to sleep because every
// band is empty.
func (s *schedule[T]) fire() (time.Duration, bool) {
	d := s.d
	tick := int64(d.tick)
	now := d.nowNanos()
	k := max(1, (now-s.last)/tick) // grid points passed: 1 on time
	s.last += k * tick
	n := min(k, 1+catchUpTicks(d.tick))
	for i := int64(1); ; i++ {
		d.Step()
		if i == n {
			break
		}
		if !d.owed() {
			// No gated band holds anything: the remaining made-up
			// ticks could only count themselves and advance tick
			// counts (the first one expired what was due at now),
			// so they are credited at once rather than run, and a
			// busy open band's fast path does not lose the tick
			// lock to a catch-up that cannot release anything.
			d.credit(n - i)
			break
		}
	}
	// Swap first: a direct release racing with the check keeps Run awake
	// for one more tick rather than being missed.
	if !d.directed.Swap(false) && d.empty() {
		s.asleep = true
		d.awake.Store(false)
		return 0, false
	}
	return time.Duration(s.last + tick - now), true
}

// nudge handles an Enqueue or Abandon. Awake, it polls (the current tick's
// unspent burst). Asleep, it credits the grid points slept through but the
// last, runs that one as a real tick, and returns the wait for the timer to
// restart; with no grid point passed yet it polls, as ticking would have.
func (s *schedule[T]) nudge() (time.Duration, bool) {
	d := s.d
	if !s.asleep {
		d.Flush()
		return 0, false
	}
	s.asleep = false
	defer d.awake.Store(true)
	tick := int64(d.tick)
	now := d.nowNanos()
	if k := (now - s.last) / tick; k > 0 {
		d.credit(k - 1)
		s.last += k * tick
		d.run(true, false) // the grid tick, before the arrival: arms nothing
	}
	// The arrival's own Flush, as a ticking Run's: it releases on an open
	// band and arms a gated one that now holds items.
	d.Flush()
	return time.Duration(s.last + tick - now), true
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
		if b.flows != nil {
			for {
				d.closeFlows(i, b)
				if b.queued.Load() == 0 {
					break
				}
				runtime.Gosched() // a producer is still pushing (see below)
			}
			b.budget = 0
			continue
		}
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

// direct releases one item of band at once, in the caller's goroutine,
// without queueing it: the Controller's fast path for an open band. It does
// so only when Run is ticking (so the band's gate is at most a tick old; an
// asleep Run has not read the saturation since it went to sleep), the band's
// gate is open and nothing is queued in it (so FIFO order holds), and only if
// the tick lock is free: a tick in progress sends the caller through the
// queue instead. The release is counted as a dispatch like any other.
func (d *Dispatcher[T]) direct(bandIdx int) bool {
	b := &d.bands[bandIdx]
	// A flow band always goes through its queue: its fairness state
	// (turns, virtual times) is the tick's to keep.
	if b.flows != nil || !d.awake.Load() || b.queued.Load() != 0 || !d.mu.TryLock() {
		return false
	}
	defer d.mu.Unlock()
	if d.closed.Load() || b.gate != 1 || b.queued.Load() != 0 {
		return false
	}
	b.since = 0
	bump(&b.dispatched)
	if !d.directed.Load() {
		d.directed.Store(true) // once per tick, not a shared write per release
	}
	return true
}

// Held returns the most critical band whose gate at the last tick kept
// back items it still holds, or -1 if none: the band an Evictor gives way
// to at the gateway. Safe from any goroutine.
func (d *Dispatcher[T]) Held() int {
	for i := range d.bands {
		b := &d.bands[i]
		if b.every.Load() != 1 && b.queued.Load() > 0 {
			return i
		}
	}
	return -1
}

// Closed reports whether Close has been called.
func (d *Dispatcher[T]) Closed() bool { return d.closed.Load() }
