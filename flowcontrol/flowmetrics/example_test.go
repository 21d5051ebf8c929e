package flowmetrics_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

// Register a controller's metrics and time its waits through the collector.
func Example() {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Bands: 2, Capacity: 64, Source: &satValue{},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	col, err := flowmetrics.New(c, 2, flowmetrics.Options{BandNames: []string{"critical", "sheddable"}})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col) // serve reg with promhttp.HandlerFor

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	done, err := col.Wait(ctx, c, 0) // instead of c.Wait: also observes the wait time
	if err != nil {
		panic(err)
	}
	done()

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
