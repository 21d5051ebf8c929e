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
	// tick (Step, Poll or Run), in band order within a tick and FIFO within a
	// band. It must not call Step, Poll or Close (deadlock); it may call
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
	// the next tick (or Poll) sweeps the band, freeing the places of its
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
	since  int     // opportunities since the band last dispatched, saturating at MaxEvery
	budget int     // items the band may still release until the next opportunity
	gate   int     // the gate's Every at the last tick (-1, closed, before the first)

	// counters: written under mu with Store (single writer), read by Stats
	dispatched atomic.Uint64
	expired    atomic.Uint64
	cancelled  atomic.Uint64
	closed     atomic.Uint64
	// refusals, written by producers
	full       atomic.Uint64 // ErrQueueFull
	doorClosed atomic.Uint64 // ErrClosed before the queue
	abandoned  atomic.Int64  // Abandon calls not yet reaped
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

	// pacing (tick state, under mu, except completions)
	pacing         Pacing
	paced          bool
	readings       ReadingSource // Source, when it counts its readings and Pacing.Readings is set
	lastReading    uint64
	completions    atomic.Uint64
	lastCompletion uint64
	floorTicks     int64 // Pacing.Floor in ticks, 0 = none
	floorCount     int64 // ticks counted toward the floor

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
	d.pacing = cfg.Pacing
	d.paced = cfg.Pacing.enabled()
	if rs, ok := cfg.Source.(ReadingSource); ok && cfg.Pacing.Readings {
		d.readings = rs
		d.lastReading = rs.ReadingSeq()
	}
	if cfg.Pacing.Floor > 0 {
		d.floorTicks = int64((cfg.Pacing.Floor + d.tick - 1) / d.tick)
	}
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
	if d.timed || d.flowed {
		now = d.nowNanos()
	}
	n := len(d.bands)
	// ops is the number of dispatch opportunities since the last run:
	// a tick, or, with Pacing, the readings, completions and floor ticks
	// the pacing counts.
	ops := d.opportunities(advance)
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
			if b.gate == 1 && g.Every != 1 {
				// Gated now: what was left of the open band's
				// unlimited release is not carried over.
				b.budget = 0
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
		if ops > 0 {
			b.since = int(min(int64(b.since)+ops, MaxEvery))
		}
		switch {
		case b.gate == 1:
			// Open bands are work-conserving: no per-tick budget.
			b.budget = math.MaxInt
		case ops == 0 && !advance:
			// A Poll between opportunities spends what is left.
		case b.gate > 1 && b.since >= b.gate:
			// Open by its duty cycle: a fresh Burst at each
			// opportunity; between them (a Step with nothing to
			// count) what the last one left, or a Burst if the band
			// was empty when it opened.
			if ops > 0 || b.budget == 0 {
				b.budget = d.burst
			}
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
			continue
		}
		if b.abandoned.Load() > 0 {
			d.reap(i, b)
		}
		if b.budget > 0 {
			d.release(i, b, now)
		}
	}
}

// opportunities returns the dispatch opportunities since the last run and
// advances the pacing's counters: one per Step when the dispatcher is not
// paced; with Pacing, the new saturation readings and completions (on every
// run, so a completion opens a gated band at once) and one per Floor of
// ticks (on Step).
func (d *Dispatcher[T]) opportunities(advance bool) int64 {
	if !d.paced {
		if advance {
			return 1
		}
		return 0
	}
	var ops int64
	if d.readings != nil {
		seq := d.readings.ReadingSeq()
		ops += int64(seq - d.lastReading)
		d.lastReading = seq
	}
	if d.pacing.Completions {
		c := d.completions.Load()
		ops += int64(c - d.lastCompletion)
		d.lastCompletion = c
	}
	if advance && d.floorTicks > 0 {
		d.floorCount++
		if d.floorCount%d.floorTicks == 0 {
			ops++
		}
	}
	return max(ops, 0)
}

// Complete tells the dispatcher that a released item has finished (its
// request completed). With Pacing.Completions, each completion is a dispatch
// opportunity for gated bands; otherwise it does nothing. Controller calls
// it from done; a generic host calls it itself. Safe from any goroutine;
// it never blocks.
func (d *Dispatcher[T]) Complete() {
	if !d.pacing.Completions {
		return
	}
	d.completions.Add(1)
	d.wake()
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
	ops := k
	if d.paced {
		// Only the floor ticks among the k were opportunities; readings
		// and completions are counted from their sequences at the next
		// run, whenever they happened.
		ops = 0
		if d.floorTicks > 0 {
			ops = (d.floorCount+k)/d.floorTicks - d.floorCount/d.floorTicks
			d.floorCount += k
		}
	}
	for i := range d.bands {
		b := &d.bands[i]
		b.since = int(min(int64(b.since)+ops, MaxEvery))
		if b.gate != 1 {
			// After a tick on which it released nothing, a gated
			// band holds a fresh Burst if its duty cycle is open
			// and nothing otherwise (never a leftover): decide as
			// the last of the k ticks would have.
			b.budget = 0
			if b.gate > 1 && b.since >= b.gate {
				b.budget = d.burst
			}
		}
	}
}

// owed reports whether a made-up tick could release something: some band
// is gated by its duty cycle (Every > 1) and holds items. Open bands
// released everything at the tick just run (an item enqueued since has
// nudged Run, which polls it out as soon as the catch-up returns) and
// blocked ones release nothing, so for them, and for empty bands, a
// further tick at the same instant is what credit does.
func (d *Dispatcher[T]) owed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.bands {
		b := &d.bands[i]
		if b.gate > 1 && b.queued.Load() > 0 {
			return true
		}
	}
	return false
}

// Skip counts k ticks without running them, for hosts that drive Step on
// virtual time and skip the ticks on which nothing can change: tick counts,
// duty cycles and Pacing's floor advance exactly as k Steps would have
// advanced them, provided that on those ticks no band could release,
// expire or reap anything (every band empty or blocked, the saturation and
// so the gates unchanged). Run does the same when it wakes from idle.
func (d *Dispatcher[T]) Skip(k int64) { d.credit(k) }

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
// Poll removes the band's abandoned items, so their places are free for new
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
		d.recheck(i, b)
	}
}

// recheck, with Pacing.Recheck, re-reads the gate of an open band after a
// release: an open band drains its backlog only while it stays open, so a
// source that counts dispatches at once (the in-flight credit) closes it
// before the backlog floods the pool between two scrapes.
// It is split in two so that this part, the test on the hot path, inlines.
func (d *Dispatcher[T]) recheck(i int, b *band[T]) {
	if b.gate == 1 && d.pacing.Recheck && b.budget > 0 {
		d.regate(i, b)
	}
}

// regate is recheck's reading of the gate.
func (d *Dispatcher[T]) regate(i int, b *band[T]) {
	g := d.policy.Gate(i, len(d.bands), Sanitize(d.source.Saturation()))
	g.Every = min(max(g.Every, 0), MaxEvery)
	if g.Every != 1 {
		b.gate, b.budget = g.Every, 0
		b.every.Store(int64(g.Every))
		b.ceiling.Store(floatBits(g.Ceiling))
	}
}

// Run ticks at once and then every Tick on the real clock and, between
// ticks, calls Poll as soon as an item is enqueued, until ctx ends (it
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
// and a hand-off to Run's goroutine (at 5k req/s on an open band, one
// request in seven did, for a tenth of the throughput). On waking it credits
// the ticks it slept through (see Stats.Ticks) and runs the tick that is
// due, so tick counts, duty cycles and expiry are exactly what ticking
// through the idle stretch would have given.
//
// Late timers lose nothing: a timer that fires late (a busy process or
// host) runs the ticks it missed, up to CatchUp of them, so a gated band's
// rate does not depend on CPU contention.
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

// CatchUp bounds how late a tick Run still makes up. A timer that fires
// late (its goroutine waited for a P behind CPU-bound goroutines of the
// process, up to a preemption slice of 10 ms each, or for a core of a busy
// host) finds k grid points passed since the last tick it ran; Run then
// runs the due tick plus the missed ones, at most CatchUp of them (rounded
// up to whole ticks, at least one), back to back. So a gated band's rate,
// Burst/(Tick·Every), is what the gate asks for however busy the process
// is, instead of falling with the timer's lateness (a band at Every 3 on a
// 1 ms tick released 5–13/s instead of 333/s beside one spinning goroutine
// per P when late ticks were dropped).
//
// Why bounded: the missed ticks run at one instant, so what a gated band
// releases at once grows with the catch-up, up to Burst·CatchUp/(Tick·Every)
// (67 items at the defaults and Every 3). Each made-up tick is a full tick
// — it reads the saturation and asks the policy again, and Pacing.Recheck
// still closes an open band after each release — so a source that counts
// dispatches at once (the in-flight credit) closes the gate during the
// catch-up as it would have between punctual ticks; a scraped source does
// not move within it, but its readings were no fresher during the stall
// (the poller's goroutines starve with Run's). A stall longer than CatchUp
// (a stopped process, a host that took the cores away for longer) is an
// outage, not contention: its remaining grid points are dropped, as a
// time.Ticker drops ticks, and not counted in Stats.Ticks, so an outage
// does not end in a flood. With Pacing, ticks are not what open a gated
// band (readings and completions are counted whenever they came); only the
// Floor's ticks are made up. Step-driven hosts are unaffected.
//
// Why 200 ms: it is the lateness a busy host really produces. On the
// 2-core development machine at load 25, a 1 ms timer in a process with one
// spinning goroutine per P fired 33–56 ms apart at the median and up to
// 242 ms apart (five runs of 3 s); at load 23–26 the sheddable band's rate
// beside the hog (BenchmarkGatedRate) was 0.79–0.94 of nominal with a 50 ms
// bound, 0.93–0.99 with 100 ms and 0.996–1.0 with 200 ms (0.55–0.85,
// 0.84–1.0 and 0.99–1.0 with callers spinning on the open band). It also covers a container throttled by its
// CPU quota, which stalls for up to one CFS period (100 ms by default).
const CatchUp = 200 * time.Millisecond

// catchUpTicks is the number of missed grid points a late timer makes up
// at a given tick: CatchUp in whole ticks, rounded up, at least one.
func catchUpTicks(tick time.Duration) int64 {
	return max(1, int64((CatchUp+tick-1)/tick))
}

// fire handles the timer: it runs the due tick and, when the timer fired
// late, the grid points it missed, up to catchUpTicks of them (see
// CatchUp; the rest are skipped, as a time.Ticker drops ticks), and
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
		d.Poll()
		return 0, false
	}
	s.asleep = false
	defer d.awake.Store(true)
	tick := int64(d.tick)
	now := d.nowNanos()
	if k := (now - s.last) / tick; k > 0 {
		d.credit(k - 1)
		s.last += k * tick
		d.Step()
	} else {
		d.Poll()
	}
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

// Closed reports whether Close has been called.
func (d *Dispatcher[T]) Closed() bool { return d.closed.Load() }
