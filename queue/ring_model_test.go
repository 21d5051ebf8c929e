package queue

import (
	"testing"

	"github.com/emirpasic/gods/v2/queues/arrayqueue"
	"pgregory.net/rapid"
)

// newRingAt returns an empty ring whose positions start at start instead of
// 0, as if start items had already passed through it. It lets the model test
// cross the 2^64 wrap of the positions (and of the turns) directly.
func newRingAt[T any](capacity int, start uint64) *Ring[T] {
	r := NewRing[T](capacity)
	r.enq.Store(start)
	r.deq.Store(start)
	for p := start; p != start+uint64(len(r.cells)); p++ {
		r.cells[p&r.mask].turn.Store(p << 1) // empty, waiting for the producer of p
	}
	return r
}

// ringMachine drives a Ring and a FIFO model (gods' arrayqueue) with the same
// operations and requires identical answers.
type ringMachine struct {
	r     *Ring[int]
	model *arrayqueue.Queue[int]
	cap   int
	next  int // pushed values are 0, 1, 2, ... so order errors show
}

func (m *ringMachine) push(t *rapid.T) {
	v := m.next
	ok := m.r.TryPush(v)
	if want := m.model.Size() < m.cap; ok != want {
		t.Fatalf("TryPush(%d) = %v with %d of %d items held", v, ok, m.model.Size(), m.cap)
	}
	if ok {
		m.model.Enqueue(v)
		m.next++
	}
}

func (m *ringMachine) pop(t *rapid.T) {
	got, ok := m.r.TryPop()
	want, wantOK := m.model.Dequeue()
	if ok != wantOK || got != want {
		t.Fatalf("TryPop() = %d, %v; model says %d, %v", got, ok, want, wantOK)
	}
}

// Push pushes one value.
func (m *ringMachine) Push(t *rapid.T) { m.push(t) }

// Pop pops one value.
func (m *ringMachine) Pop(t *rapid.T) { m.pop(t) }

// PushMany pushes up to three laps' worth, so that fills past Cap are tried
// and long runs wrap around many times.
func (m *ringMachine) PushMany(t *rapid.T) {
	for range rapid.IntRange(0, 3*m.cap).Draw(t, "pushes") {
		m.push(t)
	}
}

// PopMany pops up to three laps' worth, past empty.
func (m *ringMachine) PopMany(t *rapid.T) {
	for range rapid.IntRange(0, 3*m.cap).Draw(t, "pops") {
		m.pop(t)
	}
}

// PopN pops a batch into a buffer that may be shorter or longer than the
// content and than Cap.
func (m *ringMachine) PopN(t *rapid.T) {
	const sentinel = -1
	dst := make([]int, rapid.IntRange(0, 2*m.cap+1).Draw(t, "len(dst)"))
	for i := range dst {
		dst[i] = sentinel
	}
	n := m.r.TryPopN(dst)
	if want := min(len(dst), m.model.Size()); n != want {
		t.Fatalf("TryPopN(len %d) = %d with %d items held; want %d", len(dst), n, m.model.Size(), want)
	}
	for i := range n {
		want, _ := m.model.Dequeue()
		if dst[i] != want {
			t.Fatalf("TryPopN item %d = %d, want %d", i, dst[i], want)
		}
	}
	for i := n; i < len(dst); i++ {
		if dst[i] != sentinel {
			t.Fatalf("TryPopN wrote dst[%d] = %d past its count %d", i, dst[i], n)
		}
	}
}

// Check runs after every action.
func (m *ringMachine) Check(t *rapid.T) {
	if got, want := m.r.Len(), m.model.Size(); got != want {
		t.Fatalf("Len() = %d, model holds %d", got, want)
	}
	if got := m.r.Cap(); got != m.cap {
		t.Fatalf("Cap() = %d, want %d", got, m.cap)
	}
}

// nextPow2 is the model of NewRing's rounding, written independently of it.
func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

func TestRingModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.OneOf(
			rapid.SampledFrom([]int{1, 2, 3, 4, 5, 8}),
			rapid.IntRange(1, 70),
		).Draw(t, "capacity")
		c := nextPow2(capacity)
		// Start at 0, just before the 2^64 wrap of the positions, or
		// anywhere.
		start := rapid.OneOf(
			rapid.Just(uint64(0)),
			rapid.Custom(func(t *rapid.T) uint64 {
				return -uint64(rapid.IntRange(0, 4*c).Draw(t, "before wrap"))
			}),
			rapid.Uint64(),
		).Draw(t, "start")
		m := &ringMachine{r: newRingAt[int](capacity, start), model: arrayqueue.New[int](), cap: c}
		t.Repeat(rapid.StateMachineActions(m))
	})
}

// TestPoppedCellsCleared looks inside the ring: a popped cell must not keep
// its item (or what the item points to) reachable.
func TestPoppedCellsCleared(t *testing.T) {
	r := NewRing[*int](4)
	for lap := range 3 {
		for i := range 4 {
			v := lap*4 + i
			if !r.TryPush(&v) {
				t.Fatalf("push %d failed", v)
			}
		}
		if _, ok := r.TryPop(); !ok {
			t.Fatal("pop failed")
		}
		dst := make([]*int, 3)
		if n := r.TryPopN(dst); n != 3 {
			t.Fatalf("TryPopN = %d, want 3", n)
		}
		for i := range r.cells {
			if p := r.cells[i].val; p != nil {
				t.Fatalf("lap %d: cell %d still holds %d after pop", lap, i, *p)
			}
		}
	}
}
