package llmd_test

import (
	"fmt"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/llmd"
)

// setSat is a saturation reading the example sets.
type setSat struct{ v float64 }

func (s *setSat) Saturation() float64 { return s.v }

// Two bands under llm-d's soft-reflective policy. Each Cycle dispatches at most
// one item, band 0 first; at saturation 1 the cycle halts at band 0, so nothing
// goes, critical included.
func ExampleNewDispatcher() {
	sat := &setSat{0.3}
	d, err := llmd.NewDispatcher(llmd.DispatcherConfig[string]{
		Bands:    []flowcontrol.BandConfig{{Name: "critical", Capacity: 8}, {Name: "sheddable", Capacity: 8}},
		Policy:   llmd.NewSoftReflective(),
		Source:   sat,
		Dispatch: func(band int, item string) { fmt.Printf("  band %d: %s\n", band, item) },
	})
	if err != nil {
		panic(err)
	}
	_ = d.Enqueue(1, "batch-1")
	_ = d.Enqueue(1, "batch-2")
	_ = d.Enqueue(0, "ide-1")
	for cycle := 1; cycle <= 3; cycle++ {
		fmt.Printf("cycle %d\n", cycle)
		d.Cycle()
	}
	sat.v = 1
	_ = d.Enqueue(0, "ide-2")
	fmt.Printf("s=1: halted %v, dispatched %v, critical queued %d\n", d.Halted(), d.Cycle(), d.Len(0))
	// Output:
	// cycle 1
	//   band 0: ide-1
	// cycle 2
	//   band 1: batch-1
	// cycle 3
	//   band 1: batch-2
	// s=1: halted true, dispatched false, critical queued 1
}

// llm-d's soft-reflective ceilings for two bands over successive cycles. At
// s = 0.75 band 1 is in the duty cycle, period 3: closed, closed, open. At s = 1
// band 0 keeps the ceiling 1.0, which halts it too (saturation >= ceiling), where
// flowgate's soft-reflective policy leaves band 0 open.
func ExampleNewSoftReflective() {
	p := llmd.NewSoftReflective()
	ceilings := make([]float64, 2)
	for range 3 {
		p.ComputeLimit(0.75, ceilings)
		fmt.Printf("s=0.75 counter %d ceilings %v\n", p.Counter(), ceilings)
	}
	p.ComputeLimit(1, ceilings)
	fmt.Printf("s=1 ceilings %v: band 0 halted %v\n", ceilings, 1 >= ceilings[0])
	fmt.Printf("flowgate at s=1: band 0 every %d\n", flowcontrol.NewSoftReflective().Gate(0, 2, 1).Every)
	// Output:
	// s=0.75 counter 1 ceilings [1 0]
	// s=0.75 counter 2 ceilings [1 0]
	// s=0.75 counter 3 ceilings [1 1]
	// s=1 ceilings [1 0]: band 0 halted true
	// flowgate at s=1: band 0 every 1
}

// llm-d's static policy: one threshold for every band. At the threshold an empty
// band 0 still halts the cycle, so band 1's item waits (head-of-line block).
func ExampleNewStatic() {
	sat := &setSat{0.8}
	d, err := llmd.NewDispatcher(llmd.DispatcherConfig[string]{
		Bands:    []flowcontrol.BandConfig{{Capacity: 4}, {Capacity: 4}},
		Policy:   llmd.NewStatic(0.8),
		Source:   sat,
		Dispatch: func(band int, item string) { fmt.Printf("  band %d: %s\n", band, item) },
	})
	if err != nil {
		panic(err)
	}
	_ = d.Enqueue(1, "batch")
	fmt.Println("s=0.80 dispatched:", d.Cycle())
	sat.v = 0.79
	fmt.Println("s=0.79 dispatched:", d.Cycle())
	fmt.Printf("cycles %d, band 1 dispatched %d\n", d.Stats().Cycles, d.Stats().Bands[1].Dispatched)
	// Output:
	// s=0.80 dispatched: false
	//   band 1: batch
	// s=0.79 dispatched: true
	// cycles 2, band 1 dispatched 1
}

// The duty-cycle period of llm-d's soft-reflective policy.
func ExamplePeriod() {
	for _, s := range []float64{0.5, 0.6, 0.65, 0.75, 0.8, 0.9, 0.99} {
		fmt.Printf("s=%.2f period %d\n", s, llmd.Period(s))
	}
	// Output:
	// s=0.50 period 1
	// s=0.60 period 1
	// s=0.65 period 2
	// s=0.75 period 3
	// s=0.80 period 4
	// s=0.90 period 9
	// s=0.99 period 99
}

// A host on a virtual clock skips the cycles on which nothing can be dispatched:
// Skip advances the policy's shared counter exactly as that many cycles would.
func ExampleDispatcher_Skip() {
	p := llmd.NewSoftReflective()
	d, err := llmd.NewDispatcher(llmd.DispatcherConfig[int]{
		Bands:    []flowcontrol.BandConfig{{Capacity: 4}, {Capacity: 4}},
		Policy:   p,
		Source:   &setSat{0.75},
		Dispatch: func(band, item int) { fmt.Printf("  band %d: item %d\n", band, item) },
	})
	if err != nil {
		panic(err)
	}
	if d.Empty() {
		d.Skip(1000) // a second of 1 ms ticks with nothing queued
	}
	fmt.Println("counter", p.Counter(), "cycles", d.Stats().Cycles)
	_ = d.Enqueue(1, 7)
	for !d.Cycle() {
		fmt.Println("closed at counter", p.Counter())
	}
	// Output:
	// counter 1000 cycles 1000
	// closed at counter 1001
	//   band 1: item 7
}
