package queue_test

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"unsafe"
	"weak"

	"github.com/flowgate/flowgate/queue"
)

func TestNewRingRejectsCapacity(t *testing.T) {
	for _, capacity := range []int{0, -1, math.MinInt, queue.MaxCapacity + 1, math.MaxInt} {
		err := queue.CheckCapacity(capacity)
		if !errors.Is(err, queue.ErrCapacity) {
			t.Errorf("CheckCapacity(%d) = %v, want an error wrapping ErrCapacity", capacity, err)
		}
		rec := recoverFrom(func() { queue.NewRing[int](capacity) })
		recErr, ok := rec.(error)
		if !ok || !errors.Is(recErr, queue.ErrCapacity) {
			t.Errorf("NewRing(%d) panicked with %v (%T), want an error wrapping ErrCapacity", capacity, rec, rec)
			continue
		}
		if msg := recErr.Error(); !strings.HasPrefix(msg, "queue: ") || !strings.Contains(msg, "capacity") {
			t.Errorf("NewRing(%d) panic message %q should start with \"queue: \" and name the capacity", capacity, msg)
		}
	}
	for _, capacity := range []int{1, 2, 1000, queue.MaxCapacity} {
		if err := queue.CheckCapacity(capacity); err != nil {
			t.Errorf("CheckCapacity(%d) = %v, want nil", capacity, err)
		}
	}
}

func recoverFrom(f func()) (rec any) {
	defer func() { rec = recover() }()
	f()
	return nil
}

func TestNewRingRoundsUp(t *testing.T) {
	for capacity, want := range map[int]int{1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 1000: 1024, 1024: 1024} {
		if got := queue.NewRing[int](capacity).Cap(); got != want {
			t.Errorf("NewRing(%d).Cap() = %d, want %d", capacity, got, want)
		}
	}
}

// roundTrip pushes vals through a ring of capacity 4 (so they wrap around
// several times) and requires each to come back equal and in order, through
// TryPop and TryPopN alternately.
func roundTrip[T comparable](t *testing.T, vals []T) {
	t.Helper()
	r := queue.NewRing[T](4)
	var got []T
	dst := make([]T, 3)
	for i := 0; i < len(vals); {
		for i < len(vals) && r.TryPush(vals[i]) {
			i++
		}
		if v, ok := r.TryPop(); ok {
			got = append(got, v)
		}
		n := r.TryPopN(dst)
		got = append(got, dst[:n]...)
	}
	for {
		v, ok := r.TryPop()
		if !ok {
			break
		}
		got = append(got, v)
	}
	if len(got) != len(vals) {
		t.Fatalf("got %d items back, pushed %d", len(got), len(vals))
	}
	for i := range vals {
		if got[i] != vals[i] {
			t.Fatalf("item %d came back as %v, pushed %v", i, got[i], vals[i])
		}
	}
}

type smallStruct struct {
	ID    uint32
	Band  uint8
	Ready bool
}

// bigStruct is 256 bytes: a cell's value is far wider than one word, so a
// torn or partial copy would show.
type bigStruct struct {
	Head [8]uint64
	Body [192]byte
}

func TestElementTypes(t *testing.T) {
	const n = 50
	t.Run("small struct", func(t *testing.T) {
		vals := make([]smallStruct, n)
		for i := range vals {
			vals[i] = smallStruct{ID: uint32(i) * 7919, Band: uint8(i % 3), Ready: i%2 == 0}
		}
		roundTrip(t, vals)
	})
	t.Run("pointer", func(t *testing.T) {
		vals := make([]*smallStruct, n)
		for i := range vals {
			vals[i] = &smallStruct{ID: uint32(i)}
		}
		roundTrip(t, vals) // pointer identity, not just equal contents
	})
	t.Run("string", func(t *testing.T) {
		vals := make([]string, n)
		for i := range vals {
			vals[i] = strings.Repeat(string(rune('a'+i%26)), i)
		}
		roundTrip(t, vals)
	})
	t.Run("256-byte struct", func(t *testing.T) {
		if got := int(unsafe.Sizeof(bigStruct{})); got != 256 {
			t.Fatalf("bigStruct is %d bytes, want 256", got)
		}
		vals := make([]bigStruct, n)
		for i := range vals {
			for j := range vals[i].Head {
				vals[i].Head[j] = uint64(i)<<32 | uint64(j)
			}
			for j := range vals[i].Body {
				vals[i].Body[j] = byte(i*31 + j)
			}
		}
		roundTrip(t, vals)
	})
}

type payload struct {
	buf [64]byte
	_   *payload // a pointer field keeps it out of the tiny allocator
}

// TestPopReleasesItem shows from outside that a popped item is not kept alive
// by the ring (which stays alive), while an item still queued is.
func TestPopReleasesItem(t *testing.T) {
	r := queue.NewRing[*payload](2)
	w := pushPayload(r)
	runtime.GC()
	if w.Value() == nil {
		t.Fatal("a queued item was collected: the test cannot see retention")
	}
	popAndDrop(t, r)
	runtime.GC()
	if w.Value() != nil {
		t.Error("a popped item is still reachable from the ring")
	}
	runtime.KeepAlive(r)
}

//go:noinline
func pushPayload(r *queue.Ring[*payload]) weak.Pointer[payload] {
	p := &payload{}
	p.buf[0] = 42
	if !r.TryPush(p) {
		panic("push to an empty ring failed")
	}
	return weak.Make(p)
}

//go:noinline
func popAndDrop(t *testing.T, r *queue.Ring[*payload]) {
	p, ok := r.TryPop()
	if !ok || p.buf[0] != 42 {
		t.Fatalf("TryPop() = %v, %v", p, ok)
	}
}
