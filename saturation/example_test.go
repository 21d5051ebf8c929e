package saturation_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/flowgate/flowgate/saturation"
)

func ExampleValue() {
	var v saturation.Value // the zero value is ready: reads 0
	v.Set(0.7)
	fmt.Println(v.Saturation())
	v.Set(math.NaN()) // reported raw; the dispatcher reads NaN as 1
	fmt.Println(v.Saturation())
	// A NaN inside Max or Mean counts as 1: unknown is not idle.
	fmt.Println(saturation.Max(&v).Saturation())
	// Output:
	// 0.7
	// NaN
	// 1
}

func ExampleMax() {
	var kv, queue saturation.Value
	kv.Set(0.4)
	queue.Set(0.9)
	pool := saturation.Max(&kv, &queue, saturation.Func(func() float64 { return 0.2 }))
	fmt.Println(pool.Saturation())
	fmt.Println(saturation.Mean(&kv, &queue).Saturation())
	// Output:
	// 0.9
	// 0.65
}

func ExampleNewEWMA() {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	var raw saturation.Value
	smooth, err := saturation.NewEWMA(&raw, 100*time.Millisecond, clock)
	if err != nil {
		panic(err)
	}
	fmt.Println(smooth.Saturation()) // first sample: 0
	raw.Set(1)
	for i := 0; i < 3; i++ {
		now = now.Add(100 * time.Millisecond) // one half-life per read
		fmt.Println(smooth.Saturation())
	}
	// Output:
	// 0
	// 0.5
	// 0.75
	// 0.875
}

func ExampleInFlight() {
	inflight, err := saturation.NewInFlight(64) // e.g. 2 pods × 32 sequences
	if err != nil {
		panic(err)
	}
	// What a proxy does around each request (or the flowcontrol
	// Controller, given inflight as its InFlight field).
	for i := 0; i < 16; i++ {
		inflight.Inc()
	}
	inflight.Dec()
	fmt.Println(inflight.Count(), inflight.Saturation())
	// Output: 15 0.234375
}

func ExampleScorer() {
	now := time.Now()
	pods := []saturation.Reading{
		{Waiting: 2, KVUsage: 0.4, At: now, OK: true},  // max(2/5, 0.4/0.8) = 0.5
		{Waiting: 10, KVUsage: 0.1, At: now, OK: true}, // 10/5 = 2
		{}, // never scraped: 1
	}
	var s saturation.Scorer // the reference gateway's formula and defaults
	fmt.Printf("%.3f\n", s.Pool(pods, now))
	s.IgnoreStale = true
	fmt.Printf("%.3f\n", s.Pool(pods, now))
	// Output:
	// 1.167
	// 1.250
}

func ExampleParseMetrics() {
	body := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 3
vllm:num_requests_waiting{engine="1"} 1
vllm:num_requests_running{engine="0"} 12
vllm:gpu_cache_usage_perc{engine="0"} 0.5
vllm:gpu_cache_usage_perc{engine="1"} 0.7
`
	r, err := saturation.ParseMetrics(strings.NewReader(body), saturation.VLLM())
	fmt.Println(r.Waiting, r.Running, r.KVUsage, err)
	// Output: 4 12 0.7 <nil>
}

func ExamplePoller() {
	// A stand-in for a vLLM pod.
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_waiting 1\nvllm:num_requests_running 8\nvllm:kv_cache_usage_perc 0.6\n")
	}))
	defer pod.Close()

	p, err := saturation.NewPoller(saturation.PollerConfig{
		Endpoints: []string{pod.URL + "/metrics"},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	fmt.Println(p.Saturation()) // before any scrape: fail safe

	// In a server: go p.Run(ctx), or p.Start() ... p.Close().
	if err := p.Scrape(context.Background()); err != nil {
		panic(err)
	}
	fmt.Printf("%.2f\n", p.Saturation()) // max(1/5, 0.6/0.8)
	// Output:
	// 1
	// 0.75
}

// The host tells the poller when it sends a request to a pod and when the
// request ends; the saturation moves at once, between scrapes, with atomics
// only.
func ExamplePoller_Dispatched() {
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.2\n")
	}))
	defer pod.Close()
	ep := pod.URL + "/metrics"
	p, err := saturation.NewPoller(saturation.PollerConfig{
		Endpoints: []string{ep},
		Scorer:    saturation.Scorer{InFlightCredit: true},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if err := p.Scrape(context.Background()); err != nil {
		panic(err)
	}
	fmt.Printf("reading %d: %.2f\n", p.ReadingSeq(), p.Saturation()) // max(1/5, 0.2/0.8)

	// Five requests sent since that scrape: the pod shows 3 (waiting +
	// running), so 2 more count as waiting: (1 + 2) / 5.
	for range 5 {
		p.Dispatched(ep)
	}
	fmt.Printf("reading %d: %.2f\n", p.ReadingSeq(), p.Saturation())
	for range 5 {
		p.Finished(ep) // in a proxy: when the response is done
	}
	fmt.Printf("reading %d: %.2f\n", p.ReadingSeq(), p.Saturation())
	// Output:
	// reading 1: 0.25
	// reading 1: 0.60
	// reading 1: 0.25
}
