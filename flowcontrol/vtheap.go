package flowcontrol

// vtHeap is fair-share's order of a band's backlogged flows: an indexed
// min-heap on (virtual start tag, activation order), each flow knowing its
// place (flow.vtIdx). Tick only.
//
// Why not a binary heap of *flow comparing through the pointers: with many
// flows every item of a fair-share band activates, releases and retires a
// flow, and each sift compared keys two pointer loads away, cache misses
// that dominated the heap's time with many flows. Here the keys sit in the
// heap's own array (a comparison touches no flow; only a move writes the
// moved flow's index), the heap is 4-ary (half the depth of a binary one,
// and a node's four children share one or two cache lines), and sifts move
// a hole instead of swapping (a removal's bottom-up: see downLeaf). A
// flow's order never changes while it is in the heap; its start tag
// changes only through fix.
type vtHeap[T any] struct {
	h []vtItem[T]
}

// vtItem is one flow in the heap with a copy of its key.
type vtItem[T any] struct {
	start float64
	order uint64
	f     *flow[T]
}

func (a *vtItem[T]) less(b *vtItem[T]) bool {
	return a.start < b.start || a.start == b.start && a.order < b.order
}

func (h *vtHeap[T]) len() int { return len(h.h) }

// top returns the flow with the smallest key (the heap must not be empty).
func (h *vtHeap[T]) top() *flow[T] { return h.h[0].f }

// push adds f (not in the heap) with its current start tag and order.
func (h *vtHeap[T]) push(f *flow[T]) {
	h.h = append(h.h, vtItem[T]{})
	h.up(len(h.h)-1, vtItem[T]{start: f.start, order: f.order, f: f})
}

// fix restores the order after f.start changed (f must be in the heap).
func (h *vtHeap[T]) fix(f *flow[T]) {
	i := int(f.vtIdx)
	h.h[i].start = f.start
	if len(h.h) == 1 {
		return // alone (a one-flow band's every release): nothing to reorder
	}
	it := h.h[i]
	if i > 0 && it.less(&h.h[(i-1)/4]) {
		h.up(i, it)
	} else {
		h.down(i, it)
	}
}

// remove takes f out of the heap if it is there.
func (h *vtHeap[T]) remove(f *flow[T]) {
	i := int(f.vtIdx)
	if i < 0 {
		return
	}
	f.vtIdx = -1
	n := len(h.h) - 1
	last := h.h[n]
	h.h[n] = vtItem[T]{}
	h.h = h.h[:n]
	if i < n {
		if i > 0 && last.less(&h.h[(i-1)/4]) {
			h.up(i, last)
		} else {
			h.downLeaf(i, last)
		}
	}
}

// clear empties the heap, forgetting every flow's place.
func (h *vtHeap[T]) clear() {
	for k := range h.h {
		h.h[k].f.vtIdx = -1
	}
	clear(h.h)
	h.h = h.h[:0]
}

// up moves the hole at i towards the root until it fits, then fills it.
func (h *vtHeap[T]) up(i int, it vtItem[T]) {
	for i > 0 {
		p := (i - 1) / 4
		if !it.less(&h.h[p]) {
			break
		}
		h.h[i] = h.h[p]
		h.h[i].f.vtIdx = int32(i)
		i = p
	}
	h.h[i] = it
	it.f.vtIdx = int32(i)
}

// down moves the hole at i towards the leaves until it fits, then fills it.
func (h *vtHeap[T]) down(i int, it vtItem[T]) {
	n := len(h.h)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for k := c + 1; k < min(c+4, n); k++ {
			if h.h[k].less(&h.h[m]) {
				m = k
			}
		}
		if !h.h[m].less(&it) {
			break
		}
		h.h[i] = h.h[m]
		h.h[i].f.vtIdx = int32(i)
		i = m
	}
	h.h[i] = it
	it.f.vtIdx = int32(i)
}

// downLeaf is down for an it that was a leaf (remove's former last item),
// by Floyd's bottom-up method: the hole first goes all the way down, each
// level's smallest child moving up into it (three comparisons a level, none
// against it), then it rises from the leaf to its place. A former leaf
// belongs near the bottom, so the rise is short and this saves a quarter of
// the comparisons of down. (fix uses down: a flow just served may well stay
// near the top.) it must not be less than i's parent.
func (h *vtHeap[T]) downLeaf(i int, it vtItem[T]) {
	n := len(h.h)
	start := i
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for k := c + 1; k < min(c+4, n); k++ {
			if h.h[k].less(&h.h[m]) {
				m = k
			}
		}
		h.h[i] = h.h[m]
		h.h[i].f.vtIdx = int32(i)
		i = m
	}
	for i > start {
		p := (i - 1) / 4
		if !it.less(&h.h[p]) {
			break
		}
		h.h[i] = h.h[p]
		h.h[i].f.vtIdx = int32(i)
		i = p
	}
	h.h[i] = it
	it.f.vtIdx = int32(i)
}
