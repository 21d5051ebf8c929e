package cluster

import (
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/workload"
)

// BenchmarkRun measures the simulator's speed on an overloaded point (codegen@24, two
// minutes of arrivals, soft-reflective): simulated requests per wall-clock second.
func BenchmarkRun(b *testing.B) {
	b.ReportAllocs()
	c := Config{Workload: workload.Codegen, QPS: 24, Policy: SoftReflective, Duration: 2 * time.Minute, Seed: 1, CV: -1}
	reqs := 0
	for b.Loop() {
		r, err := Run(c)
		if err != nil {
			b.Fatal(err)
		}
		reqs += r.Critical.Requests + r.Sheddable.Requests
	}
	b.ReportMetric(float64(reqs)/b.Elapsed().Seconds(), "requests/s")
}
