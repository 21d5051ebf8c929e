package queue

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
)

// MaxCapacity is the largest capacity NewRing accepts. It keeps the cell
// array addressable on 32-bit platforms and the signed turn differences (at
// most 2·Cap apart) far from overflow; a flow-control queue anywhere near it
// is a configuration error.
const MaxCapacity = 1 << 30

// ErrCapacity is wrapped by the panic of NewRing and the error of
// CheckCapacity when a capacity is below 1 or above MaxCapacity.
var ErrCapacity = errors.New("queue: capacity out of range")

// cacheLinePad separates the producer and consumer positions. 128 bytes
// rather than 64: x86 spatial prefetchers pull cache lines in pairs, so two
// hot words 64 bytes apart still contend.
type cacheLinePad [128]byte

// cell is one slot of the ring. turn says whose move it is, for the position
// p that the cell serves next: 2p when the cell is empty and waits for the
// producer of p, 2p+1 when it is full and waits for the consumer of p. The
// consumer of p hands the cell on by storing 2(p+Cap), "empty for the position
// one lap later".
//
// Why 2p rather than Vyukov's original p / p+1: with capacity 1 the cell for p
// and the cell for p+1 are the same cell, so "full for p" (p+1) and "empty for
// p+1" (p+1) would collide; doubling keeps them apart (2p+1 vs 2p+2) for every
// capacity. Why 2p rather than 2·lap: turns are compared by signed difference
// of uint64 values, which is only sound when the turn sequence wraps together
// with the positions. 2p mod 2^64 does; 2·(p>>log2(Cap)) jumps back to 0 when p
// wraps while the cells still hold a turn near 2^(65-log2 Cap), and the ring
// would report full forever (after 2^64 operations, but a test can start
// there).
type cell[T any] struct {
	turn atomic.Uint64
	val  T
}

// Ring is a bounded multi-producer multi-consumer FIFO queue after Dmitry
// Vyukov's design: one sequence ("turn") number per cell and two positions
// that producers and consumers claim with a compare-and-swap. Operations never
// block and never allocate. The zero value is not usable; call NewRing.
//
// A push costs two locked instructions (the CAS that claims the position and
// the atomic store that publishes the cell) and so does a pop: four per item,
// the floor for an MPMC ring in Go, where every atomic store is a locked
// instruction. TryPopN claims a run of published cells with one CAS, which
// lowers the pop side to one store per item plus one CAS per batch.
//
// Preemption stall: a producer that has claimed a cell but not yet published
// it (because the Go scheduler or the OS descheduled it between the two
// steps) makes consumers see the ring as empty at that cell until it runs
// again, even if later cells are full. FIFO order is kept at the price of
// that stall, which lasts as long as the producer waits for a CPU, up to a
// scheduler time slice (see queue/README.md). A consumer must therefore
// treat a failed TryPop as "nothing available now", not as "the ring is
// empty" (Len tells those apart), and should not spin on it: a spinning
// consumer takes the CPU the stalled producer needs.
type Ring[T any] struct {
	_     cacheLinePad
	enq   atomic.Uint64 // next position to push; written only by producers
	_     cacheLinePad
	deq   atomic.Uint64 // next position to pop; written only by consumers
	_     cacheLinePad
	mask  uint64 // Cap-1: position&mask is the position's cell
	cells []cell[T]
}

// CheckCapacity reports whether NewRing accepts capacity. It returns an error
// wrapping ErrCapacity when capacity is below 1 or above MaxCapacity.
func CheckCapacity(capacity int) error {
	if capacity < 1 || capacity > MaxCapacity {
		return fmt.Errorf("%w: capacity %d is not in [1, %d]", ErrCapacity, capacity, MaxCapacity)
	}
	return nil
}

// NewRing returns an empty ring holding at least capacity items: the capacity
// is rounded up to a power of two so that a position maps to its cell with a
// mask. Like make with a negative length, NewRing panics when capacity is
// below 1 or above MaxCapacity; validate untrusted input with CheckCapacity.
func NewRing[T any](capacity int) *Ring[T] {
	if err := CheckCapacity(capacity); err != nil {
		panic(err)
	}
	n := uint64(1) << bits.Len(uint(capacity-1))
	r := &Ring[T]{mask: n - 1, cells: make([]cell[T], n)}
	// Cell i first serves position i: empty, turn 2i.
	for i := range r.cells {
		r.cells[i].turn.Store(uint64(i) << 1)
	}
	return r
}

// TryPush appends v and reports true, or reports false without blocking when
// the ring is full (or its oldest cell is still being emptied by a consumer).
func (r *Ring[T]) TryPush(v T) bool {
	pos := r.enq.Load()
	for {
		c := &r.cells[pos&r.mask]
		want := pos << 1 // empty, waiting for the producer of pos
		// Acquire: this load pairs with the consumer's release store of
		// turn, so once we see the cell empty the consumer's read of val
		// (and its clearing write) happened before our write below.
		turn := c.turn.Load()
		switch d := int64(turn - want); {
		case d == 0:
			// The cell is free for this position; claim the position.
			// Only the winner of the CAS touches val, so val needs no
			// atomic access of its own.
			if r.enq.CompareAndSwap(pos, pos+1) {
				c.val = v
				// Release: publishes val to the consumer whose acquire
				// load of turn observes want+1. Between the CAS and this
				// store the cell is claimed but unpublished: the window
				// of the preemption stall.
				c.turn.Store(want + 1)
				return true
			}
			pos = r.enq.Load()
		case d < 0:
			// The cell still holds (or is still being emptied of) the
			// item one lap back: the ring is full.
			return false
		default:
			// Another producer claimed pos and has already published it;
			// our view of enq is stale.
			pos = r.enq.Load()
		}
	}
}

// TryPop removes and returns the oldest item and true, or the zero value and
// false without blocking when the ring is empty (or its oldest cell is still
// being published by a producer).
func (r *Ring[T]) TryPop() (T, bool) {
	pos := r.deq.Load()
	for {
		c := &r.cells[pos&r.mask]
		want := pos<<1 + 1 // full, waiting for the consumer of pos
		// Acquire: pairs with the producer's release store, making its
		// write of val visible to our read below.
		turn := c.turn.Load()
		switch d := int64(turn - want); {
		case d == 0:
			if r.deq.CompareAndSwap(pos, pos+1) {
				v := c.val
				// Clear the slot so the ring does not keep the item (and
				// whatever it points to) alive until the cell is reused.
				var zero T
				c.val = zero
				// Release: hands the emptied cell to the producer one lap
				// later, after our read and clear of val.
				c.turn.Store((pos + r.mask + 1) << 1)
				return v, true
			}
			pos = r.deq.Load()
		case d < 0:
			// Not yet published for this position: empty, or stalled.
			var zero T
			return zero, false
		default:
			// Another consumer popped pos already; reload.
			pos = r.deq.Load()
		}
	}
}

// TryPopN removes up to len(dst) of the oldest items, stores them in order at
// the front of dst and returns how many it removed; 0 means the ring is empty
// (or its oldest cell is still being published) or dst is empty. It never
// blocks.
//
// The items are claimed with a single compare-and-swap on the dequeue
// position: the consumer counts the run of published cells from that position
// on, then claims the whole run at once. A run stops at the first cell not yet
// published, so order is kept. Slots of dst past the returned count are left
// as they were.
func (r *Ring[T]) TryPopN(dst []T) int {
	limit := uint64(min(len(dst), len(r.cells)))
	if limit == 0 {
		return 0
	}
	pos := r.deq.Load()
	for {
		// Count the published cells from pos on. Each acquire load pairs
		// with its producer's release store of turn.
		var n uint64
		var d int64
		for n < limit {
			p := pos + n
			d = int64(r.cells[p&r.mask].turn.Load() - (p<<1 + 1))
			if d != 0 {
				break
			}
			n++
		}
		if n == 0 && d < 0 {
			return 0 // not yet published: empty, or stalled
		}
		// The CAS succeeds only if no other consumer moved deq since we
		// loaded pos; deq only grows, so then none of the n cells can
		// have been popped (let alone refilled) behind our back, and the
		// loads above still describe them. They are ours until we hand
		// each back with its release store.
		if n > 0 && r.deq.CompareAndSwap(pos, pos+n) {
			var zero T
			for i := range n {
				c := &r.cells[(pos+i)&r.mask]
				dst[i] = c.val
				c.val = zero
				c.turn.Store((pos + i + r.mask + 1) << 1)
			}
			return int(n)
		}
		// Stale pos (another consumer got there first): reload.
		pos = r.deq.Load()
	}
}

// Len returns the number of items in the ring. Under concurrent use it is a
// snapshot that may be stale by the time it returns, and it counts cells that
// are claimed but not yet published or emptied; it is exact when the ring is
// quiescent. It is always between 0 and Cap.
func (r *Ring[T]) Len() int {
	// Load deq first. A consumer advances deq past p only after the
	// producer of p advanced enq past p, so deq <= enq at every instant,
	// and enq only grows: reading deq before enq can overstate the count
	// (capped at Cap below) but never make it negative. Reading them the
	// other way round could.
	deq := r.deq.Load()
	enq := r.enq.Load()
	n := enq - deq
	if c := uint64(len(r.cells)); n > c {
		return int(c)
	}
	return int(n)
}

// Cap returns the number of items the ring can hold: the requested capacity
// rounded up to a power of two.
func (r *Ring[T]) Cap() int { return len(r.cells) }
