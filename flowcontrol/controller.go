package flowcontrol

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// InFlightCounter is told when a request is released (Inc) and when its
// holder calls done (Dec). saturation.InFlight satisfies it.
type InFlightCounter interface {
	Inc()
	Dec()
}

// ControllerConfig configures NewController. The fields mean what they mean
// in DispatcherConfig.
type ControllerConfig struct {
	Bands        int              // required, 1..MaxBands
	Capacity     int              // waiters per band, required unless BandCapacity is set
	BandCapacity []int            // optional: one capacity per band, in place of Capacity
	Policy       CeilingPolicy    // nil = NewSoftReflective()
	Source       SaturationSource // required
	Burst        int              // 0 = DefaultBurst
	Tick         time.Duration    // 0 = DefaultTick
	MaxWait      []time.Duration  // empty, one for all bands, or one per band
	Now          func() time.Time // nil = time.Now
	// InFlight, if set, is incremented when a Wait is released and
	// decremented when its done is called (once), next to the count that
	// InFlight() reports.
	InFlight InFlightCounter
}

// Ticket states. A ticket leaves stateWaiting exactly once, by a
// compare-and-swap: the dispatcher's Live hook sets claimed, the waiter's
// side sets cancelled. Whoever wins decides who reports the outcome. After a
// claim the dispatcher stores the outcome (dispatched, expired or closed)
// with a plain store before it signals ch; the channel send orders that
// store before the waiter's load.
const (
	stateWaiting uint32 = iota
	stateClaimed
	stateDispatched
	stateExpired
	stateClosed
	stateCancelled
)

// ticket is one Wait's place in the queue. Tickets are pooled. Ownership:
// the waiter owns a ticket until it is enqueued; then the dispatcher holds it
// too. If the dispatcher wins the state CAS it signals ch and never touches
// the ticket again: the waiter owns it and returns it to the pool (after
// done, for a dispatched ticket, because done reads it). If the waiter wins
// (cancelled) it forgets the ticket and the dispatcher returns it to the
// pool when it pops it. So a ticket is never reused while the other side may
// still touch it.
type ticket struct {
	state atomic.Uint32
	ch    chan struct{} // 1-buffered; one send per dispatcher-side win
	gen   atomic.Uint64 // the generation whose done has not fired yet; 0 = none
	uses  uint64        // owner-only: generations handed out
	c     *Controller
}

// done releases one in-flight slot if gen is still the ticket's pending
// generation, so calling a done twice (or after the ticket was reused) has
// no effect.
func (t *ticket) done(gen uint64) {
	if t.gen.CompareAndSwap(gen, 0) {
		c := t.c
		c.inflight.Add(-1)
		if c.hook != nil {
			c.hook.Dec()
		}
		c.pool.Put(t)
	}
}

// Controller is the blocking facade over a Dispatcher that a proxy handler
// uses:
//
//	done, err := c.Wait(ctx, band)
//	if err != nil { ... }
//	defer done()
//
// Start it with Run (or drive it with Step) and stop it with Close.
type Controller struct {
	d        *Dispatcher[*ticket]
	inflight atomic.Int64
	hook     InFlightCounter
	pool     sync.Pool
}

// noop is the done returned with an error: there is nothing to release.
func noop() {}

// NewController validates cfg and returns a controller. Errors wrap
// ErrInvalidConfig and name the field.
func NewController(cfg ControllerConfig) (*Controller, error) {
	c := &Controller{hook: cfg.InFlight}
	c.pool.New = func() any { return &ticket{ch: make(chan struct{}, 1), c: c} }
	d, err := NewDispatcher(DispatcherConfig[*ticket]{
		Bands:        cfg.Bands,
		Capacity:     cfg.Capacity,
		BandCapacity: cfg.BandCapacity,
		Policy:       cfg.Policy,
		Source:       cfg.Source,
		Burst:        cfg.Burst,
		Tick:         cfg.Tick,
		MaxWait:      cfg.MaxWait,
		Now:          cfg.Now,
		Dispatch:     c.onDispatch,
		OnDrop:       c.onDrop,
		Live:         c.claim,
		Abandoned: func(t *ticket) bool {
			return t.state.Load() == stateCancelled
		},
	})
	if err != nil {
		return nil, err
	}
	c.d = d
	return c, nil
}

// claim is the dispatcher's Live hook, called once per ticket before the
// dispatcher decides its outcome (dispatch, expiry or close): it wins the
// ticket unless the waiter has already cancelled. A lost claim makes the
// dispatcher count the ticket as cancelled, so Stats agrees with Wait.
func (c *Controller) claim(t *ticket) bool {
	return t.state.CompareAndSwap(stateWaiting, stateClaimed)
}

func (c *Controller) onDispatch(_ int, t *ticket) {
	// Count the request in flight before waking its waiter, so a
	// saturation source reading the counter sees it at once.
	c.inflight.Add(1)
	if c.hook != nil {
		c.hook.Inc()
	}
	t.state.Store(stateDispatched)
	t.ch <- struct{}{}
}

func (c *Controller) onDrop(_ int, t *ticket, reason error) {
	switch reason {
	case ErrCancelled:
		// The claim failed: the waiter cancelled and left, so the
		// ticket is ours to recycle.
		c.pool.Put(t)
		return
	case ErrExpired:
		t.state.Store(stateExpired)
	default:
		t.state.Store(stateClosed)
	}
	t.ch <- struct{}{}
}

// Wait blocks until the request is released on band and returns a done func
// to call when the request has finished (it decrements the in-flight count;
// calling it again does nothing), or returns an error and a no-op done:
//
//	nil             released (dispatched)
//	ErrCancelled    ctx ended first; the error also wraps ctx.Err()
//	ErrExpired      waited longer than the band's MaxWait
//	ErrQueueFull    the band already holds Capacity waiters
//	ErrClosed       the controller is closed (or closed while waiting)
//	ErrUnknownBand  band outside [0, Bands)
//
// Exactly one of these is returned per call. In steady state a released Wait
// allocates once (the done func).
//
// A Wait cancelled while queued returns at once; its place (its slot of
// Capacity) is freed at the dispatcher's next tick — at once under Run —
// even if the band is gated, without spending the band's burst. Stats counts
// it as cancelled, so Stats adds up to the errors Wait returned.
func (c *Controller) Wait(ctx context.Context, band int) (done func(), err error) {
	if err := ctx.Err(); err != nil {
		return noop, fmt.Errorf("%w: %w", ErrCancelled, err)
	}
	t := c.pool.Get().(*ticket)
	t.state.Store(stateWaiting)
	if err := c.d.Enqueue(band, t); err != nil {
		c.pool.Put(t)
		return noop, err
	}
	select {
	case <-t.ch:
	case <-ctx.Done():
		if t.state.CompareAndSwap(stateWaiting, stateCancelled) {
			// The dispatcher removes the ticket at its next tick
			// (or at once, under Run), freeing its place even in a
			// gated band, and recycles it. The ticket must not be
			// touched after Abandon: it may already be reused.
			c.d.Abandon(band)
			return noop, fmt.Errorf("%w: %w", ErrCancelled, ctx.Err())
		}
		<-t.ch // the dispatcher won; its signal is on its way
	}
	switch t.state.Load() {
	case stateDispatched:
		t.uses++
		gen := t.uses
		t.gen.Store(gen)
		return func() { t.done(gen) }, nil
	case stateExpired:
		c.pool.Put(t)
		return noop, ErrExpired
	default:
		c.pool.Put(t)
		return noop, ErrClosed
	}
}

// InFlight returns the number of released Waits whose done has not been
// called yet.
func (c *Controller) InFlight() int64 { return c.inflight.Load() }

// Run runs the dispatcher on the real clock; see Dispatcher.Run.
func (c *Controller) Run(ctx context.Context) error { return c.d.Run(ctx) }

// Step runs one tick; see Dispatcher.Step. For tests and simulations.
func (c *Controller) Step() { c.d.Step() }

// Poll releases what the current tick still allows; see Dispatcher.Poll.
func (c *Controller) Poll() { c.d.Poll() }

// Close stops the controller: pending and future Waits return ErrClosed and
// Run returns. Requests already released are unaffected (their done still
// works). Idempotent.
func (c *Controller) Close() { c.d.Close() }

// Stats returns the dispatcher's snapshot; see Stats.
func (c *Controller) Stats() Stats { return c.d.Stats() }
