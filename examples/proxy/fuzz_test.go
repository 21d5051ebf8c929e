package main

import (
	"bytes"
	"fmt"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// FuzzNewProxy: a configuration gateway.ParseConfig accepts, with backends that are
// absolute http(s) URLs listed once, builds a proxy; anything else is a
// "proxy: " error naming the backend. Never a panic.
func FuzzNewProxy(f *testing.F) {
	sample, _ := os.ReadFile("config.yaml")
	f.Add(string(sample), "http://127.0.0.1:8001", "http://127.0.0.1:8002")
	f.Add("", "http://a:1", "http://a:1/")
	f.Add("", "ftp://a", "")
	f.Add("", "http://", "https://b")
	f.Add("", "127.0.0.1:8000", "")
	f.Add("flowControl: {tick: 0s, burst: 0}\n", "http://a:1/v1/../", "http://a:1/x")
	f.Add("saturationDetector: {scrapeInterval: 1ns, metricsStalenessThreshold: 2ns}\n", "https://[::1]:443", "")
	f.Add("plugins:\n  - type: static-usage-limit-policy\n    parameters: {threshold: 0}\nflowControl: {usageLimitPolicyPluginRef: static-usage-limit-policy}\n", "http://a", "")
	f.Add("flowControl:\n  defaultPriorityBand: {fairness: round-robin, ordering: edf, flowCapacity: 3}\n", "http://a:1", "")
	f.Fuzz(func(t *testing.T, yamlSrc, b1, b2 string) {
		cfg, err := gateway.ParseConfig(strings.NewReader(yamlSrc))
		if err != nil {
			return // FuzzParseConfig covers the refusals
		}
		for _, b := range cfg.Bands {
			if b.Capacity > 1<<12 {
				t.Skip("large queues: valid, but too slow to allocate per iteration")
			}
		}
		var backends []string
		valid := true
		seen := map[string]bool{}
		for _, b := range []string{b1, b2} {
			if b == "" {
				continue
			}
			backends = append(backends, b)
			u, err := url.Parse(b)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				valid = false
				continue
			}
			m := u.JoinPath("metrics").String()
			valid = valid && !seen[m]
			seen[m] = true
		}
		p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: backends, Logf: func(string, ...any) {}})
		if valid != (err == nil) {
			t.Fatalf("gateway.NewProxy(%q): %v; model says valid=%v", backends, err, valid)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "proxy: backends[") {
				t.Fatalf("error %q does not name the backend", err)
			}
			return
		}
		p.Close()
	})
}

// fuzzProxy is one started proxy, shared by the iterations of FuzzServeHTTP,
// in front of a loopback backend that answers 200 "ok" and idle metrics.
func fuzzProxy(f *testing.F) *gateway.Proxy {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(backendHeader, "ok")
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
			return
		}
		fmt.Fprint(w, "ok")
	}))
	cfg := testConfig()
	for i := range cfg.Bands {
		cfg.Bands[i].Capacity = 64
		cfg.Bands[i].MaxWait = 50 * time.Millisecond
	}
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: []string{backend.URL}, MaxBodyBytes: 256, Logf: func(string, ...any) {}, TrustObjectiveHeader: true})
	if err != nil {
		f.Fatal(err)
	}
	p.Start()
	f.Cleanup(func() {
		p.Close()
		backend.Close()
	})
	return p
}

// FuzzServeHTTP sends any method, path, objective header and body through
// the proxy's handler (its header and body parsing, band resolution, gate
// and forwarding): every request is answered, with the backend's 200 or a
// refusal whose x-flowgate-reason and status are the documented pair; a
// gated request carries the band it was queued in; in-flight counts are back
// to 0 when the handler returns.
func FuzzServeHTTP(f *testing.F) {
	p := fuzzProxy(f)
	f.Add("POST", "/v1/completions", "critical", []byte(`{"prompt":"x","priority":1}`))
	f.Add("POST", "/v1/chat/completions", "", []byte(`{"messages":[],"priority":-5}`))
	f.Add("POST", "/v1/completions", "sheddable", []byte(strings.Repeat("x", 300)))
	f.Add("POST", "/v1/", "unknown", []byte(`{"priority":99999999999999999999}`))
	f.Add("GET", "/metrics", "", []byte(nil))
	f.Add("GET", "/v1/models", "critical", []byte(nil))
	f.Add("PUT", "/v1/completions", "critical", []byte(`{}`))
	f.Add("POST", "/v1", "critical", []byte(`{`))
	documented := map[string]int{
		gateway.ReasonQueueFull: http.StatusTooManyRequests, gateway.ReasonExpired: http.StatusServiceUnavailable,
		gateway.ReasonTooLarge: http.StatusRequestEntityTooLarge, gateway.ReasonBadBody: http.StatusBadRequest,
		gateway.ReasonBackendError: http.StatusBadGateway, gateway.ReasonNoBackend: http.StatusServiceUnavailable,
	}
	bandNames := map[string]bool{}
	for _, b := range p.Config().Bands {
		bandNames[b.Name] = true
	}
	f.Fuzz(func(t *testing.T, method, path, objective string, body []byte) {
		req, err := http.NewRequest(method, "http://proxy"+path, bytes.NewReader(body))
		if err != nil || req.URL.Path == "" {
			return // not a request a server would hand to the handler
		}
		req.RequestURI = req.URL.RequestURI()
		if objective != "" {
			req.Header[gateway.ObjectiveHeader] = []string{objective}
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		code := rec.Result().StatusCode
		reason := rec.Header().Get(gateway.ReasonHeader)
		gated := req.Method == http.MethodPost && strings.HasPrefix(req.URL.Path, "/v1/") && len(req.URL.Path) > 4
		switch {
		case req.Method == http.MethodGet && req.URL.Path == "/metrics":
			if code != http.StatusOK {
				t.Fatalf("/metrics: %d", code)
			}
		case reason != "":
			if want, ok := documented[reason]; !ok || want != code {
				t.Fatalf("%s %s: refusal %d %q is not documented", method, path, code, reason)
			}
		case rec.Header().Get(backendHeader) != "ok" || code != http.StatusOK:
			t.Fatalf("%s %s: %d without a reason and not from the backend: %q", method, path, code, rec.Body.String())
		}
		if gated && reason != gateway.ReasonTooLarge && reason != gateway.ReasonBadBody && !bandNames[rec.Header().Get(gateway.BandHeader)] {
			t.Fatalf("gated %s %s answered %d without its band (%q)", method, path, code, rec.Header().Get(gateway.BandHeader))
		}
		if n := p.Controller().InFlight(); n != 0 {
			t.Fatalf("controller in flight %d after the handler returned", n)
		}
		for _, n := range p.InFlight() {
			if n != 0 {
				t.Fatalf("backend in flight %d after the handler returned", n)
			}
		}
	})
}
