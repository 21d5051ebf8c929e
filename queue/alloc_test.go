package queue_test

import (
	"testing"

	"github.com/flowgate/flowgate/queue"
)

// TestRingAllocFree: TryPush, TryPop, TryPopN, Len and a refused push or pop
// allocate nothing (the ring is allocated once, by NewRing).
func TestRingAllocFree(t *testing.T) {
	r := queue.NewRing[[2]int](8)
	dst := make([][2]int, 4)
	if a := testing.AllocsPerRun(1000, func() {
		for i := range 8 {
			r.TryPush([2]int{i, i})
		}
		r.TryPush([2]int{}) // full: refused
		_ = r.Len()
		r.TryPopN(dst)
		for range 5 {
			r.TryPop()
		}
	}); a != 0 {
		t.Errorf("%v allocations per run", a)
	}
	if _, ok := r.TryPop(); ok {
		t.Fatal("ring not drained: the loop did not do what it claims")
	}
}
