package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// routingSim is the part of a sim that routing reads: n replicas (never stepped) and
// one gateway's counts.
func routingSim(n int, cfg Config) (*sim, *gateway) {
	s := &sim{cfg: cfg, replicas: make([]*vllm.Replica, n)}
	return s, &gateway{inflight: make([]int64, n), others: make([]int64, n)}
}

// TestInFlightRoutingIsLeastLoaded drives the simulator's inflight routing and a real
// flowhttp.Gateway's LeastLoaded (the example proxy's pick is the same loop) through
// the same random sequence of requests forwarded and finished, and requires the same
// choice at every step: the tie-breaking (round-robin, the scan starting at the
// counter after its increment) included.
func TestInFlightRoutingIsLeastLoaded(t *testing.T) {
	defer goleak.VerifyNone(t) // the gateways are built and closed, never started
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "replicas")
		eps := make([]string, n)
		idx := map[string]int{}
		for i := range eps {
			eps[i] = fmt.Sprintf("http://10.0.0.%d:8000", i+1)
			idx[eps[i]] = i
		}
		gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: eps})
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		s, g := routingSim(n, Config{Routing: RoutingInFlight})
		type open struct {
			r    int
			done func() bool
		}
		var live []open
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			if len(live) > 0 && rapid.Bool().Draw(t, "finish") {
				k := rapid.IntRange(0, len(live)-1).Draw(t, "which")
				live[k].done()
				g.inflight[live[k].r]--
				live = append(live[:k], live[k+1:]...)
				continue
			}
			want := idx[gw.Router().LeastLoaded()]
			got := s.route(g)
			if got != want {
				t.Fatalf("step %d: sim routed to %d, LeastLoaded to %d (own in flight %v)", step, got, want, g.inflight)
			}
			live = append(live, open{got, gw.Forward(httptest.NewRecorder(), eps[got])})
			g.inflight[got]++
		}
	})
}

// kvPods answers a gateway poller's scrapes without a network: each host's
// vllm:kv_cache_usage_perc is what the test last set.
type kvPods struct {
	mu sync.Mutex
	kv map[string]float64
}

func (p *kvPods) RoundTrip(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	kv := p.kv[r.URL.Host]
	p.mu.Unlock()
	body := "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc " + strconv.FormatFloat(kv, 'g', -1, 64) + "\n"
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// TestCriticalKVRoutingIsLeastLoadedFor drives the simulator's critical routing
// (CriticalRoutingKV over RoutingInFlight: routeKV for a critical request, route for
// a sheddable one) and a real flowhttp.Gateway's LeastLoadedFor through the same
// random sequence of KV readings (a scrape of every replica, as the sim's gateway
// takes them), requests forwarded in either band and requests finished, and requires
// the same choice at every step: the filter's edge (usage exactly 1 − headroom), its
// fallbacks when none (the lowest usage, ties kept) or all replicas have the headroom,
// and the round-robin ties.
func TestCriticalKVRoutingIsLeastLoadedFor(t *testing.T) {
	defer goleak.VerifyNone(t) // the gateways are built and closed, never started
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "replicas")
		headroom := rapid.SampledFrom([]float64{0.05, 0.1, 0.15, 0.5, 1}).Draw(t, "headroom")
		pods := &kvPods{kv: map[string]float64{}}
		eps := make([]string, n)
		idx := map[string]int{}
		for i := range eps {
			eps[i] = fmt.Sprintf("http://10.0.0.%d:8000", i+1)
			idx[eps[i]] = i
		}
		cfg := flowhttp.GatewayConfig{Endpoints: eps, CriticalKVHeadroom: headroom}
		cfg.Poller.Client = &http.Client{Transport: pods}
		cfg.Poller.Scorer.Staleness = time.Hour // readings age only with Run, never started here
		gw, err := flowhttp.NewGateway(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		s, g := routingSim(n, Config{Routing: RoutingInFlight, CriticalRouting: CriticalRoutingKV, CriticalKVHeadroom: headroom})
		s.among = make([]bool, n)
		g.readings = make([]saturation.Reading, n)
		scrape := func() {
			pods.mu.Lock()
			for i, ep := range eps {
				kv := rapid.SampledFrom([]float64{0, 0.2, 0.85, 0.9, 0.95, 1, 1 - headroom, -1}).Draw(t, "kv")
				if kv < 0 {
					kv = rapid.Float64Range(0, 1).Draw(t, "any kv")
				}
				pods.kv[strings.TrimPrefix(ep, "http://")] = kv
				g.readings[i].KVUsage = kv
			}
			pods.mu.Unlock()
			if err := gw.Poller().Scrape(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		scrape() // the sim's gateway reads every replica before its first request
		type open struct {
			r    int
			done func() bool
		}
		var live []open
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "action") {
			case 0:
				scrape()
				continue
			case 1:
				if len(live) > 0 {
					k := rapid.IntRange(0, len(live)-1).Draw(t, "which")
					live[k].done()
					g.inflight[live[k].r]--
					live = append(live[:k], live[k+1:]...)
					continue
				}
			}
			critical := rapid.Bool().Draw(t, "critical")
			var got, want int
			if critical {
				want, got = idx[gw.Router().LeastLoadedFor(0)], s.routeKV(g)
			} else {
				want, got = idx[gw.Router().LeastLoadedFor(1)], s.route(g)
			}
			if got != want {
				kv := make([]float64, n)
				for i := range kv {
					kv[i] = g.readings[i].KVUsage
				}
				t.Fatalf("step %d (critical %v): sim routed to %d, LeastLoadedFor to %d (own in flight %v, KV %v, headroom %v)",
					step, critical, got, want, g.inflight, kv, headroom)
			}
			live = append(live, open{got, gw.Forward(httptest.NewRecorder(), eps[got])})
			g.inflight[got]++
		}
		for _, o := range live {
			o.done()
		}
	})
}

// TestInFlightRoutingAddsTheSharedView: with a shared view the load is own + the
// others' as last synced (the proxy's redisshare Endpoint.InFlight); without one the
// others' counts are not seen.
func TestInFlightRoutingAddsTheSharedView(t *testing.T) {
	for _, shared := range []bool{false, true} {
		cfg := Config{Routing: RoutingInFlight}
		if shared {
			cfg.SharedInFlight = 5 * time.Millisecond
		}
		s, g := routingSim(3, cfg)
		g.inflight = []int64{2, 3, 2}
		g.others = []int64{9, 0, 0}
		var got []int
		for range 4 {
			got = append(got, s.route(g))
		}
		if shared {
			// Loads 11, 3, 2: replica 2 whatever the start.
			require.Equal(t, []int{2, 2, 2, 2}, got)
		} else {
			// Loads 2, 3, 2: the tie between 0 and 2 goes to whichever the scan
			// (starting at 1, 2, 0, 1) meets first.
			require.Equal(t, []int{2, 2, 0, 2}, got)
		}
	}
}

// TestInFlightRoutingPicksFewest runs short experiments with inflight routing and
// checks every routing decision: the chosen replica has no more requests in flight, as
// the gateway sees them, than any other; where the view is exact (one gateway, or an
// exact shared view once the instant's syncs have landed: checked with one gateway
// only, where seen is the pool's true count) no replica has fewer requests in flight
// than the chosen one.
func TestInFlightRoutingPicksFewest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.SampledFrom([]workload.Workload{workload.Codegen, workload.Chat}).Draw(t, "workload")
		qps := map[string]float64{"codegen": 16, "chat": 80}[w.Name] * rapid.Float64Range(0.5, 1.5).Draw(t, "load")
		c := Config{Workload: w, QPS: qps, Duration: 2 * time.Second, CV: -1, Routing: RoutingInFlight,
			Policy:   rapid.SampledFrom([]string{None, SoftReflective, Static, LLMDSoftReflective}).Draw(t, "policy"),
			Seed:     rapid.Uint64Range(1, 1000).Draw(t, "seed"),
			Gateways: rapid.IntRange(1, 4).Draw(t, "gateways"),
			Replicas: rapid.IntRange(1, 4).Draw(t, "replicas"),
			Credit:   rapid.Bool().Draw(t, "credit")}
		switch rapid.IntRange(0, 2).Draw(t, "shared") {
		case 1:
			c.SharedInFlightExact = true
		case 2:
			c.SharedInFlight = time.Duration(rapid.IntRange(1, 50).Draw(t, "period ms")) * time.Millisecond
		}
		routes := 0
		var bad string
		c.onRoute = func(s *sim, g *gateway, r int, _ int32) {
			routes++
			for j := range s.replicas {
				if bad == "" && s.seen(g, j) < s.seen(g, r) {
					bad = fmt.Sprintf("at %v routed to %d seeing %d in flight, %d sees %d", time.Duration(s.now), r, s.seen(g, r), j, s.seen(g, j))
				}
				if bad == "" && len(s.gws) == 1 && s.total[j] < s.total[r] {
					bad = fmt.Sprintf("one gateway: at %v routed to %d with %d in flight, %d has %d", time.Duration(s.now), r, s.total[r], j, s.total[j])
				}
			}
		}
		s, err := run(c)
		if err != nil {
			t.Fatal(err)
		}
		if bad != "" {
			t.Fatal(bad)
		}
		res := s.result()
		if routes != res.Critical.Completed+res.Sheddable.Completed+res.Unfinished {
			t.Fatalf("%d routing decisions for %d completed and %d unfinished", routes, res.Critical.Completed+res.Sheddable.Completed, res.Unfinished)
		}
		for r, n := range s.total {
			if res.Unfinished == 0 && n != 0 {
				t.Fatalf("replica %d: %d still in flight after the drain", r, n)
			}
		}
	})
}

// TestRoutingDeterministic: each routing gives the same result for the same seed, the
// two routings differ with several gateways, and tick skipping stays exact under
// inflight routing.
func TestRoutingDeterministic(t *testing.T) {
	c := short(workload.Codegen, 16, SoftReflective)
	c.Gateways = 4
	c.Duration = 15 * time.Second
	byRouting := map[string]Result{}
	for _, r := range Routings() {
		c.Routing = r
		a, err := Run(c)
		require.NoError(t, err)
		b, err := Run(c)
		require.NoError(t, err)
		require.Equal(t, a, b, r)
		byRouting[r] = a
	}
	require.NotEqual(t, byRouting[RoutingScrape], byRouting[RoutingInFlight], "the routing matters with 4 gateways")
	c.Routing = ""
	def, err := Run(c)
	require.NoError(t, err)
	require.Equal(t, byRouting[DefaultRouting], def, "the zero Routing is DefaultRouting")

	for _, gws := range []int{1, 2, 4} {
		for _, exact := range []bool{false, true} {
			c := short(workload.Codegen, 16, SoftReflective)
			c.Routing, c.Gateways, c.Duration = RoutingInFlight, gws, 10*time.Second
			c.ClientTimeout = 5 * time.Second
			if gws > 1 {
				c.SharedInFlightExact, c.SharedInFlight = exact, 5*time.Millisecond
			}
			requireSkipExact(t, c)
		}
	}
}

func TestRoutingConfigError(t *testing.T) {
	c := short(workload.Chat, 10, SoftReflective)
	c.Routing = "random"
	_, err := Run(c)
	require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
	require.True(t, strings.Contains(err.Error(), "Routing"), "the error names the field: %v", err)
}

// TestCriticalKVRoutingKeepsHeadroom checks every routing decision under
// CriticalRoutingKV: under a flowgate policy a critical request goes to a replica
// with the configured KV headroom at the gateway's last scrape whenever one has it;
// under none and llm-d parity, and without backend priority under
// CriticalRoutingKVWithPriority, every request is routed as Routing routes it (the
// run is the same as with CriticalRoutingSame).
func TestCriticalKVRoutingKeepsHeadroom(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.SampledFrom([]workload.Workload{workload.Codegen, workload.Reasoning}).Draw(t, "workload")
		qps := map[string]float64{"codegen": 16, "reasoning": 6}[w.Name] * rapid.Float64Range(0.5, 1.5).Draw(t, "load")
		c := Config{Workload: w, QPS: qps, Duration: 3 * time.Second, CV: -1, BackendPriority: true,
			CriticalRouting:    CriticalRoutingKV,
			CriticalKVHeadroom: rapid.Float64Range(0.001, 1).Draw(t, "headroom"),
			Routing:            rapid.SampledFrom(Routings()).Draw(t, "routing"),
			Policy:             rapid.SampledFrom([]string{None, SoftReflective, Static, LLMDSoftReflective}).Draw(t, "policy"),
			Seed:               rapid.Uint64Range(1, 1000).Draw(t, "seed"),
			Replicas:           rapid.IntRange(1, 4).Draw(t, "replicas"),
			Credit:             true,
			Replica:            vllm.DefaultConfig()}
		c.Replica.TotalBlocks = rapid.IntRange(2600, 5000).Draw(t, "blocks") // caches that fill in seconds, above MaxModelLen
		var bad string
		critical := 0
		c.onRoute = func(s *sim, g *gateway, r int, id int32) {
			if !s.reqs[id].critical || !c.flowgate() {
				return
			}
			critical++
			limit := 1 - c.CriticalKVHeadroom
			for j := range s.replicas {
				if bad == "" && g.readings[j].KVUsage <= limit && g.readings[r].KVUsage > limit {
					bad = fmt.Sprintf("at %v a critical request went to %d at KV %.3f, %d had %.3f (limit %.3f)",
						time.Duration(s.now), r, g.readings[r].KVUsage, j, g.readings[j].KVUsage, limit)
				}
			}
		}
		if _, err := run(c); err != nil {
			t.Fatal(err)
		}
		if bad != "" {
			t.Fatal(bad)
		}
		// None (and every policy not flowgate's) routes as Routing does, kv or not.
		c.onRoute = nil
		if !c.flowgate() {
			requireRoutesAsSame(t, c, "kv under "+c.Policy)
		}
		// Without backend priority, kv-bp routes as Routing does.
		c.BackendPriority = false
		c.CriticalRouting = CriticalRoutingKVWithPriority
		requireRoutesAsSame(t, c, "kv-bp without backend priority")
	})
}

// requireRoutesAsSame fails t unless c runs exactly as it does with
// CriticalRoutingSame.
func requireRoutesAsSame(t interface {
	Fatal(...any)
	Fatalf(string, ...any)
}, c Config, what string) {
	a, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	c.CriticalRouting = CriticalRoutingSame
	b, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("%s differs from same:\n%+v\n%+v", what, a, b)
	}
}
