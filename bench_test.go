// Benchmarks for flowgate, one file so that a single run compares each
// component with its baseline on the same machine at the same moment:
//
//	go test -run '^$' -bench . -benchmem -count=6 . | tee new.txt
//	go run golang.org/x/perf/cmd/benchstat@latest new.txt
package flowgate_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flowgate/flowgate/saturation"
)

// ---- queue (issue: ring queue) ----

// ---- flowcontrol ----

// ---- saturation ----

// BenchmarkSaturation measures what the dispatcher pays per tick to read the
// saturation signal. Every case must report 0 allocs/op.
func BenchmarkSaturation(b *testing.B) {
	var sink float64
	b.Run("value", func(b *testing.B) {
		var v saturation.Value
		v.Set(0.7)
		b.ReportAllocs()
		for b.Loop() {
			sink += v.Saturation()
		}
	})
	b.Run("max-value-inflight", func(b *testing.B) {
		var v saturation.Value
		v.Set(0.7)
		inflight, err := saturation.NewInFlight(64)
		if err != nil {
			b.Fatal(err)
		}
		src := saturation.Max(&v, inflight)
		b.ReportAllocs()
		for b.Loop() {
			sink += src.Saturation()
		}
	})
	b.Run("ewma", func(b *testing.B) {
		var v saturation.Value
		v.Set(0.7)
		e, err := saturation.NewEWMA(&v, 100*time.Millisecond, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			sink += e.Saturation()
		}
	})
	b.Run("poller", func(b *testing.B) {
		// Two pods served over real HTTP, scraped every millisecond while
		// the loop reads: the read must stay one atomic load.
		pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_waiting 2\nvllm:num_requests_running 8\nvllm:kv_cache_usage_perc 0.5\n")
		}))
		defer pod.Close()
		p, err := saturation.NewPoller(saturation.PollerConfig{
			Endpoints: []string{pod.URL + "/a/metrics", pod.URL + "/b/metrics"},
			Interval:  time.Millisecond,
			Timeout:   time.Second,
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		b.ReportAllocs()
		for b.Loop() {
			sink += p.Saturation()
		}
	})
	if sink < 0 {
		b.Fatal("negative saturation")
	}
}
