package flowcontrol

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/queue"
)

// This file is the llm-d parity discipline: the dispatch rules of llm-d-router's flow
// controller (its processor's dispatch cycle and its usage-limit policies), for hosts
// migrating from llm-d that want its behaviour unchanged, and for the simulator's
// baselines. It is not flowgate's Dispatcher: no bursts, no per-band duty counts, one
// item per cycle, a head-of-line halt at the first gated band.

// LLMDTick is the period of llm-d's dispatch ticker: a cycle runs on every enqueue and
// every millisecond.
const LLMDTick = time.Millisecond

// LLMDCleanupInterval is the period of llm-d's expiry sweep (ExpiryCleanupInterval):
// items past their TTL, or abandoned by their owner, are removed at most this late.
const LLMDCleanupInterval = time.Second

// LLMDUsageLimitPolicy is llm-d's usage-limit policy: once per dispatch cycle it gives
// every band a ceiling, and a band whose ceiling is at or below the pool's saturation
// halts the cycle (saturation >= ceiling). Band 0 is the highest priority. Ceilings are
// non-increasing by priority.
type LLMDUsageLimitPolicy interface {
	// ComputeLimit writes the ceiling of every band (len(ceilings) bands) for one cycle
	// at the given saturation. It is called exactly once per cycle and may advance
	// the policy's state (LLMDSoftReflective's duty-cycle counter).
	ComputeLimit(saturation float64, ceilings []float64)
	// Idle advances the policy's state exactly as n calls of ComputeLimit at this
	// saturation with this many bands would, without computing ceilings. It lets a
	// host on a virtual clock skip cycles on which nothing can be dispatched.
	Idle(saturation float64, bands int, n int64)
	// TopCeiling returns band 0's ceiling at this saturation. It must be what
	// ComputeLimit gives band 0 and must not depend on the policy's state.
	TopCeiling(saturation float64) float64
}

// LLMDStaticPolicy is llm-d's static-usage-limit-policy: one threshold for every band.
// A cycle halts when saturation >= threshold, whatever the band. Stateless.
type LLMDStaticPolicy struct{ threshold float64 }

// LLMDStatic returns llm-d's static usage-limit policy with the given threshold, which
// must be in (0, 1] (llm-d's default is 1.0); NewLLMDDispatcher refuses others.
func LLMDStatic(threshold float64) *LLMDStaticPolicy { return &LLMDStaticPolicy{threshold: threshold} }

// Threshold returns the policy's threshold.
func (p *LLMDStaticPolicy) Threshold() float64 { return p.threshold }

// ComputeLimit implements LLMDUsageLimitPolicy: every band's ceiling is the threshold.
func (p *LLMDStaticPolicy) ComputeLimit(_ float64, ceilings []float64) {
	for i := range ceilings {
		ceilings[i] = p.threshold
	}
}

// Idle implements LLMDUsageLimitPolicy; the policy has no state.
func (p *LLMDStaticPolicy) Idle(float64, int, int64) {}

// TopCeiling implements LLMDUsageLimitPolicy.
func (p *LLMDStaticPolicy) TopCeiling(float64) float64 { return p.threshold }

func (p *LLMDStaticPolicy) validate() error {
	if !(p.threshold > 0 && p.threshold <= 1) {
		return fmt.Errorf("%w: Policy: LLMDStatic threshold must be in (0, 1], got %v", ErrInvalidConfig, p.threshold)
	}
	return nil
}

// LLMDSoftReflectivePolicy is llm-d's soft-reflective-ceiling-policy, with its
// semantics (not flowgate's SoftReflective). For N bands and saturation s:
//
//   - band 0: ceiling 1.0, so at s >= 1 every band halts, band 0 included;
//   - band i >= 1: reflective = 1 − i·s/(N−1); s < reflective → 1.0 (open);
//     s >= 1 → 0.0 (closed); otherwise the duty cycle decides, 1.0 or 0.0.
//
// The duty cycle: period = max(1, round(s/(1−s+1e−9))) (s = 0.6 gives 1, 0.65 and 0.7
// give 2, 0.75 gives 3, 0.9 gives 9); one counter shared by all gated bands, so they
// open together, incremented once per cycle in which some band is in the duty-cycle
// regime (which needs 0.5 ≤ s < 1), before the test; the gated bands are open when
// counter % period == 0 (period 2: closed, open, closed, open; period 3: closed,
// closed, open). Cycles outside that regime leave the counter alone.
//
// NaN saturation is read as 1 and negative as 0 (Sanitize). Not safe for concurrent
// use (one dispatcher's cycles use it).
type LLMDSoftReflectivePolicy struct{ counter int64 }

// LLMDSoftReflective returns llm-d's soft-reflective ceiling policy. It has no
// parameters. Give each dispatcher its own: the counter is the policy's state.
func LLMDSoftReflective() *LLMDSoftReflectivePolicy { return &LLMDSoftReflectivePolicy{} }

// Counter returns the shared duty-cycle counter (the number of cycles spent in the
// duty-cycle regime so far).
func (p *LLMDSoftReflectivePolicy) Counter() int64 { return p.counter }

// LLMDPeriod is the duty-cycle period of llm-d's soft-reflective policy at saturation
// s: max(1, round(s/(1−s+1e−9))), with Go's math.Round (half away from zero).
func LLMDPeriod(s float64) int64 {
	return int64(math.Max(1, math.Round(s/(1.0-s+1e-9))))
}

// reflective is band i's reflective ceiling among n bands.
func reflective(i, n int, s float64) float64 { return 1.0 - float64(i)*s/float64(n-1) }

// duty reports whether some band i >= 1 of n is in the duty-cycle regime at s.
func duty(n int, s float64) bool {
	if n < 2 || s >= 1 {
		return false
	}
	// The reflective ceiling falls with i, so the last band is the first to reach it.
	return !(s < reflective(n-1, n, s))
}

// ComputeLimit implements LLMDUsageLimitPolicy.
func (p *LLMDSoftReflectivePolicy) ComputeLimit(saturation float64, ceilings []float64) {
	n := len(ceilings)
	if n == 0 {
		return
	}
	s := Sanitize(saturation)
	ceilings[0] = 1
	if n == 1 {
		return
	}
	open := false
	if duty(n, s) {
		p.counter++
		open = p.counter%LLMDPeriod(s) == 0
	}
	for i := 1; i < n; i++ {
		switch {
		case s < reflective(i, n, s):
			ceilings[i] = 1
		case s >= 1:
			ceilings[i] = 0
		case open:
			ceilings[i] = 1
		default:
			ceilings[i] = 0
		}
	}
}

// Idle implements LLMDUsageLimitPolicy.
func (p *LLMDSoftReflectivePolicy) Idle(saturation float64, bands int, n int64) {
	if n > 0 && duty(bands, Sanitize(saturation)) {
		p.counter += n
	}
}

// TopCeiling implements LLMDUsageLimitPolicy: band 0's ceiling is always 1.0.
func (p *LLMDSoftReflectivePolicy) TopCeiling(float64) float64 { return 1 }

// LLMDDispatcherConfig configures NewLLMDDispatcher.
type LLMDDispatcherConfig[T any] struct {
	// Bands configures the priority bands, band 0 (the highest priority) first,
	// 1..MaxBands entries, validated as for Config.Bands. Capacity is required
	// (llm-d's per-band default is 5,000 requests); MaxWait is the band's request
	// TTL, enforced by Sweep (llm-d's default TTL is 60 s; 0 means none); MaxBytes is
	// validated and handed back by BandConfigs, not counted. Required.
	Bands []BandConfig
	// Policy computes the ceilings. Nil means LLMDStatic(1.0).
	Policy LLMDUsageLimitPolicy
	// Source is read once per cycle. Required.
	Source SaturationSource
	// Dispatch receives the item a cycle releases, on the goroutine running the
	// cycle. Required.
	Dispatch func(band int, item T)
	// OnDrop, if set, is told of every item that ends without Dispatch: ErrExpired
	// (TTL) or ErrCancelled (Abandoned).
	OnDrop func(band int, item T, reason error)
	// Abandoned, if set, reports whether an item's owner gave up on it. Such an item
	// is dropped with ErrCancelled when a cycle reaches it (without using the cycle's
	// one dispatch) or at the next Sweep after Abandon(band).
	Abandoned func(item T) bool
	// Now is the clock for enqueue times. Nil means time.Now.
	Now func() time.Time
}

type llmdEntry[T any] struct {
	item T
	at   int64 // enqueue time, ns since the dispatcher's base
}

type llmdBand[T any] struct {
	ring      *queue.Ring[llmdEntry[T]]
	capacity  int64
	ttl       int64 // ns, 0 = none
	queued    atomic.Int64
	head      llmdEntry[T] // an item taken from the ring but still queued
	hasHead   bool
	abandoned atomic.Int64

	dispatched, expired, cancelled atomic.Uint64
	rejected                       atomic.Uint64
}

// LLMDDispatcher is llm-d-router's flow-control dispatch discipline over lock-free
// rings, generic in the item type. A dispatch cycle (Cycle):
//
//  1. reads the saturation once and asks the policy for every band's ceiling once;
//  2. visits the bands from band 0 down; at the first band whose ceiling is at or
//     below the saturation (saturation >= ceiling) it stops — checked before looking
//     at whether the band has items, so a gated band blocks every band below it;
//  3. a band with nothing to send is skipped; the first band with an item dispatches
//     its head (FIFO within a band) and the cycle ends: at most one item per cycle.
//
// llm-d runs a cycle after every enqueue and on a 1 ms ticker (LLMDTick), and sweeps
// expired items every second (LLMDCleanupInterval); Run does exactly that on a real
// clock, and a simulator calls Enqueue, Cycle and Sweep itself on virtual time.
//
// Concurrency: Enqueue and Abandon are safe from any goroutine; Cycle, Skip, Sweep
// and Run must not run concurrently with each other (one goroutine owns the cycles,
// as llm-d's processor does). Every accepted item ends exactly once: dispatched,
// expired or cancelled.
type LLMDDispatcher[T any] struct {
	bands     []llmdBand[T]
	ceilings  []float64
	policy    LLMDUsageLimitPolicy
	source    SaturationSource
	dispatch  func(int, T)
	onDrop    func(int, T, error)
	abandoned func(T) bool
	configs   []BandConfig
	now       func() time.Time
	base      time.Time
	notify    chan struct{}
	cycles    atomic.Uint64
}

// NewLLMDDispatcher validates cfg and returns a dispatcher. Errors wrap
// ErrInvalidConfig and name the field.
func NewLLMDDispatcher[T any](cfg LLMDDispatcherConfig[T]) (*LLMDDispatcher[T], error) {
	bands, err := CheckBands(cfg.Bands)
	if err != nil {
		return nil, err
	}
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: Source is nil", ErrInvalidConfig)
	}
	for i, b := range bands {
		// The model is llm-d's default, global-strict: one FIFO per
		// band. A fairness it does not model is refused, not ignored.
		if b.flowed() {
			return nil, fmt.Errorf("%w: Bands[%d].Fairness %q: the llm-d model has only %q (global-strict)", ErrInvalidConfig, i, b.Fairness, FairnessFCFS)
		}
	}
	if cfg.Policy == nil {
		cfg.Policy = LLMDStatic(1)
	}
	if v, ok := cfg.Policy.(interface{ validate() error }); ok {
		if err := v.validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Dispatch == nil {
		return nil, fmt.Errorf("%w: Dispatch is required", ErrInvalidConfig)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	d := &LLMDDispatcher[T]{
		bands:     make([]llmdBand[T], len(bands)),
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
		d.bands[i].ring = queue.NewRing[llmdEntry[T]](c.Capacity)
		d.bands[i].capacity = int64(c.Capacity)
		d.bands[i].ttl = int64(c.MaxWait)
	}
	return d, nil
}

// Bands returns the number of bands.
func (d *LLMDDispatcher[T]) Bands() int { return len(d.bands) }

// BandConfigs returns the validated band configs (names defaulted).
func (d *LLMDDispatcher[T]) BandConfigs() []BandConfig {
	return append([]BandConfig(nil), d.configs...)
}

// Enqueue appends item to band's queue. It does not run a cycle: llm-d runs one after
// every enqueue, so a host calls Cycle next (Run does, woken by Enqueue). Errors:
// ErrUnknownBand, ErrQueueFull.
func (d *LLMDDispatcher[T]) Enqueue(band int, item T) error {
	if uint(band) >= uint(len(d.bands)) {
		return fmt.Errorf("%w: %d of %d", ErrUnknownBand, band, len(d.bands))
	}
	b := &d.bands[band]
	if b.queued.Add(1) > b.capacity {
		b.queued.Add(-1)
		b.rejected.Add(1)
		return ErrQueueFull
	}
	if !b.ring.TryPush(llmdEntry[T]{item: item, at: int64(d.now().Sub(d.base))}) {
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

// Len returns the items queued in band (0 for an unknown band).
func (d *LLMDDispatcher[T]) Len(band int) int {
	if uint(band) >= uint(len(d.bands)) {
		return 0
	}
	return int(d.bands[band].queued.Load())
}

// front returns band b's head without removing it.
func (b *llmdBand[T]) front() (*llmdEntry[T], bool) {
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
func (b *llmdBand[T]) take() (llmdEntry[T], bool) {
	if b.hasHead {
		e := b.head
		var zero llmdEntry[T]
		b.head, b.hasHead = zero, false
		return e, true
	}
	return b.ring.TryPop()
}

func (d *LLMDDispatcher[T]) drop(i int, item T, reason error) {
	b := &d.bands[i]
	b.queued.Add(-1)
	if reason == ErrExpired {
		b.expired.Add(1)
	} else {
		b.cancelled.Add(1)
	}
	if d.onDrop != nil {
		d.onDrop(i, item, reason)
	}
}

// Cycle runs one dispatch cycle and reports whether it dispatched an item.
func (d *LLMDDispatcher[T]) Cycle() bool {
	d.cycles.Add(1)
	s := Sanitize(d.source.Saturation())
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
				d.drop(i, e.item, ErrCancelled)
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
func (d *LLMDDispatcher[T]) Halted() bool {
	s := Sanitize(d.source.Saturation())
	return s >= d.policy.TopCeiling(s)
}

// Empty reports whether every band is empty.
func (d *LLMDDispatcher[T]) Empty() bool {
	for i := range d.bands {
		if d.bands[i].queued.Load() > 0 {
			return false
		}
	}
	return true
}

// Skip stands for n cycles that dispatch nothing: it advances the policy as n cycles
// at the current saturation would (LLMDUsageLimitPolicy.Idle). It is exactly n calls
// of Cycle when the saturation is the same over them and every band is empty or
// Halted is true; a host on a virtual clock uses it to skip ticks on which nothing
// can change. Otherwise it is not equivalent (items would have been dispatched).
func (d *LLMDDispatcher[T]) Skip(n int64) {
	if n <= 0 {
		return
	}
	d.cycles.Add(uint64(n))
	d.policy.Idle(Sanitize(d.source.Saturation()), len(d.bands), n)
}

// Abandon tells the dispatcher that an item of band has been given up by its owner
// (Abandoned reports it); the next Sweep removes the band's abandoned items. Without
// an Abandoned hook, or for an unknown band, it does nothing.
func (d *LLMDDispatcher[T]) Abandon(band int) {
	if d.abandoned == nil || uint(band) >= uint(len(d.bands)) {
		return
	}
	d.bands[band].abandoned.Add(1)
}

// Sweep is llm-d's periodic cleanup: it drops the items that have waited longer than
// their band's MaxWait, the TTL (ErrExpired) and, in bands that had an Abandon since the last sweep, the
// abandoned items (ErrCancelled). Order within a band is kept.
func (d *LLMDDispatcher[T]) Sweep() {
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
			d.drop(i, it.item, ErrExpired)
		}
	}
}

// sweepAll passes over the whole band once, keeping the live items in order.
func (d *LLMDDispatcher[T]) sweepAll(i int, b *llmdBand[T], now int64) {
	n := b.queued.Load() // items pushed during the sweep stay behind
	var kept []llmdEntry[T]
	for ; n > 0; n-- {
		e, ok := b.take()
		if !ok {
			break
		}
		switch {
		case d.abandoned(e.item):
			d.drop(i, e.item, ErrCancelled)
		case b.ttl > 0 && now-e.at > b.ttl:
			d.drop(i, e.item, ErrExpired)
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

// LLMDStats is a snapshot of an LLMDDispatcher.
type LLMDStats struct {
	Cycles uint64 // cycles run (Skip's included)
	Bands  []LLMDBandStats
}

// LLMDBandStats is the part of LLMDStats for one band.
type LLMDBandStats struct {
	Queued     int    // accepted and not yet ended
	Dispatched uint64 // passed to Dispatch
	Expired    uint64 // dropped by the TTL sweep
	Cancelled  uint64 // dropped as abandoned
	Rejected   uint64 // Enqueue refused with ErrQueueFull
}

// Stats returns the counters. They are exact when no Enqueue or cycle is in progress.
func (d *LLMDDispatcher[T]) Stats() LLMDStats {
	st := LLMDStats{Cycles: d.cycles.Load(), Bands: make([]LLMDBandStats, len(d.bands))}
	for i := range d.bands {
		b := &d.bands[i]
		st.Bands[i] = LLMDBandStats{Queued: int(b.queued.Load()), Dispatched: b.dispatched.Load(),
			Expired: b.expired.Load(), Cancelled: b.cancelled.Load(), Rejected: b.rejected.Load()}
	}
	return st
}

// Run runs the discipline on the real clock until ctx ends: a cycle after an Enqueue
// (enqueues that arrive together share one wake-up) and on every LLMDTick (ticks missed by a slow loop are dropped, as Go's
// time.Ticker drops them), a Sweep every LLMDCleanupInterval. It returns ctx.Err().
// Items still queued when it returns stay queued.
func (d *LLMDDispatcher[T]) Run(ctx context.Context) error {
	tick := time.NewTicker(LLMDTick)
	defer tick.Stop()
	sweep := time.NewTicker(LLMDCleanupInterval)
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
