package queue

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
)

// MaxCapacity is the largest capacity NewRing accepts. It keeps the cell
// array addressable on every platform and the turn arithmetic far from
// overflow; a flow-control queue anywhere near it is a configuration error.
const MaxCapacity = 1 << 30

// ErrCapacity is wrapped by the panic of NewRing and the error of
// CheckCapacity when a capacity is below 1 or above MaxCapacity.
var ErrCapacity = errors.New("queue: capacity out of range")

// cacheLinePad separates the producer and consumer positions. 128 bytes
// rather than 64: x86 spatial prefetchers pull cache lines in pairs, so two
// hot words 64 bytes apart still contend.
type cacheLinePad [128]byte

// cell is one slot of the ring. turn says whose move it is: 2·lap when the
// cell is empty and waits for the producer of that lap, 2·lap+1 when it is
// full and waits for the consumer of that lap.
type cell[T any] struct {
	turn atomic.Uint64
	val  T
}

// Ring is a bounded multi-producer multi-consumer FIFO queue after Dmitry
// Vyukov's design: one sequence ("turn") number per cell and two positions
// that producers and consumers claim with a compare-and-swap. Operations never
// block and never allocate. The zero value is not usable; call NewRing.
//
// A producer that has claimed a cell but not yet published it (for example,
// because it was preempted between the two steps) makes consumers see the
// ring as empty at that cell until it resumes, even if later cells are full:
// FIFO order is kept at the price of that stall. See the package benchmarks.
type Ring[T any] struct {
	_     cacheLinePad
	enq   atomic.Uint64 // next position to push; written only by producers
	_     cacheLinePad
	deq   atomic.Uint64 // next position to pop; written only by consumers
	_     cacheLinePad
	mask  uint64
	shift uint // log2(capacity): position >> shift is the lap
	cells []cell[T]
}

// CheckCapacity reports whether NewRing accepts capacity. It returns an error
// wrapping ErrCapacity when capacity is below 1 or above MaxCapacity.
func CheckCapacity(capacity int) error {
	if capacity < 1 || capacity > MaxCapacity {
		return fmt.Errorf("%w: %d is not in [1, %d]", ErrCapacity, capacity, MaxCapacity)
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
	shift := uint(bits.Len(uint(capacity - 1)))
	n := uint64(1) << shift
	// Every cell starts at turn 0: empty, waiting for the producer of lap 0.
	return &Ring[T]{mask: n - 1, shift: shift, cells: make([]cell[T], n)}
}

// TryPush appends v and reports true, or reports false without blocking when
// the ring is full.
func (r *Ring[T]) TryPush(v T) bool {
	pos := r.enq.Load()
	for {
		c := &r.cells[pos&r.mask]
		want := (pos >> r.shift) << 1 // empty, this lap
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
				// load of turn observes want+1.
				c.turn.Store(want + 1)
				return true
			}
			pos = r.enq.Load()
		case d < 0:
			// The cell still holds (or is still being emptied of) the
			// item from the previous lap: the ring is full.
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
		want := (pos>>r.shift)<<1 + 1 // full, this lap
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
				// Release: hands the emptied cell to the producer of the
				// next lap, after our read and clear of val.
				c.turn.Store(want + 1)
				return v, true
			}
			pos = r.deq.Load()
		case d < 0:
			// Not yet published for this lap: empty.
			var zero T
			return zero, false
		default:
			pos = r.deq.Load()
		}
	}
}

// Len returns the number of items in the ring. Under concurrent use it is a
// snapshot that may be stale by the time it returns, and it counts cells that
// are claimed but not yet published or emptied; it is exact when the ring is
// quiescent. It is always between 0 and Cap.
func (r *Ring[T]) Len() int {
	// Load deq first: it only grows, so reading it before enq can make
	// the difference too large (clamped below) but never negative in
	// steady state; the clamp guards the remaining races.
	deq := r.deq.Load()
	enq := r.enq.Load()
	n := int64(enq - deq)
	if n < 0 {
		return 0
	}
	if c := int64(len(r.cells)); n > c {
		return int(c)
	}
	return int(n)
}

// Cap returns the number of items the ring can hold: the requested capacity
// rounded up to a power of two.
func (r *Ring[T]) Cap() int { return len(r.cells) }
