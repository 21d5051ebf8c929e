package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

// BenchmarkProxyOverhead: the same trivial backend (a small JSON answer,
// idle vLLM metrics) behind a bare httputil.ReverseProxy (plain; plain-flush-1
// with FlushInterval -1, which the proxy no longer uses; plain-pool with a
// copy-buffer pool like the proxy's) and behind the flowgate proxy with open
// bands (flowgate), driven by parallel clients over loopback. req/s is
// wall-clock throughput of the whole loop: clients, proxy and backend share
// the machine, so quote flowgate/plain from one run, never absolute figures.
//
// What differs between plain and flowgate beside flow control, and why it is
// left so:
//   - Transport: the same connection reuse (MaxIdleConnsPerHost) and no
//     compression; flowgate's adds a dial timeout, an idle timeout and a
//     ResponseHeaderTimeout (one timer per request), hardening a bare proxy
//     does not have.
//   - Copy buffer: flowgate's reverse proxies share a pool of 32 KiB buffers;
//     plain allocates one per response, as a bare ReverseProxy does.
//     plain-pool is plain with the same pool, to tell the two apart.
//   - Request body: flowgate buffers it (flow control reads it: byte budgets,
//     body priority, the minimum body rate) and forwards it from memory,
//     which net/http sends in the same write as the headers; plain streams
//     it, and net/http flushes the headers first (for httputil's wrapper of
//     the inbound body, as for any reader not known to be in memory): one
//     write syscall more per request. That follows from buffering, which a
//     bare streaming proxy does not do.
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
	plain := func(flush time.Duration, pool httputil.BufferPool) http.Handler {
		return &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport:     transport(),
			FlushInterval: flush,
			BufferPool:    pool,
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
	b.Run("plain", func(b *testing.B) { run(b, plain(0, nil)) })
	b.Run("plain-flush-1", func(b *testing.B) { run(b, plain(-1, nil)) })
	b.Run("plain-pool", func(b *testing.B) { run(b, plain(0, &benchBuffers{})) })
	// Open bands: the trivial backend reports 0 waiting and 0 running, so
	// the in-flight credit would count every forwarded request as
	// waiting and gate the band (16 in flight / 5 = saturation 3.2); the
	// overhead is measured with the credit off.
	flowgate := func(burst int) func(b *testing.B) {
		return func(b *testing.B) {
			cfg := gateway.DefaultConfig()
			cfg.Saturation.InFlightCredit = false
			cfg.Burst = burst
			p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: []string{backend.URL}, Logf: func(string, ...any) {}, TrustObjectiveHeader: true})
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

// benchBuffers is plain-pool's copy-buffer pool: 32 KiB buffers, as
// httputil allocates without one and as the proxy's pool holds.
type benchBuffers struct{ pool sync.Pool }

func (p *benchBuffers) Get() []byte {
	if b, ok := p.pool.Get().(*[32 << 10]byte); ok {
		return b[:]
	}
	return make([]byte, 32<<10)
}

func (p *benchBuffers) Put(b []byte) {
	if len(b) == 32<<10 {
		p.pool.Put((*[32 << 10]byte)(b))
	}
}

// cpuTime is the process's user+system CPU time (clients, proxy and
// backend all run in this process).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
