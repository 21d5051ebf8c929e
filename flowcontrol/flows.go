package flowcontrol

import (
	"cmp"
	"math"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/queue"
)

// Flows: fairness between tenants inside a band.
//
// Ownership. A band whose Fairness is not fcfs ("a flow band") keeps the
// lock-free ring as its only ingress: producers resolve the item's flow
// (a flowIndex load, alloc-free for a known flow), count it against the flow
// (one atomic add, which is what makes FlowCapacity exact) and push onto the
// ring. Everything else — the per-flow queues, the round-robin list, the
// fair-share and expiry heaps, the virtual time — belongs to the goroutine
// holding Dispatcher.mu, which drains the ring into the per-flow queues at
// the start of every run (Step, Poll). So no lock is added to the ingress
// and none to the tick. fcfs bands never touch any of this.
//
// Cost, per item: ingress one flowIndex load and one atomic add more than an
// fcfs band; the tick moves the item once more (ring → flow queue) and, for
// fair-share or a band with deadlines, does O(log active flows) heap work.
// Memory: one flow record per flow seen within FlowIdle, whose queue buffer
// keeps the size of the flow's largest backlog.

// fairness disciplines, resolved from BandConfig.Fairness.
const (
	fairFCFS = iota
	fairRR
	fairShare
)

// deadFlow is the count of a forgotten flow: far below zero, so that a
// producer still holding the record sees a non-positive count after its
// increment and looks the flow up again.
const deadFlow = math.MinInt64 / 2

// qentry is one item in its flow's queue. It does not repeat the flow (the
// queue's owner), so that moving items, which is most of a flow band's
// tick, copies as little as possible.
type qentry[T any] struct {
	item T
	due  int64   // expiry, ns since the dispatcher's base; noDeadline = none
	cost float64 // the estimate, > 0
	seq  uint64  // arrival order at the tick, the tie-break of edf
}

// fentry is one item of a flow band on its way through the ring.
type fentry[T any] struct {
	item T
	due  int64   // expiry, ns since the dispatcher's base; noDeadline = none
	cost float64 // the estimate, > 0
	flow *flow[T]
}

// flow is one flow of one band. The atomics are shared with producers and
// Stats; the rest is owned by the tick goroutine.
//
// Layout: with thousands of flows every item finds its flow cold (evicted
// since its last item), so the fields an item touches — the producer's
// (id, hash, count) and the tick's — come first, together, then the
// queue's first buffer, then what only corrections, pins and sweeps use.
type flow[T any] struct {
	id    string
	count atomic.Int64 // items accepted and not yet ended; deadFlow once forgotten

	// tick state
	fifo   fifo[qentry[T]] // the queue, fcfs ordering
	reg    bool            // in band.all
	edf    bool
	inList bool // in band.rr (possibly emptied since: skipped when reached)

	start      float64       // fair-share: virtual start tag of the head
	finish     float64       // fair-share: virtual finish tag of the last item released
	order      uint64        // fair-share tie-break: activation order
	vtIdx      int32         // index in band.vt, -1 = not there
	exIdx      int32         // index in band.ex, -1 = not there
	last       int64         // the last time an item of the flow arrived or ended
	dispatched atomic.Uint64 // single writer: the tick

	// inl is the fifo's first buffer, inside the record: a flow of a band
	// with many flows mostly holds one or two items, whose queue then
	// costs no allocation and no cache line of its own. A longer backlog
	// moves the queue to a buffer of its own, once.
	inl [2]qentry[T]

	heap   []qentry[T]   // the queue, edf ordering: a min-heap on (due, seq)
	charge atomic.Uint64 // float64 bits: real minus estimated cost reported, not yet applied
	// pins counts the Controller requests of the flow queued or in
	// flight (WaitRequest until its Permit's Done): a pinned flow is not
	// forgotten, so the correction a long request reports at its Done
	// lands on the flow that will pay it.
	pins atomic.Int64
	// charged says f is on its band's list of charged flows; nextCharged
	// links that list (written by the producer that pushes f, read by the
	// tick after it takes the list).
	charged     atomic.Bool
	nextCharged *flow[T]
	fs          *flows[T]
	_           [16]byte // to 256 bytes with a word-sized item (see the layout note)
}

// newFlow returns a new flow of fs, not yet counted nor indexed.
func (fs *flows[T]) newFlow(id string) *flow[T] {
	f := &flow[T]{id: id, edf: fs.edf, vtIdx: -1, exIdx: -1, fs: fs}
	if !f.edf {
		f.fifo.buf = f.inl[:]
	}
	return f
}

// addCharge adds delta to the flow's pending correction and, if the flow is
// not on it already, pushes it on its band's list of charged flows (a
// lock-free stack), which the next run applies. Any goroutine.
func (f *flow[T]) addCharge(delta float64) {
	if delta == 0 || math.IsNaN(delta) || math.IsInf(delta, 0) {
		return
	}
	for {
		old := f.charge.Load()
		if f.charge.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+delta)) {
			break
		}
	}
	if f.fs == nil || !f.charged.CompareAndSwap(false, true) {
		return
	}
	for {
		head := f.fs.charged.Load()
		f.nextCharged = head
		if f.fs.charged.CompareAndSwap(head, f) {
			f.fs.dirty.Store(true)
			return
		}
	}
}

// applyCharges applies the corrections reported since the last run, at the
// start of each run (so when a correction takes effect depends on when it
// was reported, not on when the flow is next touched, nor on whether it was
// forgotten meanwhile). A backlogged flow's next item starts where its last
// one really finished; an idle flow pays from the virtual time on (idleness
// does not forgive a correction).
func (fs *flows[T]) applyCharges() {
	if !fs.dirty.Load() {
		return
	}
	fs.dirty.Store(false)
	for f := fs.charged.Swap(nil); f != nil; {
		next := f.nextCharged
		f.nextCharged = nil
		f.charged.Store(false) // after reading next: a producer may push f again now
		if c := f.takeCharge(); c != 0 && fs.fair == fairShare {
			if f.vtIdx >= 0 {
				f.finish += c
				f.start = max(fs.vtime, f.finish)
				fs.vt.fix(f)
			} else {
				f.finish = max(fs.vtime, f.finish) + c
				fs.maxFinish = max(fs.maxFinish, f.finish)
			}
		}
		f = next
	}
}

// takeCharge returns and clears the pending correction. Tick only.
func (f *flow[T]) takeCharge() float64 {
	if f.charge.Load() == 0 {
		return 0
	}
	return math.Float64frombits(f.charge.Swap(0))
}

func (f *flow[T]) len() int {
	if f.edf {
		return len(f.heap)
	}
	return int(f.fifo.n)
}

// head returns the flow's next item (it must not be empty).
func (f *flow[T]) head() *qentry[T] {
	if f.edf {
		return &f.heap[0]
	}
	return f.fifo.front()
}

func (f *flow[T]) push(e qentry[T]) {
	if !f.edf {
		f.fifo.push(e)
		return
	}
	f.heap = append(f.heap, e)
	h := f.heap
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !entryLess(&h[i], &h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (f *flow[T]) pop() qentry[T] {
	if !f.edf {
		e, _ := f.fifo.pop()
		return e
	}
	h := f.heap
	e := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = qentry[T]{}
	f.heap = h[:n]
	siftDown(f.heap, 0)
	return e
}

func entryLess[T any](a, b *qentry[T]) bool {
	return a.due < b.due || a.due == b.due && a.seq < b.seq
}

func siftDown[T any](h []qentry[T], i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && entryLess(&h[r], &h[l]) {
			m = r
		}
		if !entryLess(&h[m], &h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// fifo is a growable circular FIFO owned by one goroutine. Its length is a
// power of two (so positions are masked, not divided). After warm-up it
// does not allocate: the buffer keeps its largest size.
type fifo[E any] struct {
	buf   []E
	start uint32 // 32 bits suffice (queue.MaxCapacity) and keep flow's first line
	n     uint32
}

func (q *fifo[E]) push(e E) {
	if q.n == uint32(len(q.buf)) {
		// Full: double the buffer (at least 4). The items are
		// buf[start:] then buf[:start]. Kept small so that push, on
		// every item's path, inlines.
		buf := make([]E, max(4, 2*len(q.buf)))
		copy(buf[copy(buf, q.buf[q.start:]):], q.buf[:q.start])
		// The old buffer may be a flow's inl, which lives on: it must
		// not keep the items alive.
		clear(q.buf)
		q.buf, q.start = buf, 0
	}
	q.buf[(q.start+q.n)&uint32(len(q.buf)-1)] = e
	q.n++
}

func (q *fifo[E]) pop() (E, bool) {
	var zero E
	if q.n == 0 {
		return zero, false
	}
	e := q.buf[q.start]
	q.buf[q.start] = zero
	q.start = (q.start + 1) & uint32(len(q.buf)-1)
	q.n--
	return e, true
}

func (q *fifo[E]) front() *E { return &q.buf[q.start] }

// flowHeap is the expiry order of a band's non-empty flows: an indexed
// min-heap on each flow's earliest deadline (its head's), each flow knowing
// its place (flow.exIdx). Tick only. (Fair-share's order is vtHeap.)
type flowHeap[T any] struct {
	fs []*flow[T]
}

func (h *flowHeap[T]) less(a, b *flow[T]) bool { return a.head().due < b.head().due }

func (h *flowHeap[T]) idx(f *flow[T]) *int32 { return &f.exIdx }

func (h *flowHeap[T]) swap(i, j int) {
	h.fs[i], h.fs[j] = h.fs[j], h.fs[i]
	*h.idx(h.fs[i]) = int32(i)
	*h.idx(h.fs[j]) = int32(j)
}

func (h *flowHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.fs[i], h.fs[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *flowHeap[T]) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h.fs) {
			return
		}
		m := l
		if r := l + 1; r < len(h.fs) && h.less(h.fs[r], h.fs[l]) {
			m = r
		}
		if !h.less(h.fs[m], h.fs[i]) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

func (h *flowHeap[T]) push(f *flow[T]) {
	*h.idx(f) = int32(len(h.fs))
	h.fs = append(h.fs, f)
	h.up(len(h.fs) - 1)
}

// fix restores the order after f's key changed (f must be in the heap).
func (h *flowHeap[T]) fix(f *flow[T]) {
	i := int(*h.idx(f))
	h.up(i)
	h.down(int(*h.idx(f)))
}

func (h *flowHeap[T]) remove(f *flow[T]) {
	i := int(*h.idx(f))
	if i < 0 {
		return
	}
	n := len(h.fs) - 1
	if i != n {
		h.swap(i, n)
	}
	h.fs[n] = nil
	h.fs = h.fs[:n]
	*h.idx(f) = -1
	if i < n {
		h.up(i)
		h.down(int(*h.idx(h.fs[i])))
	}
}

// flows is the flow state of one flow band.
type flows[T any] struct {
	fair    int
	edf     bool
	timed   bool  // items have deadlines: MaxWait or edf
	flowCap int64 // 0 = none
	idle    int64 // ns
	ring    *queue.Ring[fentry[T]]
	ix      flowIndex[T] // id → *flow[T]
	// last is the flow the last lookup found: a band whose traffic is
	// mostly one flow (DefaultFlow, from Enqueue and Wait) skips the map.
	last     atomic.Pointer[flow[T]]
	full     atomic.Uint64
	known    atomic.Int64 // len(all), for Stats
	lastTick int64        // last idle sweep

	// charged is the list of flows with corrections to apply (see
	// addCharge); dirty says it may be non-empty (one load per run).
	charged atomic.Pointer[flow[T]]
	dirty   atomic.Bool

	// tick state
	scratch [64]fentry[T] // drain's buffer
	all     []*flow[T]
	rr      fifo[*flow[T]]
	vt      vtHeap[T]
	ex      flowHeap[T]
	vtime   float64 // fair-share virtual time
	// maxFinish is the largest finish tag given: at the end of a busy
	// period (no flow backlogged) the virtual time moves up to it, as in
	// SFQ, so that no idle flow is ahead of it (see forget).
	maxFinish float64
	seq       uint64
	order     uint64
}

func newFlows[T any](bc BandConfig) *flows[T] {
	fs := &flows[T]{
		edf:     bc.Ordering == OrderingEDF,
		flowCap: int64(bc.FlowCapacity),
		idle:    int64(cmp.Or(bc.FlowIdle, DefaultFlowIdle)),
		ring:    queue.NewRing[fentry[T]](bc.Capacity),
	}
	switch bc.Fairness {
	case FairnessRoundRobin:
		fs.fair = fairRR
	case FairnessShare:
		fs.fair = fairShare
	}
	fs.timed = bc.MaxWait > 0 || fs.edf
	fs.ix.init()
	return fs
}

// lookup returns id's flow with one more item counted against it, creating
// the flow if needed, or nil when the flow holds FlowCapacity items.
func (fs *flows[T]) lookup(id string) *flow[T] {
	for {
		f := fs.last.Load()
		if f == nil || f.id != id {
			h := fs.ix.hash(id)
			if f = fs.ix.get(id, h); f == nil {
				f = fs.ix.getOrAdd(id, h, func() *flow[T] { return fs.newFlow(id) })
			}
			fs.last.Store(f)
		}
		n := f.count.Add(1)
		if n <= 0 {
			// Forgotten by the tick between our load and our add:
			// help remove it and look again.
			fs.ix.remove(f)
			fs.last.CompareAndSwap(f, nil)
			continue
		}
		if fs.flowCap > 0 && n > fs.flowCap {
			f.count.Add(-1)
			return nil
		}
		return f
	}
}

// find returns id's flow, or nil if the band does not know it. Any
// goroutine.
func (fs *flows[T]) find(id string) *flow[T] { return fs.ix.get(id, fs.ix.hash(id)) }

// EnqueueFlow is Enqueue for an item of flow id (a tenant; "" means
// DefaultFlow) with a cost estimate (any unit, e.g. tokens; ≤ 0 or not
// finite means 1) and a deadline (the zero time means none; it orders and
// expires the item only in an edf band). On an fcfs band flow, cost and
// deadline are ignored and it is Enqueue. Errors are Enqueue's plus
// ErrFlowFull. In steady state, for a flow already known, it never
// allocates.
func (d *Dispatcher[T]) EnqueueFlow(bandIdx int, id string, cost float64, deadline time.Time, item T) error {
	if uint(bandIdx) >= uint(len(d.bands)) {
		d.unknown.Add(1)
		return ErrUnknownBand
	}
	b := &d.bands[bandIdx]
	if b.flows == nil {
		return d.Enqueue(bandIdx, item)
	}
	_, err := d.enqueueFlow(b, id, cost, deadline, item, false)
	return err
}

// enqueueFlow enqueues onto a flow band and returns the item's flow (for
// Controller's cost correction), pinned if pin is set: the caller unpins it
// (flow.pins) when the request ends.
func (d *Dispatcher[T]) enqueueFlow(b *band[T], id string, cost float64, deadline time.Time, item T, pin bool) (*flow[T], error) {
	fs := b.flows
	// The band's slot first (as Enqueue: see there for the Close
	// protocol), then the flow's: a flow is created only for an item
	// that fits the band, so refused items leave no flow behind.
	if b.queued.Add(1) > b.capacity {
		b.queued.Add(-1)
		if d.closed.Load() {
			b.doorClosed.Add(1)
			return nil, ErrClosed
		}
		b.full.Add(1)
		return nil, ErrQueueFull
	}
	if d.closed.Load() {
		b.queued.Add(-1)
		b.doorClosed.Add(1)
		return nil, ErrClosed
	}
	if id == "" {
		id = DefaultFlow
	}
	f := fs.lookup(id)
	if f == nil {
		b.queued.Add(-1)
		fs.full.Add(1)
		return nil, ErrFlowFull
	}
	if pin {
		// The flow holds this item (count ≥ 1), so it cannot be
		// forgotten before the pin is in place.
		f.pins.Add(1)
	}
	cost = costOf(cost)
	e := fentry[T]{item: item, due: noDeadline, cost: cost, flow: f}
	if b.maxWait > 0 || fs.edf && !deadline.IsZero() {
		now := d.nowNanos()
		if b.maxWait > 0 {
			e.due = dueAt(now, b.maxWait)
		}
		if fs.edf && !deadline.IsZero() {
			e.due = min(e.due, max(int64(deadline.Sub(d.base)), math.MinInt64+1))
		}
	}
	if !fs.ring.TryPush(e) {
		// Unreachable: queued ≤ Capacity ≤ ring capacity.
		if pin {
			f.pins.Add(-1)
		}
		f.count.Add(-1)
		b.queued.Add(-1)
		b.full.Add(1)
		return nil, ErrQueueFull
	}
	d.wake()
	return f, nil
}

// costOf is the cost an estimate stands for: ≤ 0, NaN or infinite means
// unknown, counted as 1.
func costOf(c float64) float64 {
	if !(c > 0) || math.IsInf(c, 1) {
		return 1
	}
	return c
}

// Charge corrects the cost of a released item of flow id on band by delta (the
// real cost minus the estimate given at EnqueueFlow; negative gives
// service back). Under fair-share it moves the flow's virtual finish tag,
// so a flow that under-estimates pays for it at its next releases. It takes
// effect at the next run (Step or Flush; Run flushes at once); a flow never
// starts before the current virtual time because of it, and an idle flow
// pays it from the virtual time on (idleness does not forgive it). A flow
// set ahead of the virtual time by a correction is remembered until the
// virtual time catches up. Other bands, a NaN or infinite delta, and a flow
// the band does not know (never seen, or forgotten: charge within FlowIdle
// of the flow's last item; Controller's done always does) are ignored. Safe
// from any goroutine; alloc-free.
func (d *Dispatcher[T]) Charge(bandIdx int, id string, delta float64) {
	if uint(bandIdx) >= uint(len(d.bands)) || d.bands[bandIdx].flows == nil {
		return
	}
	if id == "" {
		id = DefaultFlow
	}
	if f := d.bands[bandIdx].flows.find(id); f != nil {
		f.addCharge(delta)
	}
}

// drain moves what producers pushed onto the ring into the per-flow queues,
// activating flows that were empty: a round-robin flow joins the end of the
// turn; a fair-share flow starts at max(virtual time, its own finish tag),
// so it neither jumps ahead for having been idle nor is held back by its
// history (an idle flow's finish tag is at most the virtual time it left).
func (d *Dispatcher[T]) drain(b *band[T], now int64) {
	fs := b.flows
	fs.applyCharges()
	// Claim the ring in runs (one compare-and-swap per run rather than
	// per item) through a scratch buffer owned, like the rest, by the tick.
	for {
		n := fs.ring.TryPopN(fs.scratch[:])
		if n == 0 {
			return
		}
		for k := range n {
			fs.route(&fs.scratch[k], now)
			fs.scratch[k] = fentry[T]{}
		}
	}
}

// route puts e, just taken from the ring, into its flow's queue.
func (fs *flows[T]) route(e *fentry[T], now int64) {
	fs.place(e.flow, qentry[T]{item: e.item, due: e.due, cost: e.cost, seq: fs.seq}, now, false)
	fs.seq++
}

// place puts q into f's queue: at its back, or, for a re-queued item
// (front), at its front (see Dispatcher.Requeue). A flow that was empty
// becomes active: a round-robin flow joins the turn (at its end, or at its
// front for a re-queued item); a fair-share flow starts at max(virtual
// time, its finish tag), a re-queued item's at the virtual time itself.
func (fs *flows[T]) place(f *flow[T], q qentry[T], now int64, front bool) {
	if !f.reg {
		f.reg = true
		fs.all = append(fs.all, f)
		fs.known.Store(int64(len(fs.all)))
	}
	f.last = now
	wasEmpty := f.len() == 0
	switch {
	case !front || f.edf:
		f.push(q) // edf: a re-queued item's seq 0 puts it ahead of equal deadlines
	default:
		f.fifo.pushFront(q)
		// Behind the entries with an earlier deadline, which expiry
		// (looking at the head alone) needs in order.
		b := &f.fifo
		m := uint32(len(b.buf) - 1)
		for i := uint32(0); i+1 < b.n && b.buf[(b.start+i+1)&m].due < q.due; i++ {
			b.buf[(b.start+i)&m], b.buf[(b.start+i+1)&m] = b.buf[(b.start+i+1)&m], b.buf[(b.start+i)&m]
		}
	}
	if wasEmpty {
		switch fs.fair {
		case fairRR:
			if !f.inList {
				f.inList = true
				if front {
					fs.rr.pushFront(f)
				} else {
					fs.rr.push(f)
				}
			}
		case fairShare:
			if front {
				f.start, f.order = fs.vtime, 0
			} else {
				f.start = max(fs.vtime, f.finish)
				f.order = fs.order
				fs.order++
			}
			fs.vt.push(f)
		}
		if fs.timed {
			fs.ex.push(f)
		}
	} else if fs.timed && (f.edf || front) {
		fs.ex.fix(f)
	}
}

// took updates the heaps after the head of f left (by any outcome): an
// emptied flow leaves them, a non-empty one has a new earliest deadline.
// The fair-share start tag is not touched here: a dropped item was not
// service.
func (fs *flows[T]) took(f *flow[T], now int64) {
	f.last = now
	if f.len() == 0 {
		fs.vt.remove(f)
		fs.ex.remove(f)
		fs.idleCheck()
		return
	}
	if fs.timed {
		fs.ex.fix(f)
	}
}

// idleCheck ends a fair-share busy period: with no flow backlogged, the
// virtual time moves up to the largest finish tag given (SFQ's rule), so
// every idle flow's history is spent and a flow that comes back starts at
// the virtual time whether or not it was forgotten meanwhile.
func (fs *flows[T]) idleCheck() {
	if fs.fair == fairShare && fs.vt.len() == 0 {
		fs.vtime = max(fs.vtime, fs.maxFinish)
	}
}

// end accounts for an item of a flow band that leaves the queue.
func (b *band[T]) endFlow(f *flow[T]) {
	b.queued.Add(-1)
	f.count.Add(-1)
}

// expireFlows drops every item whose deadline has passed. The expiry heap
// holds each non-empty flow by its earliest deadline (its head: with fcfs
// ordering a flow's deadlines follow its arrival order, as in an fcfs band;
// with edf the heap minimum), so a tick looks only at what is due.
func (d *Dispatcher[T]) expireFlows(i int, b *band[T], now int64) {
	fs := b.flows
	for len(fs.ex.fs) > 0 {
		f := fs.ex.fs[0]
		if now < f.head().due {
			return
		}
		e := f.pop()
		fs.took(f, now)
		b.endFlow(f)
		d.drop(i, b, e.item, ErrExpired)
	}
}

// releaseFlows sends up to b.budget live items of a flow band, choosing the
// flow by the band's fairness. Expired and cancelled items are dropped
// without spending the budget or the flow's turn (or its virtual time).
func (d *Dispatcher[T]) releaseFlows(i int, b *band[T], now int64) {
	fs := b.flows
	// A flow's Dispatched is counted in a run of releases of the same
	// flow and stored once when the run ends (an atomic store is a full
	// fence on most machines: one per item was a tenth of a one-flow
	// band's release). The band's counter stays per item: an owner woken
	// by Dispatch must find its release in Stats.
	var run *flow[T]
	var n uint64
	defer func() {
		if run != nil {
			run.dispatched.Store(run.dispatched.Load() + n)
		}
	}()
	for b.budget > 0 {
		var f *flow[T]
		if fs.fair == fairRR {
			// The cursor is the list's front: one release per turn,
			// then the flow goes to the back if it has more (see
			// below). It stays in the list meanwhile; a flow alone
			// in it is not rotated at all.
			if fs.rr.n == 0 {
				return
			}
			f = *fs.rr.front()
		} else {
			if fs.vt.len() == 0 {
				return
			}
			f = fs.vt.top()
		}
		if e, ok := d.liveHead(i, b, f, now); ok {
			b.budget--
			b.since = 0
			if fs.fair == fairShare {
				// SFQ: the virtual time is the start tag of the item
				// in service; the flow's next item starts where this
				// one finishes (corrections included, never before
				// the virtual time).
				fs.vtime = max(fs.vtime, f.start)
				f.finish = f.start + e.cost
				fs.maxFinish = max(fs.maxFinish, f.finish)
				f.start = max(fs.vtime, f.finish)
				if f.vtIdx >= 0 {
					fs.vt.fix(f)
				}
				fs.idleCheck()
			}
			bump(&b.dispatched)
			if f != run {
				if run != nil {
					run.dispatched.Store(run.dispatched.Load() + n)
				}
				run, n = f, 0
			}
			n++
			if fs.fair == fairRR {
				fs.turn(f)
			}
			d.dispatch(i, e.item)
			if b.gate == 1 && b.guarded && b.budget > 0 {
				d.regate(i, b)
			}
		} else if fs.fair == fairRR {
			fs.turn(f)
		}
	}
}

// turn ends the turn of f, the front of the round-robin list: it goes to
// the back if it still has items, and leaves the list if not.
func (fs *flows[T]) turn(f *flow[T]) {
	if f.len() == 0 {
		fs.rr.pop()
		f.inList = false
		return
	}
	if fs.rr.n > 1 {
		fs.rr.pop()
		fs.rr.push(f)
	}
}

// liveHead takes f's items until a live one, which it returns (ended in the
// counts: the caller dispatches it); the dead and expired ones it drops.
func (d *Dispatcher[T]) liveHead(i int, b *band[T], f *flow[T], now int64) (qentry[T], bool) {
	fs := b.flows
	for f.len() > 0 {
		e := f.pop()
		fs.took(f, now)
		b.endFlow(f)
		switch {
		case now >= e.due:
			d.drop(i, b, e.item, ErrExpired)
		case d.live != nil && !d.live(e.item):
			d.drop(i, b, e.item, ErrCancelled)
		default:
			return e, true
		}
	}
	return qentry[T]{}, false
}

// reapFlows removes the abandoned items of a flow band (after Abandon),
// keeping the others in their order. O(queued + known flows), paid only on
// ticks after an Abandon.
func (d *Dispatcher[T]) reapFlows(i int, b *band[T], now int64) {
	b.abandoned.Store(0)
	fs := b.flows
	for _, f := range fs.all {
		n := f.len()
		if n == 0 {
			continue
		}
		if f.edf {
			kept := f.heap[:0]
			for _, e := range f.heap {
				if d.gone(e.item) {
					b.endFlow(f)
					d.drop(i, b, e.item, ErrCancelled)
					continue
				}
				kept = append(kept, e)
			}
			clear(f.heap[len(kept):])
			f.heap = kept
			for k := len(kept)/2 - 1; k >= 0; k-- {
				siftDown(kept, k)
			}
		} else {
			for ; n > 0; n-- {
				e, _ := f.fifo.pop()
				if d.gone(e.item) {
					b.endFlow(f)
					d.drop(i, b, e.item, ErrCancelled)
					continue
				}
				f.fifo.push(e)
			}
		}
		if f.len() == 0 {
			fs.vt.remove(f)
			fs.ex.remove(f)
			f.last = now
		} else if fs.timed {
			fs.ex.fix(f)
		}
	}
}

// forget drops the flows that have held nothing for FlowIdle. A quarter of
// FlowIdle between sweeps keeps the sweep (O(known flows)) rare while a flow
// is forgotten at most 1.25 × FlowIdle after its last item. The count's
// compare-and-swap from 0 to deadFlow is what makes it race free with
// producers: a producer that counted first keeps the flow alive; one that
// counts after sees it dead and looks the id up again.
//
// Forgetting never changes what is released, only what is remembered: a
// flow is kept while its turn is still queued in the round-robin list (a
// returning flow would keep that place; a new one goes to the back) and,
// under fair-share, while its finish tag is ahead of the virtual time or a
// correction is pending (a returning flow would start later; a new one at
// the virtual time) — which ends with the busy period (see idleCheck); and
// while a Controller request of it is in flight (its done will charge it).
// So a
// host that skips ticks (Skip, Run's idle sleep), and so sweeps at other
// moments, releases exactly what continuous ticking releases.
func (fs *flows[T]) forget(now int64) {
	if now-fs.lastTick < fs.idle/4 {
		return
	}
	fs.lastTick = now
	for k := 0; k < len(fs.all); {
		f := fs.all[k]
		if f.len() != 0 || f.inList || f.finish > fs.vtime || f.charged.Load() || f.pins.Load() != 0 ||
			now-f.last < fs.idle || !f.count.CompareAndSwap(0, deadFlow) {
			k++
			continue
		}
		fs.ix.remove(f)
		fs.last.CompareAndSwap(f, nil)
		last := len(fs.all) - 1
		fs.all[k] = fs.all[last]
		fs.all[last] = nil
		fs.all = fs.all[:last]
	}
	fs.known.Store(int64(len(fs.all)))
}

// closeFlows ends every item of a flow band with ErrClosed (Close).
func (d *Dispatcher[T]) closeFlows(i int, b *band[T]) {
	fs := b.flows
	for _, f := range fs.all {
		for f.len() > 0 {
			e := f.pop()
			b.endFlow(f)
			d.drop(i, b, e.item, ErrClosed)
		}
		f.vtIdx, f.exIdx, f.inList = -1, -1, false
	}
	fs.vt.clear()
	clear(fs.ex.fs)
	fs.ex.fs = fs.ex.fs[:0]
	for {
		if _, ok := fs.rr.pop(); !ok {
			break
		}
	}
	for {
		e, ok := fs.ring.TryPop()
		if !ok {
			return
		}
		b.endFlow(e.flow)
		d.drop(i, b, e.item, ErrClosed)
	}
}

// FlowStats is one flow's part of Dispatcher.Flows.
type FlowStats struct {
	// Flow is the flow id (DefaultFlow for items enqueued without one).
	Flow string
	// Queued is the flow's items accepted and not yet ended.
	Queued int
	// Dispatched counts the flow's items released since the flow was
	// last created (a forgotten flow starts again from 0). It is brought
	// up to date as each run of the flow's releases in a tick ends, so
	// from inside Dispatch it may not yet count the current run.
	Dispatched uint64
}

// Flows returns a snapshot of the flows band currently knows (nil for an
// fcfs band or an unknown one), in no particular order. It allocates and
// walks every known flow: for scrapes, not for the hot path. It does not
// take the tick lock, so under concurrent use the figures are each read
// atomically but not at one instant.
func (d *Dispatcher[T]) Flows(band int) []FlowStats {
	if uint(band) >= uint(len(d.bands)) || d.bands[band].flows == nil {
		return nil
	}
	fs := d.bands[band].flows
	out := make([]FlowStats, 0, fs.known.Load())
	fs.ix.each(func(f *flow[T]) {
		if n := f.count.Load(); n >= 0 { // else forgotten
			out = append(out, FlowStats{Flow: f.id, Queued: int(n), Dispatched: f.dispatched.Load()})
		}
	})
	return out
}
