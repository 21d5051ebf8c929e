package flowcontrol_test

import (
	"context"
	"fmt"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// A noisy tenant queues four requests before a quiet one sends its one: in
// a round-robin band the quiet tenant goes second, not fifth.
func ExampleDispatcher_EnqueueFlow() {
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[string]{
		Config: flowcontrol.Config{
			Bands:  []flowcontrol.BandConfig{{Capacity: 16, Fairness: flowcontrol.FairnessRoundRobin}},
			Source: constSat(0.2),
		},
		Dispatch: func(_ int, item string) { fmt.Print(item, " ") },
	})
	if err != nil {
		panic(err)
	}
	defer d.Close()
	for i := range 4 {
		_ = d.EnqueueFlow(0, "noisy", 1, time.Time{}, fmt.Sprint("noisy", i))
	}
	_ = d.EnqueueFlow(0, "quiet", 1, time.Time{}, "quiet0")
	d.Step()
	fmt.Println()
	// Output: noisy0 quiet0 noisy1 noisy2 noisy3
}

// A handler passes its tenant, an estimate of the request's cost and its
// deadline, and reports what it really served before done runs: the
// deferred done charges the tenant the difference.
func ExampleController_WaitRequest() {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands: []flowcontrol.BandConfig{
			{Name: "critical", Capacity: 64},
			{Name: "sheddable", Capacity: 256, Fairness: flowcontrol.FairnessShare, FlowCapacity: 32},
		},
		Source: constSat(0.2),
	}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx)

	handle := func(tenant string, promptTokens, maxTokens int) error {
		r := &flowcontrol.Request{Flow: tenant, Cost: float64(promptTokens + maxTokens)}
		p, err := c.WaitRequest(ctx, 1, r)
		if err != nil {
			return err // ErrFlowFull (a 429) when the tenant holds 32
		}
		defer p.Done()
		served := promptTokens + maxTokens/2 // ... proxy the request ...
		r.Served = float64(served)
		return nil
	}
	fmt.Println(handle("tenant-a", 100, 400))
	// Output: <nil>
}
