package flowhttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/saturation"
)

// benchPods answers every scrape with the KV usage set for its host: pod i
// of n reads 0.85 + 0.15·i/n, so the first third have the default headroom.
type benchPods struct{ kv map[string]string }

func (p benchPods) RoundTrip(r *http.Request) (*http.Response, error) {
	body := "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc " + p.kv[r.URL.Host] + "\n"
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// BenchmarkCriticalPick prices one routing decision at n endpoints: LeastLoaded
// (no filter), LeastLoadedFor(0) on an unchanged reading (the filter reused),
// and LeastLoadedFor(0) right after a new reading (the filter rebuilt from the
// poller's readings, which at 1,000 pods scraped every 50 ms is nearly every
// critical pick). One op is one pick.
func BenchmarkCriticalPick(b *testing.B) {
	for _, n := range []int{2, 100, 1000} {
		pods := benchPods{kv: map[string]string{}}
		eps := make([]string, n)
		for i := range eps {
			host := fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)
			eps[i] = "http://" + host
			pods.kv[host] = strconv.FormatFloat(0.85+0.15*float64(i)/float64(n), 'g', -1, 64)
		}
		cfg := GatewayConfig{Endpoints: eps, CriticalKVHeadroom: DefaultCriticalKVHeadroom}
		cfg.Poller = saturation.PollerConfig{Client: &http.Client{Transport: pods}, Scorer: saturation.Scorer{Staleness: time.Hour}}
		g, err := NewGateway(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Poller().Scrape(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("pods=%d/least-loaded", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.Router().LeastLoaded()
			}
		})
		b.Run(fmt.Sprintf("pods=%d/critical", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.Router().LeastLoadedFor(0)
			}
		})
		b.Run(fmt.Sprintf("pods=%d/critical-new-reading", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.endpoints.kv.Store(nil) // as if a scrape result had arrived
				g.Router().LeastLoadedFor(0)
			}
		})
		g.Close()
	}
}
