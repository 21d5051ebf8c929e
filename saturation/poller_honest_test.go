package saturation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

// vllmPage43KB is a /metrics page of the size and shape a vLLM server
// serves (about 43 KB: the three gauges the scorer reads among histograms
// of latencies and token counts, per model and engine), with waiting 0 and
// KV usage 0.4, so that it scores 0.5.
var vllmPage43KB = sync.OnceValue(func() []byte {
	var b strings.Builder
	b.WriteString("# HELP vllm:num_requests_running Number of requests in model execution batches.\n")
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	b.WriteString("vllm:num_requests_running{engine=\"0\",model_name=\"qwen3-14b\"} 3.0\n")
	b.WriteString("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n")
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\n")
	b.WriteString("vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen3-14b\"} 0.0\n")
	b.WriteString("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n")
	b.WriteString("# TYPE vllm:kv_cache_usage_perc gauge\n")
	b.WriteString("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"qwen3-14b\"} 0.4\n")
	hists := []string{"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
		"request_queue_time_seconds", "request_inference_time_seconds", "request_prefill_time_seconds",
		"request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
		"iteration_tokens_total", "request_max_num_generation_tokens", "request_params_n"}
	for i := 0; b.Len() < 43_000; i++ {
		name := "vllm:" + hists[i%len(hists)]
		if i >= len(hists) {
			name += "_" + strconv.Itoa(i/len(hists))
		}
		fmt.Fprintf(&b, "# HELP %s Histogram of %s.\n# TYPE %s histogram\n", name, hists[i%len(hists)], name)
		for k, le := range []string{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
			"0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"} {
			fmt.Fprintf(&b, "%s_bucket{engine=\"0\",le=\"%s\",model_name=\"qwen3-14b\"} %d.0\n", name, le, 1000+k*37)
		}
		fmt.Fprintf(&b, "%s_count{engine=\"0\",model_name=\"qwen3-14b\"} 1703.0\n", name)
		fmt.Fprintf(&b, "%s_sum{engine=\"0\",model_name=\"qwen3-14b\"} 4711.25\n", name)
	}
	return []byte(b.String())
})

// Kinds of failing pod in the honest-scale tests, by pod index modulo 3.
const (
	failStatus = iota // answers 500
	failBody          // answers 200 with an HTML page
	failHang          // never answers (the scrape times out)
)

// scalePool serves n pods from one loopback server, pod i at
// /pod/i/metrics: the healthy ones serve vllmPage43KB (score 0.5); every
// tenth pod fails (when failing is set), in turn with a 500, an HTML body or
// by hanging until the scrape gives up. It returns the URLs and the set of
// failing ones.
func scalePool(t testing.TB, n int, failing bool) ([]string, map[string]bool) {
	t.Helper()
	page := vllmPage43KB()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/pod/")
		i, err := strconv.Atoi(strings.TrimSuffix(rest, "/metrics"))
		if !ok || err != nil {
			http.NotFound(w, r)
			return
		}
		if failing && i%10 == 0 {
			switch (i / 10) % 3 {
			case failStatus:
				http.Error(w, "engine dead", http.StatusInternalServerError)
			case failBody:
				io.WriteString(w, "<html><body>502 Bad Gateway</body></html>\n")
			case failHang:
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(page)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	eps := make([]string, n)
	bad := map[string]bool{}
	for i := range eps {
		eps[i] = fmt.Sprintf("%s/pod/%d/metrics", srv.URL, i)
		if failing && i%10 == 0 {
			bad[eps[i]] = true
		}
	}
	return eps, bad
}

// honestPods is the pool size of the honest-scale tests: 1,000 pods under
// FLOWGATE_FULL=1, 100 otherwise, 50 under the race detector (which slows a
// scrape about tenfold: there the tests check the accounting under
// concurrency, at the defaults scaled by raceSlowdown; see honestConfig).
func honestPods(t testing.TB) int {
	t.Helper()
	if raceSlowdown > 1 {
		t.Logf("race detector: 50 pods, the default Interval, Timeout and Staleness ×%d", raceSlowdown)
		return 50
	}
	if fullSize() {
		t.Logf("full size (FLOWGATE_FULL=1): 1000 pods")
		return 1000
	}
	t.Logf("default size: 100 pods (FLOWGATE_FULL=1 runs 1000)")
	return 100
}

// honestConfig is the default configuration over eps, with Interval,
// Timeout and Staleness scaled by raceSlowdown (1 without the race
// detector: the defaults themselves).
func honestConfig(eps []string) PollerConfig {
	if raceSlowdown == 1 {
		return PollerConfig{Endpoints: eps}
	}
	return PollerConfig{Endpoints: eps, Interval: DefaultInterval * raceSlowdown,
		Timeout: DefaultTimeout * raceSlowdown, Scorer: Scorer{Staleness: DefaultStaleness * raceSlowdown}}
}

// cpuHog keeps every P of this process busy with a spinning goroutine (a
// gateway shares its node with other work) until the test ends.
func cpuHog(t testing.TB) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for x := uint64(1); !stop.Load(); x = x*6364136223846793005 + 1 {
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
}

// poolSample is what one look at the pool found.
type poolSample struct {
	usable, healthy int // usable healthy pods, healthy pods
	// timedOut: healthy pods not usable by the poller's own rule for a pod
	// that does not answer (its last ceil(Staleness/Interval) scrapes in a
	// row failed, or every scrape it had, so no good reading is held; the
	// last by the effective timeout), scoring 1. On a
	// starved machine a loopback pod can miss its timeout that often; what
	// the poller must never do is judge a healthy pod stale otherwise.
	timedOut   int
	badScored1 int // failing pods not usable, scoring 1
	bad        int // failing pods
	timeouts   int // healthy pods whose last scrape timed out
	sat        float64
	why        map[string]int // healthy pods not usable, by reason and error
}

func samplePool(p *Poller, bad map[string]bool) poolSample {
	var s poolSample
	missK := p.missK
	s.sat = p.Saturation()
	for _, r := range p.Readings() {
		if bad[r.Endpoint] {
			s.bad++
			if !r.Usable && r.Score == 1 {
				s.badScored1++
			}
			continue
		}
		s.healthy++
		if r.Usable {
			s.usable++
		} else if (r.Failures >= missK || !r.OK && int64(r.Failures) == r.Scrapes) &&
			errors.Is(r.Err, context.DeadlineExceeded) && r.Score == 1 {
			s.timedOut++
		} else {
			if s.why == nil {
				s.why = map[string]int{}
			}
			e := ""
			if r.Err != nil {
				e = r.Err.Error()
				if i := strings.LastIndex(e, ": "); i >= 0 {
					e = e[i+2:] // the cause, without the endpoint
				}
			}
			s.why[fmt.Sprintf("%s (%s, failures %d)", r.Reason, e, min(r.Failures, 9))]++
		}
		if errors.Is(r.Err, context.DeadlineExceeded) {
			s.timeouts++
		}
	}
	return s
}

// honestCheck asserts one sample by what the poller did, not by how fast the
// machine let it: every healthy pod is usable unless the poller's rule for a
// pod that does not answer applies to it (poolSample.timedOut: as many
// timed-out scrapes in a row as Staleness allows), every failing pod scores
// 1, and the pool is within ±0.05 of its true value given those (0.5 for a
// usable healthy pod, 1 for a failing or timed-out one). How many healthy
// pods timed out is logged: it is the machine's figure, not the poller's.
func honestCheck(t *testing.T, what string, s poolSample) {
	t.Helper()
	want := (0.5*float64(s.usable) + float64(s.timedOut+s.bad)) / float64(s.healthy+s.bad)
	if s.timedOut > 0 {
		t.Logf("%s: %d of %d healthy pods missed their timeout on as many scrapes in a row as Staleness allows (scored 1 by rule)",
			what, s.timedOut, s.healthy)
	}
	assert.Equal(t, s.healthy, s.usable+s.timedOut,
		"%s: %d of %d healthy pods usable, %d out by the timeout rule (%d last timed out); judged otherwise: %v",
		what, s.usable, s.healthy, s.timedOut, s.timeouts, s.why)
	assert.Equal(t, s.bad, s.badScored1, "%s: failing pods scoring 1", what)
	assert.InDelta(t, want, s.sat, 0.05, "%s: pool saturation", what)
}

// honestCases runs body for each of quiet and beside a CPU hog, all pods
// healthy and 10 % failing.
func honestCases(t *testing.T, body func(t *testing.T, n int, eps []string, bad map[string]bool)) {
	for _, hog := range []bool{false, true} {
		for _, failing := range []bool{false, true} {
			name := fmt.Sprintf("hog=%v/failing=%v", hog, failing)
			t.Run(name, func(t *testing.T) {
				n := honestPods(t)
				eps, bad := scalePool(t, n, failing)
				if hog {
					cpuHog(t)
				}
				body(t, n, eps, bad)
			})
		}
	}
}

// TestPollerHonestScrape: five Scrape rounds over the pool at default settings
// on the real clock; after the first (warm-up), each round leaves every
// healthy pod usable but those the timeout rule put out (see honestCheck),
// the failing ones at 1 and the pool at its true value, quiet or beside a CPU
// hog.
func TestPollerHonestScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("a large pool on the real clock")
	}
	honestCases(t, func(t *testing.T, n int, eps []string, bad map[string]bool) {
		p, err := NewPoller(honestConfig(eps))
		require.NoError(t, err)
		defer p.Close()
		for round := range 5 {
			start := time.Now()
			_ = p.Scrape(context.Background()) // the failing pods' errors; Readings has them
			took := time.Since(start)
			s := samplePool(p, bad)
			t.Logf("round %d: %v, %d/%d healthy usable (%d timed out), %d/%d failing at 1, pool %.3f%s",
				round, took.Round(time.Millisecond), s.usable, s.healthy, s.timeouts, s.badScored1, s.bad, s.sat, statsNote(p))
			if round > 0 {
				honestCheck(t, fmt.Sprintf("round %d", round), s)
			}
		}
	})
}

// TestPollerHonestRun: Run over the pool at default settings on the real
// clock; after warm-up (every pod scraped twice), every look at the pool over
// the next three scrapes of every pod finds every healthy pod usable but
// those the timeout rule put out (see honestCheck), the failing ones at 1
// and the pool at its true value, quiet or beside a CPU hog.
func TestPollerHonestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a large pool on the real clock")
	}
	honestCases(t, func(t *testing.T, n int, eps []string, bad map[string]bool) {
		p, err := NewPoller(honestConfig(eps))
		require.NoError(t, err)
		defer p.Close()
		start := time.Now()
		require.NoError(t, p.Start())
		// Each pod scraped at least k times: a condition on what the
		// poller did, watched at a steady pace, bounded against a hang.
		scraped := func(k int64) bool {
			for _, r := range p.Readings() {
				if r.Scrapes < k {
					return false
				}
			}
			return true
		}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(2 * time.Minute)
		for !scraped(2) {
			require.False(t, time.Now().After(deadline), "not every pod scraped twice in 2 minutes")
			<-tick.C
		}
		warm := time.Since(start)
		base := map[string]int64{}
		for _, r := range p.Readings() {
			base[r.Endpoint] = r.Scrapes
		}
		wstart := time.Now()
		var samples []poolSample
		for {
			samples = append(samples, samplePool(p, bad))
			done := true
			for _, r := range p.Readings() {
				if r.Scrapes < base[r.Endpoint]+3 {
					done = false
					break
				}
			}
			if done {
				break
			}
			require.False(t, time.Now().After(deadline), "not every pod scraped 3 more times in 2 minutes")
			<-tick.C
		}
		window := time.Since(wstart)
		var scrapes int64
		for _, r := range p.Readings() {
			scrapes += r.Scrapes - base[r.Endpoint]
		}
		minU, minSat, maxSat, maxTO := n, math.Inf(1), math.Inf(-1), 0
		for _, s := range samples {
			minU, maxTO = min(minU, s.usable), max(maxTO, s.timeouts)
			minSat, maxSat = min(minSat, s.sat), max(maxSat, s.sat)
		}
		t.Logf("warm-up %v; window %v, %d samples, %.0f scrapes/s (per pod every %v): healthy usable min %d of %d, "+
			"timed out max %d, pool %.3f..%.3f%s", warm.Round(time.Millisecond), window.Round(time.Millisecond),
			len(samples), float64(scrapes)/window.Seconds(),
			(window * time.Duration(n) / time.Duration(max(scrapes, 1))).Round(time.Millisecond),
			minU, samples[0].healthy, maxTO, minSat, maxSat, statsNote(p))
		for i, s := range samples {
			honestCheck(t, fmt.Sprintf("sample %d of %d", i, len(samples)), s)
			if t.Failed() {
				break // the first failing sample says it
			}
		}
		require.NoError(t, p.Close())
	})
}

// statsNote is what the poller says of its own schedule, for the logs.
func statsNote(p *Poller) string {
	s := p.Stats()
	return fmt.Sprintf("; stats: %d/%d usable, per-pod interval %v (max %v), median latency %v, timeout %v, round %v",
		s.Usable, s.Pods, s.Interval, s.MaxInterval, s.Latency, s.Timeout, s.Round)
}
