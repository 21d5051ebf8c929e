package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// idleBackend serves an idle vLLM's /metrics and 200 to everything else.
func idleBackend(t testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// startProxy runs a proxy over one idle backend and waits until the pool
// reads idle (every band open).
func startProxy(t testing.TB, cfg Config) *Proxy {
	return startProxyWith(t, Options{Config: cfg, TrustObjectiveHeader: true})
}

// startProxyWith is startProxy with options (Config, the trust settings).
func startProxyWith(t testing.TB, opts Options) *Proxy {
	opts.Config.Saturation.ScrapeInterval = 5 * time.Millisecond
	opts.Config.Saturation.MetricsStalenessThreshold = time.Second
	opts.Backends, opts.Logf = []string{idleBackend(t).URL}, func(string, ...any) {}
	p, err := NewProxy(opts)
	require.NoError(t, err)
	p.Start()
	t.Cleanup(p.Close)
	deadline := time.Now().Add(10 * time.Second)
	for p.Poller().Saturation() != 0 {
		require.True(t, time.Now().Before(deadline), "the pool never read idle")
		runtime.Gosched()
	}
	return p
}

// bandOf sends one gated request through the proxy's handler and returns the
// band index its answer names.
func bandOf(t testing.TB, p *Proxy, cfg *Config, header, objective, body string) int {
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	if objective != "" {
		req.Header.Set(header, objective)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	name := rec.Header().Get(BandHeader)
	for i, b := range cfg.Bands {
		if b.Name == name {
			return i
		}
	}
	t.Fatalf("answer %d names band %q", rec.Code, name)
	return -1
}

// Band resolution, with the header trusted: the objective header (llm-d's
// or the legacy one, ASCII case-insensitive), else the body's integer
// priority clamped to the bands but never above the default band, else the
// default band.
func TestBandFor(t *testing.T) {
	cfg := DefaultConfig()
	p := startProxy(t, cfg)
	for _, tc := range []struct {
		header, objective, body string
		band                    int
	}{
		{ObjectiveHeader, "critical", `{"priority":9}`, 0}, // the header wins
		{ObjectiveHeader, "sheddable", ``, 1},
		{ObjectiveHeader, "CRITICAL", ``, 0},
		{LegacyObjectiveHeader, "critical", `{"priority":9}`, 0},
		{ObjectiveHeader, "nope", `{"priority":0}`, 1}, // unknown objective falls through; a body never raises
		{ObjectiveHeader, "", `{"priority":-5}`, 1},
		{ObjectiveHeader, "", `{"priority":1}`, 1},
		{ObjectiveHeader, "", `{"priority":1000}`, 1},
		{ObjectiveHeader, "", `{"prompt":"x"}`, 1},
		{ObjectiveHeader, "", `not json`, 1},
	} {
		require.Equal(t, tc.band, bandOf(t, p, &cfg, tc.header, tc.objective, tc.body), "%+v", tc)
	}
	cfg.DefaultBand = 0
	p0 := startProxy(t, cfg)
	require.Equal(t, 0, bandOf(t, p0, &cfg, ObjectiveHeader, "", ""))
	require.Equal(t, 1, bandOf(t, p0, &cfg, ObjectiveHeader, "", `{"priority":1}`), "a body lowers")
}

// API keys grant bands: a key's tenant is placed at most at its ceiling, an
// anonymous caller at most at the default band whatever it sends, and with
// StripLLMDHeaders the backend sees the tenant's objective and fairness id,
// never the client's.
func TestAPIKeys(t *testing.T) {
	keys, err := ParseAPIKeys("# key tenant ceiling [flow]\nk-ops ops critical;k-batch batch sheddable batch-jobs\n")
	require.NoError(t, err)
	require.Equal(t, Tenant{Name: "batch", Ceiling: "sheddable", Flow: "batch-jobs"}, keys["k-batch"])
	_, err = ParseAPIKeys("k a critical\nk b sheddable")
	require.ErrorContains(t, err, "twice")
	cfg := DefaultConfig()
	p := startProxyWith(t, Options{Config: cfg, APIKeys: keys})
	send := func(key, objective, body string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if objective != "" {
			req.Header.Set(ObjectiveHeader, objective)
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		return slices.IndexFunc(cfg.Bands, func(b Band) bool { return b.Name == rec.Header().Get(BandHeader) })
	}
	require.Equal(t, 0, send("k-ops", "", `{}`))
	require.Equal(t, 1, send("k-ops", "sheddable", `{}`), "a tenant lowers itself")
	require.Equal(t, 1, send("k-batch", "critical", `{"priority":0}`))
	require.Equal(t, 1, send("", "critical", `{"priority":0}`))
	require.Equal(t, 1, send("wrong", "critical", `{}`))
	_, err = NewProxy(Options{Config: cfg, Backends: []string{"http://127.0.0.1:1"}, APIKeys: map[string]Tenant{"k": {Name: "x", Ceiling: "gold"}}})
	require.ErrorContains(t, err, "not a band")

	id, err := newIdentifier(keys, cfg.Bands, true)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set("Authorization", "Bearer k-batch")
	req.Header.Set(ObjectiveHeader, "critical")
	req.Header.Set("X-Llm-D-Inference-Fairness-Id", "someone-else")
	req.Header.Set("X-Gateway-Inference-Objective", "critical")
	got, ok := id.identify(req)
	require.True(t, ok)
	require.Equal(t, 1, got.Ceiling)
	require.Equal(t, "sheddable", req.Header.Get(ObjectiveHeader))
	require.Equal(t, "batch-jobs", req.Header.Get(flowhttp.FairnessIDHeader))
	require.Empty(t, req.Header.Get(LegacyObjectiveHeader))
}

// asciiLower lower-cases ASCII letters only, as flowhttp matches objectives.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// FuzzBandFor: any header value and body yield a valid band, and the
// header (trusted) decides exactly when it names a known objective (ASCII
// case-insensitively, the least critical of a comma-separated list).
func FuzzBandFor(f *testing.F) {
	f.Add("critical", []byte(`{"priority":1}`))
	f.Add("", []byte(`{"priority":-7}`))
	f.Add("batch", []byte(`{"priority":70000}`))
	f.Add("SHEDDABLE", []byte(`x`))
	cfg := DefaultConfig()
	cfg.Bands = append(cfg.Bands, Band{Name: "batch", Priority: -10, Capacity: 8})
	cfg.Objectives = defaultObjectives(cfg.Bands)
	cfg.DefaultBand = 1
	p := startProxy(f, cfg)
	lower := map[string]int{}
	for k, v := range cfg.Objectives {
		lower[asciiLower(k)] = v
	}
	f.Fuzz(func(t *testing.T, objective string, body []byte) {
		if strings.ContainsAny(objective, "\r\n\x00") {
			return // not a header value net/http would deliver
		}
		band := bandOf(t, p, &cfg, ObjectiveHeader, objective, string(body))
		asked := -1 // the least critical known value of the list, ASCII case-insensitively
		for _, v := range strings.Split(objective, ",") {
			if b, known := lower[asciiLower(strings.TrimSpace(v))]; known && b > asked {
				asked = b
			}
		}
		if asked >= 0 {
			require.Equal(t, asked, band)
			return
		}
		if p, ok := flowhttp.BodyPriority(body); ok {
			require.Equal(t, max(int(min(max(p, 0), int64(len(cfg.Bands)-1))), cfg.DefaultBand), band)
			return
		}
		require.Equal(t, cfg.DefaultBand, band)
	})
}
