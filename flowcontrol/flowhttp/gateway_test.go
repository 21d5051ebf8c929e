package flowhttp_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// pod is a model server over loopback: /metrics reports the waiting count
// the test sets (0 running, no KV), anything else is served by handle.
type pod struct {
	srv     *httptest.Server
	waiting atomic.Int64
	kv      atomic.Int64 // vllm:kv_cache_usage_perc in thousandths
	reached atomic.Int64 // requests that reached it (not /metrics)
	handle  func(w http.ResponseWriter, r *http.Request)
}

func newPod(t testing.TB, handle func(w http.ResponseWriter, r *http.Request)) *pod {
	p := &pod{handle: handle}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "vllm:num_requests_waiting %d\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc %g\n",
				p.waiting.Load(), float64(p.kv.Load())/1000)
			return
		}
		p.reached.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if p.handle != nil {
			p.handle(w, r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// route is the host's side: round-robin over the pods, each through a
// reverse proxy, calling Forward.
func route(gw *flowhttp.Gateway, pods ...*pod) http.Handler {
	var rr atomic.Uint64
	type target struct {
		base string
		rp   *httputil.ReverseProxy
	}
	var targets []target
	for _, p := range pods {
		u, _ := url.Parse(p.srv.URL)
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.ErrorLog = quietLog() // the tests cancel clients on purpose
		targets = append(targets, target{p.srv.URL, rp})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg := targets[rr.Add(1)%uint64(len(targets))]
		defer gw.Forward(w, tg.base)()
		tg.rp.ServeHTTP(w, r)
	})
}

// runGateway starts a gateway over the pods with fast scrapes and serves it
// on loopback.
func runGateway(t testing.TB, cfg flowhttp.GatewayConfig, pods ...*pod) (*flowhttp.Gateway, *httptest.Server) {
	t.Helper()
	for _, p := range pods {
		cfg.Endpoints = append(cfg.Endpoints, p.srv.URL)
	}
	if cfg.Poller.Interval == 0 {
		cfg.Poller.Interval = 5 * time.Millisecond
	}
	if cfg.Poller.Scorer.Staleness == 0 {
		cfg.Poller.Scorer.Staleness = 10 * time.Second // a loaded machine's scrape is never stale
		cfg.Poller.Timeout = 5 * time.Second
	}
	gw, err := flowhttp.NewGateway(cfg)
	require.NoError(t, err)
	require.NoError(t, gw.Start(context.Background()))
	srv := httptest.NewServer(gw.Handler(route(gw, pods...)))
	t.Cleanup(func() {
		gw.Close()
		srv.Close()
	})
	return gw, srv
}

// readAll waits until every endpoint has a scraped reading (not the
// unscraped default, which also scores 1).
func readAll(t testing.TB, gw *flowhttp.Gateway) {
	t.Helper()
	waitFor(t, "a scrape of every endpoint", func() bool {
		for _, r := range gw.Poller().Readings() {
			if r.Scrapes == 0 {
				return false
			}
		}
		return true
	})
}

// The zero-value configuration protects: a request without an objective
// header waits as sheddable while the pool is saturated, a critical one
// passes, and the waiting one goes once the pool reads idle.
func TestGatewayDefaultsGateUnlabelled(t *testing.T) {
	p := newPod(t, nil)
	p.waiting.Store(10) // score 2: saturated
	gw, srv := runGateway(t, flowhttp.GatewayConfig{HTTP: flowhttp.Options{TrustObjectiveHeader: true}}, p)
	readAll(t, gw)

	unlabelled := make(chan int, 1)
	go func() {
		resp, _, err := post(t, context.Background(), srv.URL+"/v1/completions", "", `{"prompt":"x"}`)
		if err != nil {
			unlabelled <- 0
			return
		}
		unlabelled <- resp.StatusCode
	}()
	waitFor(t, "the unlabelled request queued", func() bool { return gw.Controller().Stats().Bands[1].Queued == 1 })
	resp, body, err := post(t, context.Background(), srv.URL+"/v1/completions", "critical", `{"prompt":"x"}`)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, body)
	require.Equal(t, "critical", resp.Header.Get(flowhttp.BandHeader))
	require.Equal(t, int64(1), p.reached.Load(), "only the critical request reached the pod")

	p.waiting.Store(0)
	select {
	case code := <-unlabelled:
		require.Equal(t, 200, code)
	case <-time.After(30 * time.Second):
		t.Fatal("the unlabelled request was never released")
	}
	require.Equal(t, int64(2), p.reached.Load())
}

// A backlog built while its band was blocked does not reach the pool in one
// tick when the pod reads idle: with the credit (the default) each release
// counts as a waiting request at once, before the host has even forwarded
// it, and the band re-reads the saturation as it drains, so against one
// idle pod (queue threshold CreditQueueDepthThreshold, 6.25: each release
// adds 0.16) exactly 7 of 20 go: 4 while the band is open (s ≤ 0.5), one
// each at s 0.64, 0.8 and 0.96 (gated, paced), then s = 1.12 blocks it,
// however many readings come. Without the credit all 20 go.
func TestGatewayBacklogDoesNotFloodOnReopen(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noCredit bool
		want     int64
	}{{"credit", false, 7}, {"no credit", true, 20}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-release:
				case <-r.Context().Done():
				}
			})
			p.waiting.Store(10)
			gw, srv := runGateway(t, flowhttp.GatewayConfig{NoCredit: tc.noCredit}, p)
			readAll(t, gw)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { cancel(); close(release); wg.Wait() })
			const queued = 20
			for range queued {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, _ = post(t, ctx, srv.URL+"/v1/completions", "sheddable", `{"prompt":"x"}`)
				}()
			}
			waitFor(t, "the backlog queued", func() bool { return gw.Controller().Stats().Bands[1].Queued == queued })
			// A tick after the backlog queued, while the pod still reads
			// saturated, arms the band (the wake-up tick of a sleeping Run
			// does not: see Dispatcher). On a starved machine that tick
			// may come late, after the pod reads idle below; the band
			// would then never have been seen gated with its backlog, and
			// release it at once, as the discipline says.
			// Three advances of the tick count, each seen after the one
			// before: a waking Run's credit and its wake-up tick are at
			// most two, so the third is a tick that arms.
			for range 3 {
				ticks := gw.Controller().Stats().Ticks
				waitFor(t, "a tick with the backlog gated", func() bool { return gw.Controller().Stats().Ticks > ticks })
			}
			require.Zero(t, p.reached.Load())
			p.waiting.Store(0) // the pod reads idle: only the credit counts
			waitFor(t, "the band reopened", func() bool { return p.reached.Load() >= tc.want })
			seq := gw.Poller().ReadingSeq()
			waitFor(t, "20 more readings", func() bool { return gw.Poller().ReadingSeq() >= seq+20 })
			require.Equal(t, tc.want, p.reached.Load(), "requests forwarded after the band reopened")
			require.Equal(t, queued-int(tc.want), gw.Controller().Stats().Bands[1].Queued)
		})
	}
}

// Forward's accounting is exact under concurrency: every request counted
// on its endpoint once (a second Forward of one request, a retry, moves the
// poller's count but not the release gap twice), and every count and the
// gap return to zero.
func TestGatewayForwardAccountingUnderConcurrency(t *testing.T) {
	pods := []*pod{newPod(t, nil), newPod(t, nil)}
	var gw *flowhttp.Gateway
	cfg := flowhttp.GatewayConfig{}
	for _, p := range pods {
		cfg.Endpoints = append(cfg.Endpoints, p.srv.URL)
	}
	cfg.Poller.Interval = 5 * time.Millisecond
	cfg.Poller.Scorer.Staleness = 10 * time.Second
	cfg.Poller.Timeout = 5 * time.Second
	gw, err := flowhttp.NewGateway(cfg)
	require.NoError(t, err)
	require.NoError(t, gw.Start(context.Background()))
	defer gw.Close()
	var peak atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := gw.Forward(w, pods[0].srv.URL)
		retry := gw.Forward(w, pods[1].srv.URL) // as a host retrying elsewhere would
		first()
		first() // done twice: counted once
		n := gw.Poller().InFlight(pods[1].srv.URL + "/metrics")
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		retry()
		_, _ = io.WriteString(w, "ok")
	})
	h := gw.Handler(next)
	const workers, each = 8, 50
	var wg sync.WaitGroup
	var served atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{}`))
				req.Header.Set(flowhttp.ObjectiveHeader, "critical")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code == 200 {
					served.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(workers*each), served.Load())
	require.GreaterOrEqual(t, peak.Load(), int64(1))
	for _, p := range pods {
		require.Zero(t, gw.Poller().InFlight(p.srv.URL+"/metrics"))
	}
	require.Zero(t, gw.Controller().InFlight())
	require.Zero(t, gw.Poller().Unbalanced())
	require.Equal(t, 0.0, gaugeOf(t, gw, "flowgate_released_unforwarded"))
	require.Equal(t, 0.0, gaugeOf(t, gw, "flowgate_body_memory_bytes"))
}

// gaugeOf gathers one unlabelled gauge of the gateway's collector.
func gaugeOf(t testing.TB, gw *flowhttp.Gateway, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(gw.Collector()))
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// NewGateway names the field it refuses.
func TestNewGatewayErrors(t *testing.T) {
	ok := "http://127.0.0.1:1"
	for _, tc := range []struct {
		cfg  flowhttp.GatewayConfig
		want string
	}{
		{flowhttp.GatewayConfig{Endpoints: []string{"10.0.0.1:8000"}}, "Endpoints[0]"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok, ok}}, "listed twice"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, Flow: flowcontrol.Config{Source: new(saturation.Value)}}, "Flow.Source"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, Poller: saturation.PollerConfig{Endpoints: []string{ok}}}, "Poller.Endpoints"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, Poller: saturation.PollerConfig{Interval: -1}}, "Poller"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, Flow: flowcontrol.Config{Bands: []flowcontrol.BandConfig{{Capacity: 0}}}}, "Flow"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, HTTP: flowhttp.Options{DefaultObjective: "batch"}}, "DefaultObjective"},
		{flowhttp.GatewayConfig{Endpoints: []string{ok}, HTTP: flowhttp.Options{MaxBodyMemory: 1 << 20, CriticalReserve: 2 << 20}}, "CriticalReserve"},
	} {
		_, err := flowhttp.NewGateway(tc.cfg)
		require.ErrorIs(t, err, flowhttp.ErrInvalidConfig, tc.want)
		require.Contains(t, err.Error(), tc.want)
		require.True(t, strings.HasPrefix(err.Error(), "flowhttp: "), err.Error())
	}
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{ok}})
	require.NoError(t, err)
	require.NoError(t, gw.Start(context.Background()))
	require.ErrorIs(t, gw.Start(context.Background()), flowhttp.ErrStarted)
	gw.Close()
	gw.Close() // idempotent
	require.ErrorIs(t, gw.Start(context.Background()), flowhttp.ErrGatewayClosed)
}

// Serve: a hardened server that ends cleanly with its context, answering
// what is queued 503 shutting-down; connections of the reserve serve only
// critical requests.
func TestGatewayServeDrainsAndReservesForCritical(t *testing.T) {
	p := newPod(t, nil)
	p.waiting.Store(10)
	cfg := flowhttp.GatewayConfig{Endpoints: []string{p.srv.URL}, HTTP: flowhttp.Options{TrustObjectiveHeader: true}}
	cfg.Poller.Interval = 5 * time.Millisecond
	cfg.Poller.Scorer.Staleness = 10 * time.Second
	cfg.Poller.Timeout = 5 * time.Second
	gw, err := flowhttp.NewGateway(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		// Two connections beyond the two held: the refused one may not be
		// counted closed yet when the critical one arrives.
		served <- gw.Serve(ctx, ln, route(gw, p), flowhttp.ServerConfig{MaxConns: 4, ReservedConns: 2, DrainTimeout: 5 * time.Second})
	}()
	base := "http://" + ln.Addr().String()
	readAll(t, gw)

	// Two connections hold queued sheddable requests; the next ones, in the
	// reserve, refuse a sheddable request and serve a critical one.
	tr := &http.Transport{MaxConnsPerHost: 0, DisableKeepAlives: false}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
			req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
			resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitFor(t, "two sheddable requests queued", func() bool { return gw.Controller().Stats().Bands[1].Queued == 2 })
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
	req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode, string(body))
	require.Equal(t, flowhttp.ReasonOverloaded, resp.Header.Get(flowhttp.DroppedReasonHeader))
	req, _ = http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
	req.Header.Set(flowhttp.ObjectiveHeader, "critical")
	resp, err = client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	cancel() // shutdown: the queued requests are answered, Serve returns
	for range 2 {
		select {
		case code := <-codes:
			require.Equal(t, 503, code)
		case <-time.After(30 * time.Second):
			t.Fatal("a queued request was not answered on shutdown")
		}
	}
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	require.ErrorIs(t, gw.Start(context.Background()), flowhttp.ErrGatewayClosed)
}

// Router.LeastLoaded picks the usable endpoint with the fewest requests in flight,
// and falls back to all endpoints when none is usable.
func TestRouterLeastLoaded(t *testing.T) {
	a, b := newPod(t, nil), newPod(t, nil)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	t.Cleanup(broken.Close)
	cfg := flowhttp.GatewayConfig{Endpoints: []string{a.srv.URL, b.srv.URL, broken.URL}}
	cfg.Poller.Interval = 5 * time.Millisecond
	cfg.Poller.Scorer.Staleness = 10 * time.Second
	cfg.Poller.Timeout = 5 * time.Second
	cfg.Poller.FailFast = true
	gw, err := flowhttp.NewGateway(cfg)
	require.NoError(t, err)
	require.NoError(t, gw.Start(context.Background()))
	defer gw.Close()
	readAll(t, gw)
	waitFor(t, "the verdicts copied: a and b usable, broken not", func() bool {
		seen := map[string]bool{}
		for range 12 { // every rotation, several times
			seen[gw.Router().LeastLoaded()] = true
		}
		return len(seen) == 2 && seen[a.srv.URL] && seen[b.srv.URL]
	})
	// One request held on a: b is the least loaded, whatever the rotation.
	doneA := gw.Forward(discardWriter{}, a.srv.URL)
	for range 6 {
		require.Equal(t, b.srv.URL, gw.Router().LeastLoaded())
	}
	doneB := gw.Forward(discardWriter{}, b.srv.URL)
	doneB2 := gw.Forward(discardWriter{}, b.srv.URL)
	for range 6 {
		require.Equal(t, a.srv.URL, gw.Router().LeastLoaded())
	}
	doneA()
	doneB()
	doneB2()
	empty, err := flowhttp.NewGateway(flowhttp.GatewayConfig{})
	require.NoError(t, err)
	require.Equal(t, "", empty.Router().LeastLoaded())
}
