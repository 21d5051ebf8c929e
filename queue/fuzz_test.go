package queue_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/flowgate/flowgate/queue"
)

// FuzzCheckCapacity: CheckCapacity refuses exactly the capacities outside
// [1, MaxCapacity], with an ErrCapacity error prefixed "queue: "; for an
// accepted capacity (small enough to allocate here) NewRing's Cap is the
// next power of two, the ring takes exactly Cap items, then refuses, and
// gives them back in order.
func FuzzCheckCapacity(f *testing.F) {
	for _, c := range []int{1, 2, 3, 1000, 1024, 1025, 0, -1, queue.MaxCapacity, queue.MaxCapacity + 1} {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, capacity int) {
		err := queue.CheckCapacity(capacity)
		valid := capacity >= 1 && capacity <= queue.MaxCapacity
		if valid != (err == nil) {
			t.Fatalf("CheckCapacity(%d) = %v", capacity, err)
		}
		if err != nil {
			if !errors.Is(err, queue.ErrCapacity) || !strings.HasPrefix(err.Error(), "queue: ") {
				t.Fatalf("CheckCapacity(%d) = %q, want a queue: ErrCapacity", capacity, err)
			}
			return
		}
		if capacity > 1<<12 {
			return
		}
		r := queue.NewRing[int](capacity)
		c := r.Cap()
		if c < capacity || c >= 2*capacity && c != 1 || c&(c-1) != 0 {
			t.Fatalf("NewRing(%d).Cap() = %d", capacity, c)
		}
		for i := range c {
			if !r.TryPush(i) {
				t.Fatalf("push %d of %d refused", i, c)
			}
		}
		if r.TryPush(-1) || r.Len() != c {
			t.Fatalf("full ring of %d: accepted more, or Len %d", c, r.Len())
		}
		for i := range c {
			if v, ok := r.TryPop(); !ok || v != i {
				t.Fatalf("pop %d: %d, %v", i, v, ok)
			}
		}
		if _, ok := r.TryPop(); ok {
			t.Fatal("pop from an empty ring succeeded")
		}
	})
}
