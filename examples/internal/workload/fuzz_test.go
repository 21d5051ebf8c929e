package workload

import (
	"math"
	"strings"
	"testing"
)

// FuzzNewGenerator fuzzes NewGenerator's validation (rate, CV and a custom
// workload's means and critical share): invalid input is a "workload: "
// error; a generator it returns draws arrivals at increasing times with
// 1 ≤ Input, 1 ≤ Output and Input+Output ≤ MaxModelLen, whatever the means.
func FuzzNewGenerator(f *testing.F) {
	f.Add(16.0, DefaultCV, Codegen.InputMean, Codegen.OutputMean, Codegen.CriticalShare, uint64(1))
	f.Add(0.7, 0.0, Reasoning.InputMean, Reasoning.OutputMean, 0.5, uint64(2))
	f.Add(0.0, 0.5, 10.0, 10.0, 0.5, uint64(3))
	f.Add(math.Inf(1), math.NaN(), 0.5, 1.0, 2.0, uint64(4))
	f.Add(1.0, 0.5, 20000.0, 20000.0, 1.0, uint64(5)) // means near the context limit
	f.Add(1.0, 3.0, 1e300, 1.0, 0.0, uint64(6))       // a mean whose 4× clamp overflows int
	f.Fuzz(func(t *testing.T, qps, cv, inMean, outMean, share float64, seed uint64) {
		w := Workload{Name: "fuzz", InputMean: inMean, OutputMean: outMean, CriticalShare: share}
		g, err := NewGenerator(w, qps, cv, seed, 1)
		valid := qps > 0 && !math.IsInf(qps, 0) && cv >= 0 && !math.IsInf(cv, 0) &&
			inMean >= 1 && outMean >= 1 && share >= 0 && share <= 1
		if valid != (err == nil) {
			t.Fatalf("NewGenerator(%+v, qps %v, cv %v): %v; model says valid=%v", w, qps, cv, err, valid)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "workload: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
			return
		}
		var last Arrival
		for i := range 50 {
			a := g.Next()
			if a.Input < 1 || a.Output < 1 || a.Input+a.Output > MaxModelLen {
				t.Fatalf("arrival %d of %+v: %+v", i, w, a)
			}
			if i > 0 && a.At < last.At {
				t.Fatalf("arrival %d at %v before %v", i, a.At, last.At)
			}
			last = a
		}
	})
}
