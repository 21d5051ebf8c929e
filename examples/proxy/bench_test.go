package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

// BenchmarkProxyOverhead: the same trivial backend (a small JSON answer,
// idle vLLM metrics) behind a bare httputil.ReverseProxy (plain; plain-flush-1
// with FlushInterval -1, which the proxy no longer uses) and behind the
// flowgate proxy with open bands (flowgate), driven by parallel clients over
// loopback. req/s is wall-clock throughput of the whole loop: clients, proxy
// and backend share the machine.
func BenchmarkProxyOverhead(b *testing.B) {
	const answer = `{"id":"x","object":"text_completion","choices":[{"index":0,"text":" hello","finish_reason":"stop"}]}`
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, idleVLLM)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
		_, _ = io.WriteString(w, answer)
	}))
	defer backend.Close()
	target, _ := url.Parse(backend.URL)
	transport := func() *http.Transport {
		return &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, DisableCompression: true}
	}
	plain := func(flush time.Duration) http.Handler {
		return &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport:     transport(),
			FlushInterval: flush,
		}
	}
	run := func(b *testing.B, h http.Handler) {
		front := httptest.NewServer(h)
		defer front.Close()
		client := &http.Client{Transport: transport()}
		defer client.CloseIdleConnections()
		body := `{"model":"m","prompt":"hello","max_tokens":1}`
		b.ReportAllocs()
		b.SetParallelism(8)
		b.ResetTimer()
		began, cpu0 := time.Now(), cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/completions", strings.NewReader(body))
				req.Header.Set(gateway.ObjectiveHeader, "sheddable")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "req/s")
		b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
	}
	b.Run("plain", func(b *testing.B) { run(b, plain(0)) })
	b.Run("plain-flush-1", func(b *testing.B) { run(b, plain(-1)) })
	// Open bands: the trivial backend reports 0 waiting and 0 running, so
	// the in-flight credit would count every forwarded request as
	// waiting and gate the band (16 in flight / 5 = saturation 3.2); the
	// overhead is measured with the credit off.
	flowgate := func(burst int) func(b *testing.B) {
		return func(b *testing.B) {
			cfg := gateway.DefaultConfig()
			cfg.Saturation.InFlightCredit = false
			cfg.Burst = burst
			p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: []string{backend.URL}, Logf: func(string, ...any) {}})
			if err != nil {
				b.Fatal(err)
			}
			p.Start()
			defer p.Close()
			deadline := time.Now().Add(10 * time.Second)
			for p.Poller().Saturation() != 0 {
				if time.Now().After(deadline) {
					b.Fatal("the pool never read idle")
				}
				time.Sleep(time.Millisecond) // bounded poll, outside the timed loop
			}
			run(b, p)
			var gated uint64
			for _, bs := range p.Controller().Stats().Bands {
				gated += bs.Expired + bs.Rejected
			}
			if gated != 0 {
				b.Errorf("%d requests refused: the bands were not open", gated)
			}
		}
	}
	b.Run("flowgate", flowgate(0))
	b.Run("flowgate-burst1024", flowgate(1024))
}

// cpuTime is the process's user+system CPU time (clients, proxy and
// backend all run in this process).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
