package flowcontrol

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// InFlightCounter is told when a request is released (Inc) and when its
// holder calls Permit.Done (Dec). saturation.InFlight satisfies it.
type InFlightCounter interface {
	Inc()
	Dec()
}

// ControllerConfig configures NewController: the shared Config (bands,
// policy, source, clock) plus what only the blocking facade has.
type ControllerConfig struct {
	Config
	// InFlight, if set, is incremented when a Wait is released and
	// decremented when its Permit's Done is called (once), next to the
	// count that InFlight() reports. Nil means the Source, when it is an
	// InFlightCounter: a source that counts releases (saturation.Poller,
	// saturation.InFlight) moves at once, before its next reading.
	InFlight InFlightCounter
	// OnOutcome, if set, is called exactly once per Wait that entered a
	// band's queue, with the band, the outcome (nil = dispatched, or
	// ErrCancelled, ErrExpired, ErrClosed) and the time waited on the
	// configured clock, before that Wait returns. It runs on the
	// dispatcher's goroutine (or, for a cancellation, the waiter's), so it
	// must be quick and must not block; it must not call Step, Flush or
	// Close. Waits refused before the queue (ErrShed included) are not
	// reported here: they are counted in Stats (BandStats.Rejected,
	// BandStats.Refused, Stats.UnknownBand). flowmetrics.Collector.OnOutcome fits here.
	OnOutcome func(band int, outcome error, waited time.Duration)
	// Admitter, if set, is asked by Wait whether a request may enter its
	// band's queue, after the band, context and running checks and before
	// the queue (not once the controller is closed: Wait then returns
	// ErrClosed without asking). A refusal returns ErrShed and counts in
	// Stats as BandStats.Refused.Shed; it is not reported to OnOutcome.
	// Nil means every request is admitted. NewProbabilistic is llm-d's.
	Admitter Admitter
	// Stepped says the host drives the controller's ticks itself with Step
	// (simulators, tests) instead of Run. Without it, Wait on a controller
	// whose Run is not going returns ErrNotRunning at once rather than
	// blocking until its context ends.
	Stepped bool
	// Eviction, when Enabled, gives the controller an Evictor (see
	// Controller.Evictor) over the controller's Source, clock and bands,
	// with the gateway's held band from the dispatcher (Dispatcher.Held).
	// Run and Start run it beside the dispatcher; a Stepped controller's
	// host calls its Check. Off by default.
	Eviction EvictionConfig
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
// the ticket again: the waiter owns it and returns it to the pool (in
// Permit.Done, for a dispatched ticket, because Done reads it). If the
// waiter wins (cancelled) it forgets the ticket and the dispatcher returns
// it to the pool when it pops it. So a ticket is never reused while the other side may
// still touch it.
type ticket struct {
	state atomic.Uint32
	ch    chan struct{} // 1-buffered; one send per dispatcher-side win
	gen   atomic.Uint64 // the generation whose Done has not fired yet; 0 = none
	uses  uint64        // owner-only: generations handed out
	start time.Time     // enqueue time on the configured clock, when OnOutcome is set
	c     *Controller
	// owner-only: the request, flow and cost estimate of a WaitRequest,
	// read by Done to charge the real cost (nil for Wait). Reset by get.
	req  *Request
	flow *flow[*ticket]
	cost float64
}

// Permit is a request released by Controller.Wait or WaitRequest: it holds
// one of the controller's in-flight slots until Done is called. It is a
// small value, comparable, and its zero value holds nothing.
type Permit struct {
	t   *ticket
	gen uint64 // the ticket's generation this permit releases
}

// Done releases the permit's in-flight slot: the in-flight count and the
// ControllerConfig.InFlight counter go down by one and, for WaitRequest,
// the flow is charged Request.Served − Request.Cost. Only the first Done of
// a permit (or of any copy of it) does this; a later Done, and Done on the
// zero Permit, does nothing. It is safe to call from any goroutine.
func (p Permit) Done() {
	if p.t != nil {
		p.t.done(p.gen)
	}
}

// done releases one in-flight slot if gen is still the ticket's pending
// generation, so calling Done twice (or after the ticket was reused) has
// no effect. Winning the compare-and-swap makes the caller the ticket's
// only owner until it is back in the pool, so the fields it reads next
// are still this generation's.
func (t *ticket) done(gen uint64) {
	if !t.gen.CompareAndSwap(gen, 0) {
		return
	}
	if f := t.flow; f != nil {
		if served := t.req.Served; served > 0 {
			f.addCharge(served - t.cost)
		}
		f.pins.Add(-1) // after the charge: the flow may now be forgotten
	}
	c := t.c
	c.inflight.Add(-1)
	if c.hook != nil {
		c.hook.Dec()
	}
	c.pool.Put(t)
}

// Controller is the blocking facade over a Dispatcher that a proxy handler
// uses:
//
//	p, err := c.Wait(ctx, band)
//	if err != nil { ... }
//	defer p.Done()
//
// Start it with Run (or drive it with Step) and stop it with Close.
type Controller struct {
	d         *Dispatcher[*ticket]
	inflight  atomic.Int64
	hook      InFlightCounter
	onOutcome func(band int, outcome error, waited time.Duration)
	now       func() time.Time
	stepped   bool
	admitter  Admitter
	pool      sync.Pool
	ev        *Evictor // nil: eviction off

	// refusals only the Controller sees, per band
	refusedCancelled []atomic.Uint64
	refusedIdle      []atomic.Uint64
	refusedShed      []atomic.Uint64
}

// NewController validates cfg and returns a controller. Errors wrap
// ErrInvalidConfig and name the field.
func NewController(cfg ControllerConfig) (*Controller, error) {
	c := &Controller{hook: cfg.InFlight, onOutcome: cfg.OnOutcome, stepped: cfg.Stepped, admitter: cfg.Admitter}
	if c.hook == nil {
		// A source that counts releases (saturation.Poller,
		// saturation.InFlight) is told of them without any wiring.
		c.hook, _ = cfg.Source.(InFlightCounter)
	}
	c.pool.New = func() any { return &ticket{ch: make(chan struct{}, 1), c: c} }
	d, err := newDispatcher(DispatcherConfig[*ticket]{
		Config:   cfg.Config,
		Dispatch: c.onDispatch,
		OnDrop:   c.onDrop,
	}, c.claim, func(t *ticket) bool { return t.state.Load() == stateCancelled })
	if err != nil {
		return nil, err
	}
	c.d = d
	c.now = d.now
	c.refusedCancelled = make([]atomic.Uint64, d.Bands())
	c.refusedIdle = make([]atomic.Uint64, d.Bands())
	c.refusedShed = make([]atomic.Uint64, d.Bands())
	if cfg.Eviction.Enabled {
		c.ev, err = NewEvictor(cfg.Eviction, d.Bands(), d.source, d.Held, d.now)
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// claim is the dispatcher's liveness hook, called once per ticket before the
// dispatcher decides its outcome (dispatch, expiry or close): it wins the
// ticket unless the waiter has already cancelled. A lost claim makes the
// dispatcher count the ticket as cancelled, so Stats agrees with Wait.
func (c *Controller) claim(t *ticket) bool {
	return t.state.CompareAndSwap(stateWaiting, stateClaimed)
}

// report calls OnOutcome for a ticket that was queued on band.
func (c *Controller) report(band int, t *ticket, outcome error) {
	if c.onOutcome != nil {
		c.onOutcome(band, outcome, c.now().Sub(t.start))
	}
}

func (c *Controller) onDispatch(band int, t *ticket) {
	// Count the request in flight before waking its waiter, so a
	// saturation source reading the counter sees it at once.
	c.inflight.Add(1)
	if c.hook != nil {
		c.hook.Inc()
	}
	c.report(band, t, nil)
	t.state.Store(stateDispatched)
	t.ch <- struct{}{}
}

func (c *Controller) onDrop(band int, t *ticket, reason error) {
	switch reason {
	case ErrCancelled:
		// The claim failed: the waiter cancelled, reported its outcome
		// and left, so the ticket is ours to recycle.
		c.pool.Put(t)
		return
	case ErrExpired:
		t.state.Store(stateExpired)
	default:
		t.state.Store(stateClosed)
	}
	c.report(band, t, reason)
	t.ch <- struct{}{}
}

// Wait blocks until the request is released on band, or fails. On success
// it returns a Permit holding one in-flight slot and a nil error; the
// caller must call the Permit's Done once the request has finished (a
// Permit never released stays counted in InFlight and in
// ControllerConfig.InFlight). On failure it returns the zero Permit, whose
// Done does nothing, and one of
//
//	ErrCancelled    ctx ended first; the error also wraps ctx.Err()
//	ErrExpired      waited longer than the band's MaxWait
//	ErrQueueFull    the band already holds Capacity waiters
//	ErrClosed       the controller is closed (or closed while waiting)
//	ErrNotRunning   no Run is going and the controller is not Stepped
//	ErrShed         ControllerConfig.Admitter refused the request
//	ErrUnknownBand  band outside [0, Bands)
//
// Exactly one outcome per call. The first three may come after the request
// waited in the queue (OnOutcome reports those, and releases); the others,
// and ErrCancelled for a context already done, are refusals at the door,
// counted in Stats. A Wait on an open band with nothing queued, while Run
// is ticking, is released at once on the caller's goroutine; no released
// Wait allocates in steady state.
//
// A Wait cancelled while queued returns at once; its place (its slot of
// Capacity) is freed at the dispatcher's next tick — at once under Run —
// even if the band is gated, without spending the band's burst. Stats counts
// it as cancelled, so Stats adds up to the errors Wait returned.
func (c *Controller) Wait(ctx context.Context, band int) (Permit, error) {
	if err := c.door(ctx, band, true); err != nil {
		return Permit{}, err
	}
	if c.d.direct(band) {
		// Open band, nothing ahead, Run ticking: released at once,
		// with no hand-off to the dispatcher's goroutine.
		c.inflight.Add(1)
		if c.hook != nil {
			c.hook.Inc()
		}
		if c.onOutcome != nil {
			c.onOutcome(band, nil, 0)
		}
		return c.get().hold(), nil
	}
	t, start := c.queued()
	if err := c.d.Enqueue(band, t); err != nil {
		c.pool.Put(t)
		return Permit{}, err
	}
	if err := c.awaitTicket(ctx, band, t, start); err != nil {
		return Permit{}, err
	}
	return t.hold(), nil
}

// queued takes a ticket for a Wait about to queue: waiting, with its start
// on the configured clock when OnOutcome is set (it reports the wait).
func (c *Controller) queued() (*ticket, time.Time) {
	t := c.get()
	t.state.Store(stateWaiting)
	var start time.Time
	if c.onOutcome != nil {
		start = c.now()
		t.start = start
	}
	return t, start
}

// get takes a ticket from the pool with no request attached.
func (c *Controller) get() *ticket {
	t := c.pool.Get().(*ticket)
	t.req, t.flow = nil, nil
	return t
}

// hold starts the ticket's next generation and returns the permit that
// releases it. Owner only.
func (t *ticket) hold() Permit {
	t.uses++
	t.gen.Store(t.uses)
	return Permit{t, t.uses}
}

// awaitTicket waits for a queued ticket's outcome: nil when it was
// dispatched (the caller then owns t and starts its generation), or the
// error Wait returns (t is recycled or, cancelled, the dispatcher's).
func (c *Controller) awaitTicket(ctx context.Context, band int, t *ticket, start time.Time) error {
	select {
	case <-t.ch:
	case <-ctx.Done():
		if t.state.CompareAndSwap(stateWaiting, stateCancelled) {
			// The dispatcher removes the ticket at its next tick
			// (or at once, under Run), freeing its place even in a
			// gated band, and recycles it. The ticket must not be
			// touched after the CAS: the dispatcher may already have
			// swept and recycled it (hence the local start).
			if c.onOutcome != nil {
				c.onOutcome(band, ErrCancelled, c.now().Sub(start))
			}
			c.d.Abandon(band)
			return fmt.Errorf("%w: %w", ErrCancelled, ctx.Err())
		}
		<-t.ch // the dispatcher won; its signal is on its way
	}
	switch t.state.Load() {
	case stateDispatched:
		return nil
	case stateExpired:
		c.pool.Put(t)
		return ErrExpired
	default:
		c.pool.Put(t)
		return ErrClosed
	}
}

// door is the part of Wait, WaitRequest and Requeue before the queue: the
// refusals (unknown band, context already done, not running, and, if
// admit, shed), each counted.
func (c *Controller) door(ctx context.Context, band int, admit bool) error {
	if uint(band) >= uint(c.d.Bands()) {
		c.d.unknown.Add(1)
		return ErrUnknownBand
	}
	if err := ctx.Err(); err != nil {
		c.refusedCancelled[band].Add(1)
		return fmt.Errorf("%w: %w", ErrCancelled, err)
	}
	if !c.stepped && !c.d.running.Load() && !c.d.closed.Load() {
		c.refusedIdle[band].Add(1)
		return ErrNotRunning
	}
	if admit && c.admitter != nil && !c.d.closed.Load() && !c.admitter.Admit(band, len(c.refusedShed)) {
		c.refusedShed[band].Add(1)
		return ErrShed
	}
	return nil
}

// InFlight returns the number of released Waits whose Permit's Done has
// not been called yet.
func (c *Controller) InFlight() int64 { return c.inflight.Load() }

// Bands returns a copy of the validated band configurations (names
// defaulted), band 0 first.
func (c *Controller) Bands() []BandConfig { return c.d.BandConfigs() }

// Run runs the dispatcher on the real clock; see Dispatcher.Run. While it
// is going, Wait queues requests; before it starts and after it returns,
// Wait returns ErrNotRunning unless the controller is Stepped. Waits
// already queued when Run returns stay queued until Run is started again,
// Close, or their context ends.
//
// With eviction enabled, the controller's Evictor runs beside the
// dispatcher and stops when Run returns.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.d.begin(); err != nil {
		return err
	}
	return c.loop(ctx)
}

// loop is Run after begin: the dispatcher's loop and, with eviction, the
// evictor's beside it, stopped and waited for when the dispatcher's ends.
func (c *Controller) loop(ctx context.Context) error {
	if c.ev == nil {
		return c.d.loop(ctx)
	}
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.ev.Run(ectx) // it ends with ectx
	}()
	err := c.d.loop(ctx)
	cancel()
	<-done
	return err
}

// Evictor returns the controller's evictor, or nil when
// ControllerConfig.Eviction is off. A handler tracks each released request
// with it (Evictor.Track), and re-queues a victim whose response had not
// started with Requeue.
func (c *Controller) Evictor() *Evictor { return c.ev }

// Start is Run in a goroutine of its own, except that the controller counts
// as running before Start returns: a Wait issued after Start never sees
// ErrNotRunning (with "go c.Run(ctx)" an early Wait may). Run's result is
// delivered on the returned channel (buffered, so nobody has to read it).
func (c *Controller) Start(ctx context.Context) <-chan error {
	ch := make(chan error, 1)
	if err := c.d.begin(); err != nil {
		ch <- err
		return ch
	}
	go func() { ch <- c.loop(ctx) }()
	return ch
}

// Step runs one tick; see Dispatcher.Step. For tests and simulations, with
// ControllerConfig.Stepped set.
func (c *Controller) Step() { c.d.Step() }

// Flush releases what the current tick still allows; see Dispatcher.Flush.
func (c *Controller) Flush() { c.d.Flush() }

// Close stops the controller: pending and future Waits return ErrClosed and
// Run returns. Requests already released are unaffected (their Permit's
// Done still works). Idempotent.
func (c *Controller) Close() { c.d.Close() }

// Stats returns the dispatcher's snapshot with the controller's own
// refusals (Refusals.Cancelled, Refusals.NotRunning, Refusals.Shed) filled
// in; see Stats.
func (c *Controller) Stats() Stats {
	st := c.d.Stats()
	for i := range st.Bands {
		st.Bands[i].Refused.Cancelled = c.refusedCancelled[i].Load()
		st.Bands[i].Refused.NotRunning = c.refusedIdle[i].Load()
		st.Bands[i].Refused.Shed = c.refusedShed[i].Load()
	}
	if c.ev != nil {
		es := c.ev.Stats()
		st.Eviction = &es
	}
	return st
}
