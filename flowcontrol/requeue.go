package flowcontrol

import (
	"context"
	"time"
)

// Requeue puts item back at the head of band: ahead of everything queued
// there (behind only items with an earlier MaxWait deadline, which first
// queued before it), for an item that was released and then taken back before it had
// done anything (an evicted request whose response had not started; see
// Evictor). The item keeps the deadline of its first enqueue: since is when
// it was first queued (the zero time means now), so the band's MaxWait
// still bounds its whole wait. It is not refused for the band's Capacity
// (it was admitted once; refusing it now would lose it) and it counts as
// queued, and then as dispatched or dropped, like any item: one outcome per
// Requeue.
//
// On a band with fairness the item goes to the head of flow id's queue (""
// is DefaultFlow), not subject to FlowCapacity, and a flow that had nothing
// queued rejoins at the front of the band's turn; cost is its estimate, as
// for EnqueueFlow. On an fcfs band id and cost are ignored.
//
// Requeue takes the tick lock: it must not be called from Dispatch,
// OnDrop or OnOutcome (deadlock). Errors: ErrUnknownBand, ErrClosed.
func (d *Dispatcher[T]) Requeue(band int, id string, cost float64, since time.Time, item T) error {
	_, err := d.requeue(band, id, cost, since, item, false)
	return err
}

// requeue is Requeue, returning the item's flow (pinned if pin is set, as
// enqueueFlow does) for a flow band.
func (d *Dispatcher[T]) requeue(bandIdx int, id string, cost float64, since time.Time, item T, pin bool) (*flow[T], error) {
	if uint(bandIdx) >= uint(len(d.bands)) {
		d.unknown.Add(1)
		return nil, ErrUnknownBand
	}
	b := &d.bands[bandIdx]
	d.mu.Lock()
	defer func() {
		d.mu.Unlock()
		d.wake()
	}()
	// Under the tick lock Close has either finished its drain (closed is
	// set: refuse) or not started it (it will drop the item).
	if d.closed.Load() {
		b.doorClosed.Add(1)
		return nil, ErrClosed
	}
	now := d.nowNanos()
	due := int64(noDeadline)
	if b.maxWait > 0 {
		first := now
		if !since.IsZero() {
			first = min(now, int64(since.Sub(d.base)))
		}
		due = dueAt(first, b.maxWait)
	}
	b.queued.Add(1)
	bump(&b.requeued)
	if b.flows == nil {
		b.held.pushFront(entry[T]{item: item, due: due})
		return nil, nil
	}
	fs := b.flows
	// Everything still in the ring arrived before this call: route it
	// first, so the re-queued item is the front of its flow.
	d.drain(b, now)
	if id == "" {
		id = DefaultFlow
	}
	f := fs.lookupAny(id)
	if pin {
		f.pins.Add(1)
	}
	fs.place(f, qentry[T]{item: item, due: due, cost: costOf(cost), seq: 0}, now, true)
	return f, nil
}

// lookupAny is lookup without FlowCapacity: the flow of a re-queued item,
// which was counted against it once already.
func (fs *flows[T]) lookupAny(id string) *flow[T] {
	for {
		h := fs.ix.hash(id)
		f := fs.ix.get(id, h)
		if f == nil {
			f = fs.ix.getOrAdd(id, h, func() *flow[T] { return fs.newFlow(id) })
		}
		if f.count.Add(1) > 0 {
			return f
		}
		fs.ix.remove(f) // forgotten meanwhile (see lookup)
		fs.last.CompareAndSwap(f, nil)
	}
}

// pushFront puts e ahead of the queue's items.
func (q *fifo[E]) pushFront(e E) {
	if q.n == uint32(len(q.buf)) {
		q.push(e) // grow; e lands at the back ...
		q.n--     // ... and is taken back off
		var zero E
		q.buf[(q.start+q.n)&uint32(len(q.buf)-1)] = zero
	}
	q.start = (q.start - 1) & uint32(len(q.buf)-1)
	q.buf[q.start] = e
	q.n++
}

// Requeue is WaitRequest for a request released before and evicted before
// its response started (see Evictor): it waits at the head of its band (of
// its flow, on a band with fairness) and keeps the MaxWait deadline of its
// first Wait, which began at since. It is not refused for capacity nor
// asked of the Admitter (the request was admitted once); otherwise it
// returns what WaitRequest returns. r may be nil (DefaultFlow, cost 1).
// The caller must have called Done on the request's previous Permit.
func (c *Controller) Requeue(ctx context.Context, band int, r *Request, since time.Time) (Permit, error) {
	if err := c.door(ctx, band, false); err != nil {
		return Permit{}, err
	}
	t, start := c.queued()
	var id string
	var cost float64
	if r != nil {
		id, cost = r.Flow, r.Cost
	}
	pin := r != nil && c.d.bands[band].flows != nil
	f, err := c.d.requeue(band, id, cost, since, t, pin)
	if err != nil {
		c.pool.Put(t)
		return Permit{}, err
	}
	if pin {
		t.req, t.flow, t.cost = r, f, costOf(r.Cost)
	}
	if err := c.awaitTicket(ctx, band, t, start); err != nil {
		if pin {
			f.pins.Add(-1)
		}
		return Permit{}, err
	}
	return t.hold(), nil
}
