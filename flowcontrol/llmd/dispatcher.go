package llmd

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/queue"
)

// Tick is the period of llm-d's dispatch ticker: a cycle runs on every enqueue and
// every millisecond.
const Tick = time.Millisecond

// CleanupInterval is the period of llm-d's expiry sweep (ExpiryCleanupInterval):
// items past their TTL, or abandoned by their owner, are removed at most this late.
const CleanupInterval = time.Second

// DispatcherConfig configures NewDispatcher.
type DispatcherConfig[T any] struct {
	// Bands configures the priority bands, band 0 (the highest priority) first,
	// 1..flowcontrol.MaxBands entries, validated by flowcontrol.CheckBands as
	// flowgate's are; Fairness must be fcfs (llm-d's default, global-strict: one
	// FIFO per band), the only one modelled. Capacity is required (llm-d's
	// per-band default is 5,000 requests); MaxWait is the band's request TTL,
	// enforced by Sweep (llm-d's default TTL is 60 s; 0 means none); MaxBytes is
	// validated and handed back by BandConfigs, not counted. Required.
	Bands []flowcontrol.BandConfig
	// Policy computes the ceilings. Nil means NewStatic(DefaultThreshold).
	Policy UsageLimitPolicy
	// Source is read once per cycle. Required.
	Source flowcontrol.SaturationSource
	// Dispatch receives the item a cycle releases, on the goroutine running the
	// cycle. Required.
	Dispatch func(band int, item T)
	// OnDrop, if set, is told of every item that ends without Dispatch:
	// flowcontrol.ErrExpired (TTL) or flowcontrol.ErrCancelled (Abandoned).
	OnDrop func(band int, item T, reason error)
	// Abandoned, if set, reports whether an item's owner gave up on it. Such an
	// item is dropped with flowcontrol.ErrCancelled when a cycle reaches it
	// (without using the cycle's one dispatch) or at the next Sweep after
	// Abandon(band).
	Abandoned func(item T) bool
	// Now is the clock for enqueue times. Nil means time.Now.
	Now func() time.Time
}

// entry is a queued item.
type entry[T any] struct {
	item T
	at   int64 // enqueue time, ns since the dispatcher's base
}

// bandQueue is one band's FIFO and counters.
type bandQueue[T any] struct {
	ring      *queue.Ring[entry[T]]
	capacity  int64
	ttl       int64 // ns, 0 = none
	queued    atomic.Int64
	head      entry[T] // an item taken from the ring but still queued
	hasHead   bool
	abandoned atomic.Int64

	dispatched, expired, cancelled atomic.Uint64
	rejected                       atomic.Uint64
}

// Dispatcher is llm-d-router's flow-control dispatch discipline over lock-free
// rings, generic in the item type. It is not flowcontrol.Dispatcher: no bursts, no
// per-band duty counts, no pacing. A dispatch cycle (Cycle):
//
//  1. reads the saturation once and asks the policy for every band's ceiling once;
//  2. visits the bands from band 0 down; at the first band whose ceiling is at or
//     below the saturation (saturation >= ceiling) it stops — checked before looking
//     at whether the band has items, so a gated band blocks every band below it;
//  3. a band with nothing to send is skipped; the first band with an item dispatches
//     its head (FIFO within a band) and the cycle ends: at most one item per cycle.
//
// llm-d runs a cycle after every enqueue and on a 1 ms ticker (Tick), and sweeps
// expired items every second (CleanupInterval); Run does exactly that on a real
// clock, and a simulator calls Enqueue, Cycle and Sweep itself on virtual time.
//
// Concurrency: Enqueue and Abandon are safe from any goroutine; Cycle, Skip, Sweep
// and Run must not run concurrently with each other (one goroutine owns the cycles,
// as llm-d's processor does). Every accepted item ends exactly once: dispatched,
// expired or cancelled.
type Dispatcher[T any] struct {
	bands     []bandQueue[T]
	ceilings  []float64
	policy    UsageLimitPolicy
	source    flowcontrol.SaturationSource
	dispatch  func(int, T)
	onDrop    func(int, T, error)
	abandoned func(T) bool
	configs   []flowcontrol.BandConfig
	now       func() time.Time
	base      time.Time
	notify    chan struct{}
	cycles    atomic.Uint64
}

// NewDispatcher validates cfg and returns a dispatcher. Errors wrap
// flowcontrol.ErrInvalidConfig and name the field.
func NewDispatcher[T any](cfg DispatcherConfig[T]) (*Dispatcher[T], error) {
	bands, err := flowcontrol.CheckBands(cfg.Bands)
	if err != nil {
		return nil, err
	}
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: Source is nil", flowcontrol.ErrInvalidConfig)
	}
	for i, b := range bands {
		// The model is llm-d's default, global-strict: one FIFO per
		// band. A fairness it does not model is refused, not ignored.
		if b.Fairness != "" && b.Fairness != flowcontrol.FairnessFCFS {
			return nil, fmt.Errorf("%w: Bands[%d].Fairness %q: the llm-d model has only %q (global-strict)", flowcontrol.ErrInvalidConfig, i, b.Fairness, flowcontrol.FairnessFCFS)
		}
	}
	if cfg.Policy == nil {
		cfg.Policy = NewStatic(DefaultThreshold)
	}
	if v, ok := cfg.Policy.(interface{ validate() error }); ok {
		if err := v.validate(); err != nil {
			return nil, err
		}
	}
	if v, ok := cfg.Policy.(interface{ validateBands(int) error }); ok {
		if err := v.validateBands(len(bands)); err != nil {
			return nil, err
		}
	}
	if cfg.Dispatch == nil {
		return nil, fmt.Errorf("%w: Dispatch is required", flowcontrol.ErrInvalidConfig)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	d := &Dispatcher[T]{
		bands:     make([]bandQueue[T], len(bands)),
		ceilings:  make([]float64, len(bands)),
		configs:   bands,
		policy:    cfg.Policy,
		source:    cfg.Source,
		dispatch:  cfg.Dispatch,
		onDrop:    cfg.OnDrop,
		abandoned: cfg.Abandoned,
		now:       cfg.Now,
		notify:    make(chan struct{}, 1),
	}
	d.base = d.now()
	for i, c := range bands {
		d.bands[i].ring = queue.NewRing[entry[T]](c.Capacity)
		d.bands[i].capacity = int64(c.Capacity)
		d.bands[i].ttl = int64(c.MaxWait)
	}
	return d, nil
}

// Bands returns the number of bands.
func (d *Dispatcher[T]) Bands() int { return len(d.bands) }

// BandConfigs returns the validated band configs (names defaulted).
func (d *Dispatcher[T]) BandConfigs() []flowcontrol.BandConfig {
	return append([]flowcontrol.BandConfig(nil), d.configs...)
}

// Enqueue appends item to band's queue. It does not run a cycle: llm-d runs one after
// every enqueue, so a host calls Cycle next (Run does, woken by Enqueue). Errors:
// flowcontrol.ErrUnknownBand, flowcontrol.ErrQueueFull.
func (d *Dispatcher[T]) Enqueue(band int, item T) error {
	if uint(band) >= uint(len(d.bands)) {
		return fmt.Errorf("%w: %d of %d", flowcontrol.ErrUnknownBand, band, len(d.bands))
	}
	b := &d.bands[band]
	if b.queued.Add(1) > b.capacity {
		b.queued.Add(-1)
		b.rejected.Add(1)
		return flowcontrol.ErrQueueFull
	}
	if !b.ring.TryPush(entry[T]{item: item, at: int64(d.now().Sub(d.base))}) {
		b.queued.Add(-1)
		b.rejected.Add(1)
		return flowcontrol.ErrQueueFull
	}
	select {
	case d.notify <- struct{}{}:
	default:
	}
	return nil
}

// Len returns the items queued in band (0 for an unknown band).
func (d *Dispatcher[T]) Len(band int) int {
	if uint(band) >= uint(len(d.bands)) {
		return 0
	}
	return int(d.bands[band].queued.Load())
}

// front returns band b's head without removing it.
func (b *bandQueue[T]) front() (*entry[T], bool) {
	if !b.hasHead {
		e, ok := b.ring.TryPop()
		if !ok {
			return nil, false
		}
		b.head, b.hasHead = e, true
	}
	return &b.head, true
}

// take removes band b's head.
func (b *bandQueue[T]) take() (entry[T], bool) {
	if b.hasHead {
		e := b.head
		var zero entry[T]
		b.head, b.hasHead = zero, false
		return e, true
	}
	return b.ring.TryPop()
}

// drop ends item of band i without Dispatch.
func (d *Dispatcher[T]) drop(i int, item T, reason error) {
	b := &d.bands[i]
	b.queued.Add(-1)
	if reason == flowcontrol.ErrExpired {
		b.expired.Add(1)
	} else {
		b.cancelled.Add(1)
	}
	if d.onDrop != nil {
		d.onDrop(i, item, reason)
	}
}

// Cycle runs one dispatch cycle and reports whether it dispatched an item.
func (d *Dispatcher[T]) Cycle() bool {
	d.cycles.Add(1)
	s := flowcontrol.Sanitize(d.source.Saturation())
	d.policy.ComputeLimit(s, d.ceilings)
	for i := range d.bands {
		if s >= d.ceilings[i] {
			return false // head-of-line halt: no lower band is considered
		}
		b := &d.bands[i]
		for {
			e, ok := b.take()
			if !ok {
				break // nothing to send: the next band
			}
			if d.abandoned != nil && d.abandoned(e.item) {
				d.drop(i, e.item, flowcontrol.ErrCancelled)
				continue
			}
			b.queued.Add(-1)
			b.dispatched.Add(1)
			d.dispatch(i, e.item)
			return true
		}
	}
	return false
}

// Halted reports whether a cycle at the current saturation would halt at band 0
// (saturation >= band 0's ceiling), dispatching nothing whatever is queued.
func (d *Dispatcher[T]) Halted() bool {
	s := flowcontrol.Sanitize(d.source.Saturation())
	return s >= d.policy.TopCeiling(s)
}

// Empty reports whether every band is empty.
func (d *Dispatcher[T]) Empty() bool {
	for i := range d.bands {
		if d.bands[i].queued.Load() > 0 {
			return false
		}
	}
	return true
}

// Skip stands for n cycles that dispatch nothing: it advances the policy as n cycles
// at the current saturation would (UsageLimitPolicy.Idle). It is exactly n calls
// of Cycle when the saturation is the same over them and every band is empty or
// Halted is true; a host on a virtual clock uses it to skip ticks on which nothing
// can change. Otherwise it is not equivalent (items would have been dispatched).
func (d *Dispatcher[T]) Skip(n int64) {
	if n <= 0 {
		return
	}
	d.cycles.Add(uint64(n))
	d.policy.Idle(flowcontrol.Sanitize(d.source.Saturation()), len(d.bands), n)
}

// Abandon tells the dispatcher that an item of band has been given up by its owner
// (Abandoned reports it); the next Sweep removes the band's abandoned items. Without
// an Abandoned hook, or for an unknown band, it does nothing.
func (d *Dispatcher[T]) Abandon(band int) {
	if d.abandoned == nil || uint(band) >= uint(len(d.bands)) {
		return
	}
	d.bands[band].abandoned.Add(1)
}

// Sweep is llm-d's periodic cleanup: it drops the items that have waited longer than
// their band's MaxWait, the TTL (flowcontrol.ErrExpired) and, in bands that had an
// Abandon since the last sweep, the abandoned items (flowcontrol.ErrCancelled). Order
// within a band is kept.
func (d *Dispatcher[T]) Sweep() {
	now := int64(d.now().Sub(d.base))
	for i := range d.bands {
		b := &d.bands[i]
		if b.abandoned.Load() > 0 && d.abandoned != nil {
			b.abandoned.Store(0)
			d.sweepAll(i, b, now)
			continue
		}
		if b.ttl == 0 {
			continue
		}
		// FIFO by enqueue time: the expired items are at the front.
		for {
			e, ok := b.front()
			if !ok || now-e.at <= b.ttl {
				break
			}
			it, _ := b.take()
			d.drop(i, it.item, flowcontrol.ErrExpired)
		}
	}
}

// sweepAll passes over the whole band once, keeping the live items in order.
func (d *Dispatcher[T]) sweepAll(i int, b *bandQueue[T], now int64) {
	n := b.queued.Load() // items pushed during the sweep stay behind
	var kept []entry[T]
	for ; n > 0; n-- {
		e, ok := b.take()
		if !ok {
			break
		}
		switch {
		case d.abandoned(e.item):
			d.drop(i, e.item, flowcontrol.ErrCancelled)
		case b.ttl > 0 && now-e.at > b.ttl:
			d.drop(i, e.item, flowcontrol.ErrExpired)
		default:
			kept = append(kept, e)
		}
	}
	// The ring now holds only what arrived after the kept items; rebuild the order
	// kept + rest by cycling the rest behind the kept items.
	rest := b.ring.Len()
	// The band's count bounds the ring's content, so the pushes cannot fail.
	for _, e := range kept {
		b.ring.TryPush(e)
	}
	for ; rest > 0; rest-- {
		e, ok := b.ring.TryPop()
		if !ok {
			break
		}
		b.ring.TryPush(e)
	}
}

// Stats is a snapshot of a Dispatcher's counters.
type Stats struct {
	Cycles uint64      // cycles run (Skip's included)
	Bands  []BandStats // per band, band 0 first
}

// BandStats is the part of Stats for one band.
type BandStats struct {
	Queued     int    // accepted and not yet ended
	Dispatched uint64 // passed to Dispatch
	Expired    uint64 // dropped by the TTL sweep
	Cancelled  uint64 // dropped as abandoned
	Rejected   uint64 // Enqueue refused with flowcontrol.ErrQueueFull
}

// Stats returns the counters. They are exact when no Enqueue or cycle is in progress.
func (d *Dispatcher[T]) Stats() Stats {
	st := Stats{Cycles: d.cycles.Load(), Bands: make([]BandStats, len(d.bands))}
	for i := range d.bands {
		b := &d.bands[i]
		st.Bands[i] = BandStats{Queued: int(b.queued.Load()), Dispatched: b.dispatched.Load(),
			Expired: b.expired.Load(), Cancelled: b.cancelled.Load(), Rejected: b.rejected.Load()}
	}
	return st
}

// Run runs the discipline on the real clock until ctx ends: a cycle after an Enqueue
// (enqueues that arrive together share one wake-up) and on every Tick (ticks missed
// by a slow loop are dropped, as Go's time.Ticker drops them), a Sweep every
// CleanupInterval. It returns ctx.Err(). Items still queued when it returns stay
// queued.
func (d *Dispatcher[T]) Run(ctx context.Context) error {
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	sweep := time.NewTicker(CleanupInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.notify:
			// Enqueues that arrive together share one wake-up (one cycle); the
			// ticker serves the rest, one item per cycle.
			d.Cycle()
		case <-tick.C:
			d.Cycle()
		case <-sweep.C:
			d.Sweep()
		}
	}
}
