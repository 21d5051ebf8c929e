package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
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
	cfg.Saturation.ScrapeInterval = 5 * time.Millisecond
	cfg.Saturation.MetricsStalenessThreshold = time.Second
	p, err := NewProxy(Options{Config: cfg, Backends: []string{idleBackend(t).URL}, Logf: func(string, ...any) {}})
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

// Band resolution: the objective header (llm-d's or the legacy one,
// case-insensitive), else the body's integer priority clamped to the bands,
// else the default band.
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
		{ObjectiveHeader, "nope", `{"priority":0}`, 0}, // unknown objective falls through
		{ObjectiveHeader, "", `{"priority":-5}`, 0},
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
}

// FuzzBandFor: any header value and body yield a valid band, and the
// header decides exactly when it names a known objective (case-insensitively).
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
		lower[strings.ToLower(k)] = v
	}
	f.Fuzz(func(t *testing.T, objective string, body []byte) {
		if strings.ContainsAny(objective, "\r\n\x00") {
			return // not a header value net/http would deliver
		}
		band := bandOf(t, p, &cfg, ObjectiveHeader, objective, string(body))
		v := objective
		if b, known := lower[strings.ToLower(v)]; known && v != "" {
			require.Equal(t, b, band)
			return
		}
		if p, ok := flowhttp.BodyPriority(body); ok {
			require.Equal(t, int(min(max(p, 0), int64(len(cfg.Bands)-1))), band)
			return
		}
		require.Equal(t, cfg.DefaultBand, band)
	})
}
