package cluster

// eventHeap is a binary min-heap of events in compareEvents order, written out for the
// one element type (the event loop spends a fifth of its time here).
type eventHeap struct{ a []event }

func (h *eventHeap) empty() bool { return len(h.a) == 0 }

func (h *eventHeap) push(e event) {
	h.a = append(h.a, e)
	i := len(h.a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if compareEvents(h.a[p], e) <= 0 {
			break
		}
		h.a[i] = h.a[p]
		i = p
	}
	h.a[i] = e
}

func (h *eventHeap) pop() event {
	top := h.a[0]
	n := len(h.a) - 1
	last := h.a[n]
	h.a = h.a[:n]
	if n == 0 {
		return top
	}
	i := 0
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && compareEvents(h.a[r], h.a[c]) < 0 {
			c = r
		}
		if compareEvents(last, h.a[c]) <= 0 {
			break
		}
		h.a[i] = h.a[c]
		i = c
	}
	h.a[i] = last
	return top
}
