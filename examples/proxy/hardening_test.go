package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

// custom is a backend with an idle vLLM /metrics (or a saturated one) and a
// test's handler for everything else.
type custom struct {
	srv       *httptest.Server
	saturated atomic.Bool
}

func newCustom(t *testing.T, metrics string, h http.HandlerFunc) *custom {
	c := &custom{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/metrics") {
			if c.saturated.Load() {
				fmt.Fprint(w, "vllm:num_requests_waiting 100\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 1\n")
				return
			}
			fmt.Fprint(w, metrics)
			return
		}
		h(w, r)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// gatedNow waits until the controller's gates have read a saturated pool:
// the poller reads it first, and an idle dispatcher sleeps, so a pass
// through band 0 (never gated) wakes it for a tick. The poller must have
// scraped the saturated metrics from every pod: a pod not yet scraped also
// scores 1, and a first scrape still in flight would then land an idle
// reading after this returned (a sheddable request was released so, 1 run in
// 30 of TestOpenAISDKDecodesProxyRefusals).
func gatedNow(t *testing.T, p *gateway.Proxy) {
	t.Helper()
	eventually(t, "the gates read the pool saturated", func() bool {
		for _, r := range p.Poller().Readings() {
			if !r.Usable || r.Score < 1 {
				return false
			}
		}
		if p.Poller().Saturation() < 1 {
			return false
		}
		if permit, err := p.Controller().Wait(context.Background(), 0); err == nil {
			permit.Done()
		}
		return p.Controller().Stats().Saturation >= 1
	})
}

const idleVLLM = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"

// runGateway starts a proxy over urls and serves it; it waits until the
// pool reads idle unless wantIdle is false.
func runGateway(t *testing.T, cfg gateway.Config, opts gateway.Options, wantIdle bool, urls ...string) (*gateway.Proxy, *httptest.Server) {
	t.Helper()
	opts.Config, opts.Backends = cfg, urls
	opts.TrustObjectiveHeader = true // the tests send the objective header as a trusted front proxy would
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	p, err := gateway.NewProxy(opts)
	require.NoError(t, err)
	p.Start()
	srv := httptest.NewServer(p)
	t.Cleanup(func() { p.Close(); srv.Close() })
	if wantIdle {
		eventually(t, "the pool reads idle", func() bool { return p.Poller().Saturation() == 0 })
	}
	return p, srv
}

// Every method but GET/HEAD/OPTIONS is gated, on any path: none passes a
// blocked band.
func TestGatedMethodsAndPathsDoNotBypassABlockedBand(t *testing.T) {
	var reached atomic.Int64
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) { reached.Add(1) })
	cfg := testConfig()
	cfg.Bands[1].MaxWait = 20 * time.Millisecond
	p, srv := runGateway(t, cfg, gateway.Options{}, true, b.srv.URL)
	b.saturated.Store(true)
	gatedNow(t, p)
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/completions"}, {"POST", "/invocations"}, {"POST", "/v2/rerank"}, {"POST", "/pooling"},
		{"PUT", "/v1/completions"}, {"PATCH", "/v1/x"}, {"DELETE", "/v1/files/x"}, {"POST", "/anything/else"},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s %s", c.method, c.path)
		require.Equal(t, gateway.ReasonExpired, resp.Header.Get(gateway.ReasonHeader), "%s %s", c.method, c.path)
	}
	require.Zero(t, reached.Load(), "a request reached the backend past a blocked band")
	resp, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, int64(1), reached.Load(), "GET is not gated")
}

// Expect: 100-continue is not forwarded; a backend's 1xx is not the
// recorded status; the backend's copies of the proxy's headers are
// stripped, so its own 429 is not the proxy's.
func TestExpect1xxAndBackendHeaders(t *testing.T) {
	var expect sync.Map
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		expect.Store(r.URL.Path, r.Header.Get("Expect"))
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(gateway.BandHeader, "backend-band")
		w.Header().Set(gateway.ReasonHeader, gateway.ReasonQueueFull)
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set(gateway.BandHeader, "backend-band")
		w.Header().Set(gateway.ReasonHeader, gateway.ReasonQueueFull)
		w.WriteHeader(http.StatusTooManyRequests)
	})
	finished := make(chan [3]any, 4)
	_, srv := runGateway(t, testConfig(), gateway.Options{OnFinish: func(band, code int, reason string) {
		finished <- [3]any{band, code, reason}
	}}, true, b.srv.URL)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("Expect", "100-continue")
	req.Header.Set(gateway.ObjectiveHeader, "critical")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	v, _ := expect.Load("/v1/completions")
	require.Equal(t, "", v, "Expect forwarded to the backend")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, []string{"critical"}, resp.Header.Values(gateway.BandHeader))
	require.Empty(t, resp.Header.Values(gateway.ReasonHeader), "the backend's 429 looks like the proxy's")
	select {
	case f := <-finished:
		require.Equal(t, [3]any{0, 429, gateway.ReasonForwarded}, f, "the 103 was taken for the status")
	case <-time.After(10 * time.Second):
		t.Fatal("no finish")
	}
	// Ungated requests too: the backend's copies are stripped.
	resp, err = http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, resp.Header.Values(gateway.BandHeader))
	require.Empty(t, resp.Header.Values(gateway.ReasonHeader))
}

// A backend that accepts and never answers is given up after the
// response-header timeout: 502, not a slot held forever.
func TestBackendResponseHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	p, srv := runGateway(t, testConfig(), gateway.Options{BackendResponseHeaderTimeout: 200 * time.Millisecond}, true, b.srv.URL)
	began := time.Now()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	require.Equal(t, gateway.ReasonBackendError, resp.Header.Get(gateway.ReasonHeader))
	require.Less(t, time.Since(began), 5*time.Second)
	eventually(t, "the slot is free", func() bool { return p.Controller().InFlight() == 0 })
}

// Two backends on one host:port (different paths) do not break /metrics.
func TestMetricsWithTwoBackendsOnOneHostPort(t *testing.T) {
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {})
	_, srv := runGateway(t, testConfig(), gateway.Options{}, true, b.srv.URL+"/a", b.srv.URL+"/b")
	for range 3 {
		resp, err := http.Get(srv.URL + "/metrics")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		require.Contains(t, string(body), `flowgate_endpoint_inflight{endpoint="`+b.srv.URL+`/a"}`)
		require.Contains(t, string(body), `flowgate_endpoint_inflight{endpoint="`+b.srv.URL+`/b"}`)
	}
}

// bodyPriority strip removes vLLM's "priority" before forwarding (and still
// classifies by it); keep forwards it with the granted band's value.
func TestBodyPriorityStrip(t *testing.T) {
	bodies := make(chan string, 4)
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- string(body)
	})
	for _, mode := range []string{gateway.BodyPriorityStrip, gateway.BodyPriorityKeep} {
		cfg := testConfig()
		cfg.BodyPriority = mode
		_, srv := runGateway(t, cfg, gateway.Options{}, true, b.srv.URL)
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","priority":1}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, "sheddable", resp.Header.Get(gateway.BandHeader), mode)
		got := <-bodies
		if mode == gateway.BodyPriorityStrip {
			require.JSONEq(t, `{"prompt":"x"}`, got)
		} else {
			require.JSONEq(t, `{"prompt":"x","priority":1}`, got)
		}
	}
}

// The sglang preset reads SGLang's metric names; a backend whose metrics
// the preset does not find reads saturated, and the proxy says so in its log.
func TestEnginePresetAndScrapeFailureLogged(t *testing.T) {
	sglang := newCustom(t, "sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\nsglang:token_usage 0\n", func(http.ResponseWriter, *http.Request) {})
	cfg := testConfig()
	cfg.Saturation.Engine = gateway.EngineSGLang
	runGateway(t, cfg, gateway.Options{}, true, sglang.srv.URL) // reads idle: the names were found

	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	p, _ := runGateway(t, testConfig(), gateway.Options{Logf: logf}, false, sglang.srv.URL) // vllm names on an SGLang pod
	eventually(t, "a log line", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range logs {
			if strings.Contains(l, sglang.srv.URL) && strings.Contains(l, "reads saturated") {
				return true
			}
		}
		return false
	})
	require.GreaterOrEqual(t, p.Poller().Saturation(), 1.0)
}

// With LLMDMetrics, /metrics serves llm-d's flow-control names, with llm-d's
// outcome values and the bands' priorities, in place of flowgate's names of
// the same facts.
func TestLLMDMetricNames(t *testing.T) {
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })
	cfg := testConfig()
	cfg.Bands[1].MaxWait = 20 * time.Millisecond
	p, srv := runGateway(t, cfg, gateway.Options{LLMDMetrics: true}, true, b.srv.URL)
	send := func(objective string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader("{}"))
		req.Header.Set(gateway.ObjectiveHeader, objective)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 200, send("critical"))
	b.saturated.Store(true)
	gatedNow(t, p)
	require.Equal(t, 503, send("sheddable"))
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	for _, want := range []string{
		`llm_d_epp_flow_control_requests_total{outcome="Dispatched",priority="100"} 1`,
		`llm_d_epp_flow_control_requests_total{outcome="EvictedTTL",priority="0"} 1`,
		`llm_d_epp_flow_control_request_queue_duration_seconds_count{fairness_id="default-flow",outcome="EvictedTTL",priority="0"} 1`,
		`llm_d_epp_flow_control_queue_size{fairness_id="default-flow",priority="0"} 0`,
		`llm_d_epp_flow_control_pool_saturation `,
	} {
		require.Contains(t, string(body), want)
	}
	// One name per fact: llm-d's replace ours.
	for _, name := range []string{"flowgate_queue_depth", "flowgate_saturation", "flowgate_requests_total", "flowgate_wait_seconds"} {
		require.NotContains(t, string(body), "# TYPE "+name+" ")
	}
	require.Contains(t, string(body), "# TYPE flowgate_refused_total ")
}
