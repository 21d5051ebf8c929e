package saturation

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// fakePods is an http.RoundTripper serving each host's current body or
// status from memory: the state machine below drives hundreds of rounds per
// check without sockets or goroutines.
type fakePods struct {
	mu     sync.Mutex
	status map[string]int
	body   map[string]string
}

func (f *fakePods) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	status, ok := f.status[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("connection refused")
	}
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(f.body[r.URL.Host])),
		Header: http.Header{}, Request: r}, nil
}

func (f *fakePods) set(host string, status int, body string) {
	f.mu.Lock()
	f.status[host], f.body[host] = status, body
	f.mu.Unlock()
}

// modelPod is what the model remembers of a pod: its last good reading.
type modelPod struct {
	good          bool
	waiting, kv   float64
	at            time.Time
	serveOK       bool // what the pod serves now: good values or a failure
	serveBad      bool // the failure is a page with a NaN value (ErrBadValue)
	nextW, nextKV float64
}

// TestPollerModel is a rapid state machine: pods that change what they serve
// (good values, 500s, garbage, missing metrics, NaN), a clock that advances,
// rounds, rescores and endpoint changes, against a direct model of the
// documented rules (last good reading kept until stale; FailFast; a bad value
// is unusable at once; IgnoreStale; empty pool is 1).
func TestPollerModel(t *testing.T) {
	hosts := []string{"pod-a", "pod-b", "pod-c", "pod-d"}
	rapid.Check(t, func(t *rapid.T) {
		failFast := rapid.Bool().Draw(t, "failFast")
		ignoreStale := rapid.Bool().Draw(t, "ignoreStale")
		fake := &fakePods{status: map[string]int{}, body: map[string]string{}}
		clk := newFakeClock()
		// With one slot the results of a round arrive one at a time, so
		// the running pool sum can be checked after each of them.
		serial := rapid.Bool().Draw(t, "serial")
		conc := 0
		if serial {
			conc = 1
		}
		p, err := NewPoller(PollerConfig{
			Client:         &http.Client{Transport: fake},
			Now:            clk.Now,
			FailFast:       failFast,
			Scorer:         Scorer{IgnoreStale: ignoreStale},
			MaxConcurrency: conc,
		})
		if err != nil {
			t.Fatal(err)
		}
		var hookErr string // set by the hook, which runs on a Scrape goroutine
		if serial {
			// After each result, the published value is the mean of the
			// pods' current scores, as counted by the rules (the running
			// sum matches a recount).
			p.onApply = func(string) {
				sum, n := 0.0, 0
				for _, r := range p.Readings() {
					if !r.Usable && ignoreStale {
						continue
					}
					sum += r.Score
					n++
				}
				want := 1.0
				if n > 0 {
					want = sum / float64(n)
				}
				if got := p.Saturation(); math.Abs(got-want) > 1e-12 && hookErr == "" {
					hookErr = fmt.Sprintf("after a result: saturation %v, mean of pod scores %v", got, want)
				}
			}
		}
		model := map[string]*modelPod{}
		for _, h := range hosts {
			model[h] = &modelPod{}
			fake.set(h, 500, "")
		}
		var current []string // hosts polled, in order
		published := 1.0

		expect := func() float64 {
			now := clk.Now()
			sum, n := 0.0, 0
			for _, h := range current {
				m := model[h]
				if !m.good || now.Sub(m.at) > DefaultStaleness {
					if ignoreStale {
						continue
					}
					sum++
				} else {
					sum += math.Max(m.waiting/DefaultQueueDepthThreshold, m.kv/DefaultKVUtilThreshold)
				}
				n++
			}
			if n == 0 {
				return 1
			}
			return sum / float64(n)
		}

		t.Repeat(map[string]func(*rapid.T){
			"serve": func(t *rapid.T) {
				h := rapid.SampledFrom(hosts).Draw(t, "host")
				m := model[h]
				m.serveBad = false
				switch rapid.IntRange(0, 5).Draw(t, "kind") {
				case 0, 1, 2:
					m.serveOK = true
					m.nextW = float64(rapid.IntRange(0, 20).Draw(t, "waiting"))
					m.nextKV = float64(rapid.IntRange(0, 100).Draw(t, "kvPercent")) / 100
					fake.set(h, 200, fmt.Sprintf("vllm:num_requests_waiting %v\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc %v\n", m.nextW, m.nextKV))
				case 3:
					m.serveOK = false
					fake.set(h, 503, "unavailable")
				case 4:
					m.serveOK = false
					const nan = "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.1\n"
					body := rapid.SampledFrom([]string{"garbage {", "vllm:num_requests_waiting 1\n", nan}).Draw(t, "badBody")
					m.serveBad = body == nan
					fake.set(h, 200, body)
				case 5:
					m.serveOK = false
					fake.mu.Lock()
					delete(fake.status, h) // connection refused
					fake.mu.Unlock()
				}
			},
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(0, 150).Draw(t, "ms")) * time.Millisecond)
			},
			"poll": func(t *rapid.T) {
				_ = p.Scrape(context.Background())
				for _, h := range current {
					m := model[h]
					if m.serveOK {
						m.good, m.waiting, m.kv, m.at = true, m.nextW, m.nextKV, clk.Now()
					} else if failFast || m.serveBad {
						// A pod that answers with a bad value is
						// unusable at once, FailFast or not.
						m.good = false
					}
				}
				published = expect()
			},
			"rescore": func(t *rapid.T) {
				p.Rescore()
				published = expect()
			},
			"setEndpoints": func(t *rapid.T) {
				perm := rapid.Permutation(hosts).Draw(t, "perm")
				next := perm[:rapid.IntRange(0, len(hosts)).Draw(t, "n")]
				eps := make([]string, len(next))
				kept := map[string]bool{}
				for i, h := range next {
					eps[i] = "http://" + h + "/metrics"
					kept[h] = true
				}
				if err := p.SetEndpoints(eps); err != nil {
					t.Fatal(err)
				}
				for _, h := range hosts {
					if !kept[h] || !contains(current, h) {
						model[h].good = false // removed pods are forgotten; new ones start empty
					}
				}
				current = append([]string(nil), next...)
				published = expect()
			},
			"": func(t *rapid.T) {
				if hookErr != "" {
					t.Fatal(hookErr)
				}
				if got := p.Saturation(); math.Abs(got-published) > 1e-12 {
					t.Fatalf("saturation %v, model %v (pods %v)", got, published, current)
				}
				rs := p.Readings()
				if len(rs) != len(current) {
					t.Fatalf("%d readings for %d pods", len(rs), len(current))
				}
				for _, r := range rs {
					if r.Usable != (r.Reason == "") {
						t.Fatalf("pod %s usable %v with reason %q", r.Endpoint, r.Usable, r.Reason)
					}
				}
			},
		})
	})
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
