package flowcontrol_test

import (
	"context"
	"fmt"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// constSat is a fixed saturation reading.
type constSat float64

func (s constSat) Saturation() float64 { return float64(s) }

// Two bands at saturation 0.75: critical is open, so everything queued on it
// goes at once; sheddable is gated, one item (Burst) on one tick in three.
// Step drives time, so the output is deterministic.
func ExampleNewDispatcher() {
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[string]{Config: flowcontrol.Config{Bands: bandsOf(2, 16), Burst: 1, Source: constSat(0.75)}, Dispatch: func(band int, item string) { fmt.Printf("  band %d: %s\n", band, item) }})
	if err != nil {
		panic(err)
	}
	for i := 1; i <= 3; i++ {
		_ = d.Enqueue(0, fmt.Sprintf("critical-%d", i))
		_ = d.Enqueue(1, fmt.Sprintf("sheddable-%d", i))
	}
	for tick := 1; tick <= 3; tick++ {
		fmt.Printf("tick %d\n", tick)
		d.Step()
	}
	d.Close()
	// Output:
	// tick 1
	//   band 0: critical-1
	//   band 0: critical-2
	//   band 0: critical-3
	// tick 2
	// tick 3
	//   band 1: sheddable-1
}

// The soft-reflective ceiling for two bands: the sheddable band's ceiling
// and duty cycle as saturation rises. Critical is never gated.
func ExampleNewSoftReflective() {
	p := flowcontrol.NewSoftReflective()
	for _, s := range []float64{0, 0.5, 0.6, 0.75, 0.9, 1, 1.5} {
		c, sh := p.Gate(0, 2, s), p.Gate(1, 2, s)
		blocked := 100.0
		if sh.Every > 0 {
			blocked = 100 * float64(sh.Every-1) / float64(sh.Every)
		}
		fmt.Printf("s=%.2f critical every %d | sheddable ceiling %.2f every %d blocked %.1f%%\n",
			s, c.Every, sh.Ceiling, sh.Every, blocked)
	}
	// Output:
	// s=0.00 critical every 1 | sheddable ceiling 1.00 every 1 blocked 0.0%
	// s=0.50 critical every 1 | sheddable ceiling 0.50 every 1 blocked 0.0%
	// s=0.60 critical every 1 | sheddable ceiling 0.40 every 2 blocked 50.0%
	// s=0.75 critical every 1 | sheddable ceiling 0.25 every 3 blocked 66.7%
	// s=0.90 critical every 1 | sheddable ceiling 0.10 every 9 blocked 88.9%
	// s=1.00 critical every 1 | sheddable ceiling 0.00 every 0 blocked 100.0%
	// s=1.50 critical every 2 | sheddable ceiling 0.00 every 0 blocked 100.0%
}

// A proxy handler waits for its band's turn, then holds an in-flight slot
// until the request to the backend is finished.
func ExampleController() {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: []flowcontrol.BandConfig{
		{Name: "critical", Capacity: 128},
		{Name: "sheddable", Capacity: 128, MaxWait: 30 * time.Second},
	}, Source: constSat(0.2)}})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := c.Start(ctx) // running before it returns: no Wait sees ErrNotRunning

	handle := func(band int) error {
		p, err := c.Wait(ctx, band) // sleeps until released
		if err != nil {
			return err // ErrCancelled, ErrExpired, ErrQueueFull, ErrClosed, ErrNotRunning, ErrUnknownBand
		}
		defer p.Done()
		// ... forward the request to a model server ...
		fmt.Println("band", band, "released; in flight:", c.InFlight())
		return nil
	}
	_ = handle(0)
	_ = handle(1)
	fmt.Println("in flight after done:", c.InFlight())

	c.Close()
	fmt.Println("Run:", <-ran) // before stop(), so Run reports the Close
	stop()
	// Output:
	// band 0 released; in flight: 1
	// band 1 released; in flight: 1
	// in flight after done: 0
	// Run: flowcontrol: closed
}

func ExamplePolicyByName() {
	p, err := flowcontrol.PolicyByName("static-usage-limit-policy", map[string]float64{"threshold": 0.8})
	if err != nil {
		panic(err)
	}
	// A constant ceiling: every band open below the threshold, blocked at
	// it. (The dispatcher still releases band 0 every two ticks there,
	// unless Config.BlockCritical.)
	fmt.Println(p.Gate(0, 2, 0.3).Every, p.Gate(1, 2, 0.79).Every, p.Gate(0, 2, 0.8).Every, p.Gate(1, 2, 0.8).Every)
	// Output: 1 1 0 0
}
