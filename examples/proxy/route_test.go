package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// smallCacheStub is a fake vLLM server scheduling by priority with a KV cache
// of 128 blocks (2,048 tokens), so that one long prompt fills it.
func smallCacheStub(t *testing.T) *backendStub {
	t.Helper()
	rc := vllm.DefaultConfig()
	rc.TotalBlocks, rc.MaxModelLen = 128, 128*16
	return newStubWith(t, fakevllm.Config{Replica: rc, SchedulingPolicy: fakevllm.PolicyPriority})
}

// fillCache sends b, directly, a streamed request whose prompt holds 117 of
// its 128 blocks (KV usage 0.91: less than 10 % free) and returns once its
// first token arrived (its prompt is then in the cache); end ends it.
func fillCache(t *testing.T, b *backendStub) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	body := fmt.Sprintf(`{"prompt":%q,"max_tokens":150,"stream":true}`, strings.Repeat("abcd", 1860)) // 1,860 tokens
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}
	require.Greater(t, b.fake.Metrics().KVCacheUsage, 0.9, "the prompt is in the cache")
	return func() {
		cancel()
		resp.Body.Close()
	}
}

// readKV scrapes now (Scrape) and requires the poller to have read the full
// cache of full and the empty one of empty.
func readKV(t *testing.T, p *saturation.Poller, full, empty *backendStub) {
	t.Helper()
	require.NoError(t, p.Scrape(context.Background()))
	kv := map[string]float64{}
	for _, r := range p.Readings() {
		kv[strings.TrimSuffix(r.Endpoint, "/metrics")] = r.KVUsage
	}
	require.Greater(t, kv[full.srv.URL], 0.9)
	require.Less(t, kv[empty.srv.URL], 0.1)
}

// critical sends a short critical request through srv and requires a 200.
func critical(t *testing.T, srv string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	require.NoError(t, err)
	req.Header.Set(flowhttp.ObjectiveHeader, "critical")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// With the backends scheduling by priority (bodyPriority set), a critical
// request goes to the backend with room in its KV cache: two fake vLLM
// servers over loopback, one whose cache a long prompt fills to 91 %; every
// critical request lands on the other, through the proxy's pick and through
// a bare flowhttp.Gateway routed by Route (the embed program's handler).
// Without the routing, in-flight ties would alternate between the two.
func TestCriticalRequestAvoidsAFullKVCache(t *testing.T) {
	t.Run("proxy", func(t *testing.T) {
		full, empty := smallCacheStub(t), smallCacheStub(t)
		cfg := testConfig()
		cfg.BodyPriority = gateway.BodyPrioritySet
		h := newHarness(t, cfg, full, empty)
		require.Equal(t, flowhttp.DefaultCriticalKVHeadroom, h.p.Gateway().Router().CriticalKVHeadroom(), "on by default with bodyPriority set")
		defer fillCache(t, full)()
		readKV(t, h.p.Poller(), full, empty)
		for range 6 {
			critical(t, h.srv.URL)
		}
		require.EqualValues(t, 6, empty.fake.Completed())
		require.EqualValues(t, 0, full.fake.Completed())
	})
	t.Run("gateway", func(t *testing.T) {
		full, empty := smallCacheStub(t), smallCacheStub(t)
		gc := flowhttp.GatewayConfig{Endpoints: []string{full.srv.URL, empty.srv.URL}, HTTP: flowhttp.Options{ForwardPriority: flowhttp.PrioritySet, TrustObjectiveHeader: true}}
		gc.Poller.Interval = 5 * time.Millisecond
		gc.Poller.Scorer.Staleness = time.Minute
		gw, err := flowhttp.NewGateway(gc)
		require.NoError(t, err)
		proxies := map[string]*httputil.ReverseProxy{}
		for _, b := range gw.Router().Endpoints() {
			target, _ := url.Parse(b)
			proxies[b] = httputil.NewSingleHostReverseProxy(target)
		}
		require.NoError(t, gw.Start(context.Background()))
		defer gw.Close()
		srv := httptest.NewServer(gw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b := gw.Router().Route(w)
			defer gw.Forward(w, b)()
			proxies[b].ServeHTTP(w, r)
		})))
		defer srv.Close()
		defer fillCache(t, full)()
		readKV(t, gw.Poller(), full, empty)
		for range 6 {
			critical(t, srv.URL)
		}
		require.EqualValues(t, 6, empty.fake.Completed())
		require.EqualValues(t, 0, full.fake.Completed())
	})
}
