// Benchmarks for flowgate, one file so that a single run compares each
// component with its baseline on the same machine at the same moment:
//
//	go test -run '^$' -bench . -benchmem -count=6 . | tee new.txt
//	go run golang.org/x/perf/cmd/benchstat@latest new.txt
package flowgate_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// ---- queue (issue: ring queue) ----

// ---- flowcontrol ----

// benchSat is a constant saturation source.
type benchSat float64

func (s benchSat) Saturation() float64 { return float64(s) }

var gateSink flowcontrol.Gate

// BenchmarkPolicy times one Gate call (target < 10 ns, 0 allocs) over a mix
// of bands and saturations, dead zone and throttled.
func BenchmarkPolicy(b *testing.B) {
	sats := [8]float64{0, 0.3, 0.55, 0.6, 0.75, 0.9, 1.2, 0.45}
	for _, bc := range []struct {
		name string
		p    flowcontrol.CeilingPolicy
	}{
		{"static", flowcontrol.NewStatic(1)},
		{"soft-reflective", flowcontrol.NewSoftReflective()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			p := bc.p
			var g flowcontrol.Gate
			for i := 0; b.Loop(); i++ {
				g = p.Gate(i&3, 4, sats[i&7])
			}
			gateSink = g
		})
	}
}

// BenchmarkDispatcher measures Enqueue plus the share of Step that releases
// the item: per op one Enqueue, and a Step every 256 items with Burst 256
// (targets: 0 allocs/op, ≥ 10 M items/s).
func BenchmarkDispatcher(b *testing.B) {
	const batch = 256
	var n int
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
		Bands: 2, Capacity: 2 * batch, Burst: batch, Source: benchSat(0.3),
		Dispatch: func(_, item int) { n += item & 1 },
	})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	b.ReportAllocs()
	start := time.Now()
	i := 0
	for b.Loop() {
		if err := d.Enqueue(i&1, i); err != nil {
			b.Fatal(err)
		}
		i++
		if i%batch == 0 {
			d.Step()
		}
	}
	d.Step()
	b.ReportMetric(float64(i)/time.Since(start).Seconds(), "items/s")
}

// BenchmarkController measures parallel Wait + done round trips through a
// running Controller (targets: ≤ 2 allocs per Wait, ≥ 500 k waits/s on 2
// cores). Burst is raised to 4096 per 1 ms tick so the band's rate cap
// (4 M/s) is not what is measured.
func BenchmarkController(b *testing.B) {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Bands: 2, Capacity: 4096, Burst: 4096, Source: benchSat(0.3),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	b.ReportAllocs()
	b.SetParallelism(8)
	var waits atomic.Int64
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		wctx := context.Background()
		var n int64
		for pb.Next() {
			done, err := c.Wait(wctx, int(n&1))
			if err != nil {
				b.Error(err)
				return
			}
			done()
			n++
		}
		waits.Add(n)
	})
	b.ReportMetric(float64(waits.Load())/time.Since(start).Seconds(), "waits/s")
	c.Close()
	<-ran
	cancel()
}

// BenchmarkDispatcherWake measures, at low load (one item in the system at
// a time) with Run going on the default tick, the time from Enqueue to the
// Dispatch callback, next to the tick length: the wake-on-enqueue path means
// an item on an open band does not wait for the next tick. Burst is raised so
// the per-tick budget never binds (that is the throttling path, not wake-up).
func BenchmarkDispatcherWake(b *testing.B) {
	got := make(chan time.Duration, 1)
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[time.Time]{
		Bands: 1, Capacity: 16, Burst: 1 << 20, Source: benchSat(0),
		Dispatch: func(_ int, t time.Time) { got <- time.Since(t) },
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = d.Run(ctx) }()
	d.Step() // open the band now rather than a tick later
	lat := make([]time.Duration, 0, 1<<16)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Enqueue(0, time.Now()); err != nil {
			b.Fatal(err)
		}
		l := <-got
		if len(lat) < cap(lat) {
			lat = append(lat, l)
		} else {
			lat[n%len(lat)] = l // keep the most recent samples
		}
		n++
	}
	cancel()
	wg.Wait()
	d.Close()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) }
	b.ReportMetric(pct(0.5), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
	b.ReportMetric(float64(d.Tick()), "tick-ns")
}

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
