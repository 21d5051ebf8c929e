package flowcontrol

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// handle prototypes the API that issue 21 asks about for an open band
// that costs what a semaphore does: Wait's result returned by value
// instead of as a closure. It is the ticket and the generation that Wait's
// done func captures, so it needs no allocation, and Done keeps done's
// guarantees (a second Done, or one after the ticket was reused, does
// nothing: the generation no longer matches). It is not exported: as a
// public API it would be
//
//	type Permit struct{ ... }       // comparable, zero value = nothing held
//	func (p Permit) Done()
//	func (c *Controller) Acquire(ctx context.Context, band int) (Permit, error)
//
// beside Wait, which stays for the closure's convenience.
type handle struct {
	t   *ticket
	gen uint64
}

// Done releases the handle's in-flight slot once.
func (h handle) Done() {
	if h.t != nil {
		h.t.done(h.gen)
	}
}

// waitHandle is Wait returning a handle.
func (c *Controller) waitHandle(ctx context.Context, band int) (handle, error) {
	t, gen, err := c.acquire(ctx, band)
	return handle{t, gen}, err
}

// TestHandleIsAllocFreeAndIdempotent: the prototype keeps done's contract
// (in-flight counted once, a second Done a no-op even after the ticket has
// been reused) and allocates nothing where Wait allocates its closure.
func TestHandleIsAllocFreeAndIdempotent(t *testing.T) {
	c, err := NewController(ControllerConfig{Config: Config{Bands: []BandConfig{{Capacity: 4}}, Source: constSource(0.3)}, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Step()
	// The direct path needs Run's awake mark (a Stepped controller
	// queues every Wait until the next Step): set it as Run does.
	c.d.awake.Store(true)
	defer c.d.awake.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, not blocks
	defer cancel()
	h, err := c.waitHandle(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.InFlight() != 1 {
		t.Fatalf("in flight %d, want 1", c.InFlight())
	}
	h.Done()
	h2, err := c.waitHandle(ctx, 0) // may reuse h's ticket
	if err != nil {
		t.Fatal(err)
	}
	h.Done() // stale: must not release h2
	if c.InFlight() != 1 {
		t.Fatalf("a stale Done released another holder: in flight %d, want 1", c.InFlight())
	}
	h2.Done()
	h2.Done()
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d after both Done, want 0", c.InFlight())
	}
	if a := testing.AllocsPerRun(1000, func() {
		h, err := c.waitHandle(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		h.Done()
	}); a != 0 {
		t.Fatalf("handle: %v allocs per wait, want 0", a)
	}
	if a := testing.AllocsPerRun(1000, func() {
		done, err := c.Wait(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		done()
	}); a != 1 {
		t.Fatalf("Wait: %v allocs per wait, want 1 (its done func)", a)
	}
}

// constSource is a constant saturation.
type constSource float64

func (s constSource) Saturation() float64 { return float64(s) }

// BenchmarkOpenPathHandle prices the open path three ways in alternating
// rounds of one measurement (8 goroutines per P, as BenchmarkController):
// Wait + done, the by-value handle prototype, and
// x/sync/semaphore.Weighted Acquire + Release, on a running Controller at
// the shipped defaults (2 bands, saturation 0.3: both open). One op is one
// of each. wait-ratio and handle-ratio are the semaphore's time over
// theirs (1: as cheap as the semaphore).
func BenchmarkOpenPathHandle(b *testing.B) {
	c, err := NewController(ControllerConfig{Config: Config{
		Bands: []BandConfig{{Capacity: 4096}, {Capacity: 4096}}, Source: constSource(0.3),
	}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := c.Start(ctx)
	defer func() { c.Close(); <-ran; cancel() }()
	w := semaphore.NewWeighted(1 << 20)
	ops := []func(int){
		func(n int) {
			if done, err := c.Wait(ctx, n&1); err != nil {
				b.Error(err)
			} else {
				done()
			}
		},
		func(n int) {
			if h, err := c.waitHandle(ctx, n&1); err != nil {
				b.Error(err)
			} else {
				h.Done()
			}
		},
		func(int) {
			if err := w.Acquire(ctx, 1); err != nil {
				b.Error(err)
				return
			}
			w.Release(1)
		},
	}
	workers := 8 * runtime.GOMAXPROCS(0)
	const rounds = 10
	per := max(1, b.N/(rounds*workers))
	took := make([]time.Duration, len(ops))
	b.ReportAllocs()
	b.ResetTimer()
	for range rounds {
		for i, op := range ops {
			took[i] += round(workers, per, op)
		}
	}
	b.StopTimer()
	n := float64(rounds * workers * per)
	b.ReportMetric(float64(took[0])/n, "wait-ns")
	b.ReportMetric(float64(took[1])/n, "handle-ns")
	b.ReportMetric(float64(took[2])/n, "semaphore-ns")
	b.ReportMetric(float64(took[2])/float64(took[0]), "wait-ratio")
	b.ReportMetric(float64(took[2])/float64(took[1]), "handle-ratio")
}

// round runs op per times on each of workers goroutines and returns the
// wall time it took.
func round(workers, per int, op func(int)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				op(i)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}
