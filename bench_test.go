// Benchmarks for flowgate, one file so that a single run compares each
// component with its baseline on the same machine at the same moment:
//
//	go test -run '^$' -bench . -benchmem -count=6 . | tee new.txt
//	go run golang.org/x/perf/cmd/benchstat@latest new.txt
package flowgate_test

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/queue"
)

// ---- queue (issue: ring queue) ----

// Queue benchmarks. One iteration is one SUCCESSFUL push plus one SUCCESSFUL
// pop: a TryPush or TryPop that fails is retried, never counted (counting
// failed attempts makes a stalled ring look fast while it moves nothing).
// Every queue has the same capacity. The parallel shape has each goroutine
// push then pop, so a pop always has an item coming and nobody deadlocks.
//
// Locked instructions (LOCK-prefixed or XCHG on amd64) per push+pop:
//   - Ring: 4 (push: CAS enq + store turn; pop: CAS deq + store turn). That
//     is the floor for an MPMC ring in Go, where every atomic store is an
//     XCHG: each side must claim its position (CAS) and hand the cell over
//     (store). Nothing else is locked: the turn and position loads are plain
//     MOVs. So the ring sits at the floor; at ~9.5 ns per spsc pair on the
//     2-core dev machine (~2.4 ns per locked instruction, about what an
//     uncontended locked op costs on that CPU) the four are most of the cost.
//   - Ring with TryPopN, batch of k: 3 + 1/k (one CAS claims k cells).
//   - Channel: a lock/unlock pair on each side (about 4) plus the runtime's
//     bookkeeping around them.
//   - MutexQueue: Lock (CAS) + Unlock (XADD) per side: 4, with the critical
//     section serialised.

const benchCap = 1024

// spinsBeforeYield is how many failed attempts a benchmark goroutine spins
// before it yields its P to whoever it waits for.
const spinsBeforeYield = 4

func ringPush[T any](r *queue.Ring[T], v T) {
	for spins := 0; !r.TryPush(v); spins++ {
		if spins >= spinsBeforeYield {
			runtime.Gosched()
		}
	}
}

func ringPop[T any](r *queue.Ring[T]) T {
	for spins := 0; ; spins++ {
		if v, ok := r.TryPop(); ok {
			return v
		}
		if spins >= spinsBeforeYield {
			runtime.Gosched()
		}
	}
}

func BenchmarkRing(b *testing.B) {
	b.Run("spsc", func(b *testing.B) {
		r := queue.NewRing[int](benchCap)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			ringPush(r, i)
			if ringPop(r) != i {
				b.Fatal("out of order")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		r := queue.NewRing[int](benchCap)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				ringPush(r, i)
				ringPop(r)
			}
		})
	})
	// burst and batch have the dispatcher's shape: a run of pushes, then
	// the consumer drains it. burst pops one at a time; batch claims the
	// run with TryPopN. Compare the two with each other.
	const burstLen = 16
	b.Run("burst", func(b *testing.B) {
		r := queue.NewRing[int](benchCap)
		b.ReportAllocs()
		b.ResetTimer()
		for n := 0; n < b.N; n += burstLen {
			k := min(burstLen, b.N-n)
			for i := range k {
				ringPush(r, i)
			}
			for range k {
				ringPop(r)
			}
		}
	})
	b.Run("batch", func(b *testing.B) {
		r := queue.NewRing[int](benchCap)
		dst := make([]int, burstLen)
		b.ReportAllocs()
		b.ResetTimer()
		for n := 0; n < b.N; n += burstLen {
			k := min(burstLen, b.N-n)
			for i := range k {
				ringPush(r, i)
			}
			for got := 0; got < k; {
				m := r.TryPopN(dst[:k-got])
				if m == 0 {
					runtime.Gosched()
				}
				got += m
			}
		}
	})
}

func BenchmarkChannel(b *testing.B) {
	b.Run("spsc", func(b *testing.B) {
		ch := make(chan int, benchCap)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			ch <- i
			if <-ch != i {
				b.Fatal("out of order")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		ch := make(chan int, benchCap)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				ch <- i
				<-ch
			}
		})
	})
}

// mutexQueue is the baseline: a slice used as a ring, behind one mutex.
type mutexQueue[T any] struct {
	mu      sync.Mutex
	buf     []T
	head, n int
}

func newMutexQueue[T any](capacity int) *mutexQueue[T] {
	return &mutexQueue[T]{buf: make([]T, capacity)}
}

func (q *mutexQueue[T]) TryPush(v T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == len(q.buf) {
		return false
	}
	q.buf[(q.head+q.n)%len(q.buf)] = v
	q.n++
	return true
}

func (q *mutexQueue[T]) TryPop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var zero T
	if q.n == 0 {
		return zero, false
	}
	v := q.buf[q.head]
	q.buf[q.head] = zero
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return v, true
}

func mutexPush[T any](q *mutexQueue[T], v T) {
	for spins := 0; !q.TryPush(v); spins++ {
		if spins >= spinsBeforeYield {
			runtime.Gosched()
		}
	}
}

func mutexPop[T any](q *mutexQueue[T]) T {
	for spins := 0; ; spins++ {
		if v, ok := q.TryPop(); ok {
			return v
		}
		if spins >= spinsBeforeYield {
			runtime.Gosched()
		}
	}
}

func BenchmarkMutexQueue(b *testing.B) {
	b.Run("spsc", func(b *testing.B) {
		q := newMutexQueue[int](benchCap)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			mutexPush(q, i)
			if mutexPop(q) != i {
				b.Fatal("out of order")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		q := newMutexQueue[int](benchCap)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				mutexPush(q, i)
				mutexPop(q)
			}
		})
	})
}

// BenchmarkRingStall measures the preemption stall: 64 producer goroutines
// (far more than cores) push into one ring whose single consumer spins
// without ever sleeping or yielding. Each producer keeps one item in flight
// (it pushes the next only after the consumer took the previous one), so the
// ring never fills and an item's wait is not queueing behind a full ring: it
// is the time from just before its successful TryPush to its TryPop. The
// tail is dominated by producers preempted between claiming a cell and
// publishing it, which hides every later item from the consumer until the
// scheduler runs that producer again. b.N is the number of items.
func BenchmarkRingStall(b *testing.B) {
	const producers = 64
	type stamped struct {
		producer int
		at       int64 // ns since base, taken just before the TryPush
	}
	r := queue.NewRing[stamped](benchCap)
	base := time.Now()
	waits := make([]int64, b.N)
	var tickets atomic.Int64 // items left to hand out to producers
	tickets.Store(int64(b.N))
	type ackSlot struct {
		taken atomic.Bool
		_     [63]byte
	}
	acks := make([]ackSlot, producers)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for p := range producers {
		wg.Go(func() {
			for tickets.Add(-1) >= 0 {
				acks[p].taken.Store(false)
				for {
					if r.TryPush(stamped{p, int64(time.Since(base))}) {
						break
					}
					runtime.Gosched()
				}
				for !acks[p].taken.Load() {
					runtime.Gosched()
				}
			}
		})
	}
	// maxStall is the longest run of failed TryPops that began while Len
	// was above 0, i.e. while the head cell was claimed but unpublished.
	var maxStall int64
	for i := range waits {
		var it stamped
		var stallFrom int64 = -1
		for {
			var ok bool
			if it, ok = r.TryPop(); ok {
				break
			}
			if stallFrom < 0 && r.Len() > 0 {
				stallFrom = int64(time.Since(base))
			}
		}
		now := int64(time.Since(base))
		waits[i] = now - it.at
		if stallFrom >= 0 {
			maxStall = max(maxStall, now-stallFrom)
		}
		acks[it.producer].taken.Store(true)
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(waits)
	q := func(f float64) float64 { return float64(waits[int(f*float64(len(waits)-1))]) }
	b.ReportMetric(q(0.50), "p50-wait-ns")
	b.ReportMetric(q(0.99), "p99-wait-ns")
	b.ReportMetric(q(0.999), "p99.9-wait-ns")
	b.ReportMetric(float64(waits[len(waits)-1]), "max-wait-ns")
	b.ReportMetric(float64(maxStall), "max-stall-ns")
}

// ---- flowcontrol ----

// ---- saturation ----
