package main

import "github.com/flowgate/flowgate/examples/internal/cluster"

// BoundThroughput is the share of none's throughput the step-time bound keeps.
const BoundThroughput = 0.97

// stepBounds returns, per seed of the point, the step-time bound in ms: the
// critical TTFT p99 no gateway can beat while the pool keeps BoundThroughput of
// none's token rate (cluster.StepBound), from the line of step duration on batch
// size fitted over that seed's floor and none steps (the floor spreads the
// batches low, none high). A seed whose line cannot reach the rate is left out;
// ok is false without both the floor and none, or with no seed left.
func stepBounds(pt point) ([]float64, bool) {
	fl, no := pt.by[cluster.Floor], pt.by[cluster.None]
	if len(fl) == 0 || len(fl) != len(no) {
		return nil, false
	}
	var out []float64
	for i := range no {
		a, b, ok := fl[i].StepStats.Merge(no[i].StepStats).Line()
		if !ok {
			continue
		}
		if _, _, ms, ok := cluster.StepBound(a, b, no[i].StepStats.Rate, BoundThroughput); ok {
			out = append(out, ms)
		}
	}
	return out, len(out) > 0
}
