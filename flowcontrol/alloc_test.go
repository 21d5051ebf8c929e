package flowcontrol_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// TestHotPathAllocFree: the hot path allocates nothing in steady state —
// the policies' Gate and Sanitize for any input; the Dispatcher's Enqueue,
// Step (reading the source, gating every band, expiring, dispatching) and
// Poll; the refusals (queue full, unknown band); and a Controller.Wait
// released on an open band and its Permit's Done, at the shipped defaults
// with Run ticking on its own goroutine. The benchmarks (bench_test.go, ---- flowcontrol)
// report the same with b.ReportAllocs; this test makes it a failure.
func TestHotPathAllocFree(t *testing.T) {
	soft, static := flowcontrol.NewSoftReflective(), flowcontrol.NewStatic(0.8)
	hold, err := flowcontrol.NewPriorityHoldback(0.4, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	holdFixed, err := flowcontrol.NewPriorityHoldbackCeilings([]float64{1, 0.8, 0.6, 0.3})
	if err != nil {
		t.Fatal(err)
	}
	inputs := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, 0.5, 0.75, 1, 3}
	var sink int
	if a := testing.AllocsPerRun(100, func() {
		for _, s := range inputs {
			for band := range 4 {
				sink += soft.Gate(band, 4, s).Every + static.Gate(band, 4, s).Every
				sink += hold.Gate(band, 4, s).Every + holdFixed.Gate(band, 4, s).Every
			}
			sink += int(flowcontrol.Sanitize(s))
		}
	}); a != 0 {
		t.Errorf("policies: %v allocations per run", a)
	}
	_ = sink

	clk := newFakeClock()
	sat := newSat(0.7)
	dispatched := 0
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(4, 64, []time.Duration{0, time.Second, 10 * time.Millisecond, time.Millisecond}...), Burst: 4, Source: sat, Now: clk.Now}, Dispatch: func(int, int) { dispatched++ }, OnDrop: func(int, int, error) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	i := 0
	if a := testing.AllocsPerRun(1000, func() {
		for band := range 4 {
			_ = d.Enqueue(band, i)
		}
		i++
		sat.Set([]float64{0.2, 0.7, 0.95, math.NaN(), 1.5}[i%5])
		d.Step()
		_ = d.Enqueue(0, i)
		d.Flush()
		if err := d.Enqueue(9, i); !errors.Is(err, flowcontrol.ErrUnknownBand) {
			t.Fatal(err)
		}
		clk.Advance(500 * time.Microsecond)
	}); a != 0 {
		t.Errorf("dispatcher Enqueue/Step/Poll: %v allocations per run", a)
	}
	if dispatched == 0 {
		t.Fatal("nothing dispatched: the loop did not exercise the hot path")
	}

	// A full band refuses without allocating.
	full, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(1, 1), Source: sat}, Dispatch: func(int, int) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	_ = full.Enqueue(0, 1)
	if a := testing.AllocsPerRun(1000, func() {
		if err := full.Enqueue(0, 2); !errors.Is(err, flowcontrol.ErrQueueFull) {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("ErrQueueFull: %v allocations per run", a)
	}

	if raceEnabled {
		t.Log("race detector on: sync.Pool drops tickets at random; Controller.Wait not measured")
		return
	}
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 64), Source: newSat(0.3)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := c.Start(ctx)
	n := 0
	wait := func() {
		n++
		p, err := c.Wait(context.Background(), n&1) // both bands open at 0.3
		if err != nil {
			t.Fatal(err)
		}
		p.Done()
	}
	for range 100 {
		wait() // warm the ticket pool
	}
	a := testing.AllocsPerRun(1000, wait)
	cancel()
	<-runDone
	c.Close()
	if a != 0 {
		t.Errorf("Controller.Wait released on an open band: %v allocations per Wait, want 0", a)
	}
}
