package flowcontrol

import (
	"context"
	"time"
)

// Request describes a Wait's flow for Controller.WaitRequest.
//
// It is passed by pointer, with Served filled in by the handler, because
// the real cost of an LLM request (tokens served) is known only when it
// ends: the handler sets r.Served as it learns it, and the Permit's Done —
// deferred or not — reads it once and charges the difference from Cost to
// the flow (see Dispatcher.Charge).
type Request struct {
	// Flow is the flow (tenant, e.g. the fairness id) the request
	// belongs to; "" means DefaultFlow. Flows are per band: the same id
	// in two bands is two flows.
	Flow string
	// Cost is the estimated cost of the request in the unit fair-share
	// divides (e.g. prompt tokens plus expected output tokens); ≤ 0 or
	// not finite means 1, which makes fair-share count requests.
	Cost float64
	// Deadline is the latest time the request is worth starting (e.g.
	// received + a TTFT SLO). On an edf band it orders the flow's
	// requests and, if earlier than the band's MaxWait deadline, expires
	// the request with ErrExpired; elsewhere it is ignored. Zero = none.
	Deadline time.Time
	// Served is set by the handler, before calling Permit.Done, to the
	// real cost (same unit as Cost); Done charges Served − Cost to the
	// flow (see Dispatcher.Charge), which stays remembered until then
	// however long the request runs. 0 leaves the estimate standing.
	// Done reads it once: it must not be written concurrently with Done.
	Served float64
}

// WaitRequest is Wait for a request of a flow, with a cost estimate and a
// deadline (r nil is Wait). On an fcfs band the flow, cost and deadline are
// ignored. It passes the same door as Wait (the Admitter included).
// Besides Wait's errors it returns ErrFlowFull (which wraps
// ErrQueueFull) when r.Flow already holds the band's FlowCapacity. On a
// band with fairness it always queues (no direct release: the band's turns
// and virtual times are the dispatcher's to keep), which Run then serves at
// once if the band is open. The Permit's Done charges the flow
// r.Served − r.Cost (see Request.Served), so r must stay valid until Done.
// In steady state it allocates nothing for a known flow.
func (c *Controller) WaitRequest(ctx context.Context, band int, r *Request) (Permit, error) {
	if r == nil || uint(band) >= uint(c.d.Bands()) || c.d.bands[band].flows == nil {
		return c.Wait(ctx, band)
	}
	if err := c.door(ctx, band, true); err != nil {
		return Permit{}, err
	}
	t, start := c.queued()
	f, err := c.d.enqueueFlow(&c.d.bands[band], r.Flow, r.Cost, r.Deadline, t, true)
	if err != nil {
		c.pool.Put(t)
		return Permit{}, err
	}
	// The request, flow and estimate are the waiter's: the dispatcher
	// never reads them, so setting them after the enqueue races with
	// nothing.
	t.req, t.flow, t.cost = r, f, costOf(r.Cost)
	if err := c.awaitTicket(ctx, band, t, start); err != nil {
		f.pins.Add(-1) // not released: nothing to charge
		return Permit{}, err
	}
	return t.hold(), nil
}

// Charge corrects the cost of a released request of flow on band by delta;
// see Dispatcher.Charge. WaitRequest's Permit.Done does it from
// Request.Served.
func (c *Controller) Charge(band int, flow string, delta float64) { c.d.Charge(band, flow, delta) }

// Flows returns a snapshot of band's flows; see Dispatcher.Flows.
func (c *Controller) Flows(band int) []FlowStats { return c.d.Flows(band) }
