package flowcontrol

// held is a FIFO of entries the tick goroutine has taken out of a band's
// ring but not yet ended: the head, popped to look at its deadline (a ring
// has no peek), and the survivors of a reap (see Dispatcher.Abandon).
// Everything in held was popped before anything still in the ring, so taking
// from held first keeps the band FIFO. Only the goroutine holding
// Dispatcher.mu touches it: no atomics.
type held[T any] struct {
	buf   []entry[T]
	start int
	n     int
}

// push appends e. The buffer grows by doubling; it never holds more than the
// band's Capacity, so after warm-up a push does not allocate.
func (h *held[T]) push(e entry[T]) {
	if h.n == len(h.buf) {
		buf := make([]entry[T], max(4, 2*len(h.buf)))
		for i := 0; i < h.n; i++ {
			buf[i] = h.buf[(h.start+i)%len(h.buf)]
		}
		h.buf, h.start = buf, 0
	}
	h.buf[(h.start+h.n)%len(h.buf)] = e
	h.n++
}

// pop removes and returns the oldest entry, clearing its slot so the buffer
// does not keep the item alive.
func (h *held[T]) pop() (entry[T], bool) {
	if h.n == 0 {
		return entry[T]{}, false
	}
	e := h.buf[h.start]
	h.buf[h.start] = entry[T]{}
	h.start = (h.start + 1) % len(h.buf)
	h.n--
	return e, true
}

// front returns the band's oldest queued entry without removing it, moving
// it from the ring into held if held is empty.
func (b *band[T]) front() (*entry[T], bool) {
	if b.held.n == 0 {
		e, ok := b.ring.TryPop()
		if !ok {
			return nil, false
		}
		b.held.push(e)
	}
	return &b.held.buf[b.held.start], true
}

// take removes and returns the band's oldest queued entry: from held first,
// then from the ring.
func (b *band[T]) take() (entry[T], bool) {
	if e, ok := b.held.pop(); ok {
		return e, true
	}
	return b.ring.TryPop()
}

// pushFront puts a re-queued entry (see Dispatcher.Requeue) at the front,
// behind only the entries with an earlier deadline: expiry looks at the
// head alone, so deadlines must stay in order. With no deadlines it is the
// very front. Like push, it grows the buffer by doubling.
func (h *held[T]) pushFront(e entry[T]) {
	if h.n == len(h.buf) {
		h.push(e) // grow (e lands at the back) ...
		h.n--     // ... then take it back off
		h.buf[(h.start+h.n)%len(h.buf)] = entry[T]{}
	}
	h.start = (h.start + len(h.buf) - 1) % len(h.buf)
	h.n++
	i := 0
	for ; i+1 < h.n && h.buf[(h.start+i+1)%len(h.buf)].due < e.due; i++ {
		h.buf[(h.start+i)%len(h.buf)] = h.buf[(h.start+i+1)%len(h.buf)]
	}
	h.buf[(h.start+i)%len(h.buf)] = e
}
