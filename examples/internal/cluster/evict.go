package cluster

import (
	"fmt"
	"time"

	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// Eviction in the event loop (Config.Evict). Each gateway has its own
// flowcontrol.Evictor on the virtual clock, fed as a host feeds it: Track at a
// request's first dispatch (Tracked.Again at each later one), Tracked.Start at
// its first byte to the client (the first token for a streaming class, never
// for the other: a non-streaming response is one body at the end), Tracked.Done
// when it ends at its replica (finished, its client gave up, or evicted). The
// evictor decides; s.evict is the act.
//
// Checks run as evEvict events: at the instant of every scrape (the saturation
// changed) and of every dispatch (a new victim, and the in-flight credit moved),
// and at Evictor.Next (a stall deadline or the end of a grace), which is re-read
// after every check. A confirmation (Done) happens inside the act, so the check
// that acted arms the end of its grace itself.

// streams reports whether the class's clients stream (Config.SheddableStream,
// Config.CriticalNoStream).
func (s *sim) streams(critical bool) bool {
	if critical {
		return !s.cfg.CriticalNoStream
	}
	return s.cfg.SheddableStream
}

// armEvict arms gateway gi's check at virtual time at, unless one is armed at
// or before it (that one re-arms from Evictor.Next).
func (s *sim) armEvict(g *gateway, gi int32, at int64) {
	if g.evictArmed && g.evictAt <= at {
		return
	}
	g.evictAt, g.evictArmed = at, true
	s.push(at, evEvict, gi)
}

// onEvict is gateway gi's evEvict at virtual time at: a check, then the next
// one armed at Evictor.Next.
func (s *sim) onEvict(g *gateway, gi int32, at int64) {
	if !g.evictArmed || g.evictAt != at {
		return // superseded by an earlier check
	}
	g.evictArmed = false
	g.ev.Check()
	if next := g.ev.Next(); !next.IsZero() {
		s.armEvict(g, gi, int64(next.Sub(s.base)))
	}
}

// evict is the act of request id's eviction, called by its gateway's
// Evictor.Check: the request is aborted at its replica (its KV blocks are free
// at once, or at the end of the step in progress if that step computes it), its
// in-flight count is returned, its replica kicked, and the evictor told it ended
// (Tracked.Done: the abort is synchronous in the model, so this is the server's
// confirmation). A request whose response had not started goes back to the head
// of its band with the deadline of its arrival (Dispatcher.Requeue), as a fresh
// vllm.Request with the same lengths, prefilled again from scratch when it is
// dispatched; with no dispatcher (None, the Floor) it is dispatched again at
// once, by the routing, as a new arrival would be. A started stream
// (Eviction.Started) ends there, as failed.
func (s *sim) evict(id int32) {
	q := &s.reqs[id]
	r := int(q.replica)
	if r < 0 || q.dispatch < 0 || q.done >= 0 || q.timedOut || q.cut {
		s.err = fmt.Errorf("cluster: request %d evicted while not on a replica", id)
		return
	}
	g := s.gws[q.gw]
	s.evc.evictions++
	s.evc.wastedPrefill += int64(min(q.vr.Computed(), q.vr.Input))
	s.evc.wastedDecode += int64(q.vr.Generated())
	if q.vr.Blocks() == 0 {
		s.evc.idle++ // waiting in the replica's queue: it frees nothing
	}
	s.replicas[r].Abort(q.vr)
	s.catchUp(g)
	s.moveInflight(q.gw, r, -1)
	s.kick(r)
	q.tr.Done()
	band := BandSheddable
	if q.critical {
		band = BandCritical
	}
	if q.first >= 0 && s.streams(q.critical) {
		// Its client has tokens: the stream is cut, not re-queued.
		q.cut = true
		s.evc.cut++
		s.pending--
		s.schedule(g, q.gw)
		return
	}
	s.evc.requeued++
	v := q.vr
	q.vr = &vllm.Request{ID: v.ID, Input: v.Input, Output: v.Output, Priority: v.Priority}
	q.replica, q.dispatch, q.first = -1, -1, -1
	g.queued[band]++
	if g.d == nil {
		s.dispatch(q.gw, band, id)
		return
	}
	flow, cost := "", 0.0
	if s.tenants != nil || s.cfg.LongShort {
		flow, cost = "A", float64(v.Input+v.Output)
		if q.tenantB {
			flow = "B"
		}
	}
	if err := g.d.Requeue(band, flow, cost, s.base.Add(time.Duration(q.arrive)), id); err != nil {
		s.err = fmt.Errorf("cluster: request %d: requeue: %w", id, err)
		return
	}
	g.maxQueued = max(g.maxQueued, g.queued[0]+g.queued[1])
	g.d.Flush() // Run polls at once after a Requeue, as after an Enqueue
	s.schedule(g, q.gw)
}
