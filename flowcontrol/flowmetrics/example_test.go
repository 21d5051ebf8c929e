package flowmetrics_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

// Make the collector, install it as the controller's outcome hook, bind it,
// register it: every Wait is then counted and timed.
func Example() {
	col, err := flowmetrics.New(2, flowmetrics.Options{BandNames: []string{"critical", "sheddable"}})
	if err != nil {
		panic(err)
	}
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Config: flowcontrol.Config{
			Bands:  []flowcontrol.BandConfig{{Name: "critical", Capacity: 64}, {Name: "sheddable", Capacity: 64}},
			Source: &satValue{},
		},
		OnOutcome: col.OnOutcome,
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if err := col.Bind(c); err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col) // serve reg with promhttp.HandlerFor

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx)
	p, err := c.Wait(ctx, 0)
	if err != nil {
		panic(err)
	}
	p.Done()

	fams, _ := reg.Gather()
	for _, f := range fams {
		if f.GetName() == "flowgate_requests_total" {
			for _, m := range f.GetMetric() {
				if m.GetCounter().GetValue() > 0 {
					fmt.Println(f.GetName(), m.GetLabel()[0].GetValue(), m.GetLabel()[1].GetValue(), m.GetCounter().GetValue())
				}
			}
		}
	}
	// Output: flowgate_requests_total critical dispatched 1
}
