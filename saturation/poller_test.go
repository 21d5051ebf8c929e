package saturation

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

// serve starts an httptest server for h and returns its /metrics URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// vllmPod serves a client_golang registry through promhttp, exactly as a
// Go exporter would, with one engine's gauges set.
func vllmPod(t *testing.T, waiting, running, kv float64) (string, *vllmRegistry) {
	v := newVLLMRegistry(t, "0")
	v.set("0", waiting, running, kv)
	return serve(t, promhttp.HandlerFor(v.reg, promhttp.HandlerOpts{})), v
}

func text(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, body)
	})
}

// hang blocks every request until the client gives up or the test ends.
func hang(t *testing.T) http.Handler {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // runs before the server's Close
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
}

// newTestPoller builds a poller closed at the end of the test. Unless the
// test sets one, the scrape timeout is as generous as the config allows (the
// staleness, Timeout's upper bound): a loaded CI machine running the race
// detector must not turn a healthy pod into a timed-out one.
func newTestPoller(t *testing.T, cfg PollerConfig) *Poller {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = cfg.Scorer.withDefaults().Staleness
	}
	p, err := NewPoller(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestPollerGenuineVLLM(t *testing.T) {
	clk := newFakeClock()
	a, _ := vllmPod(t, 2, 5, 0.4) // max(0.4, 0.5)  = 0.5
	b, _ := vllmPod(t, 10, 5, 0)  // max(2, 0)      = 2
	// Nothing here ages on the fake clock: a timeout (and so a staleness)
	// far beyond a starved machine's first dial under -race (two
	// loopback scrapes over 200 ms once at load 27).
	p := newTestPoller(t, PollerConfig{Endpoints: []string{a, b}, Now: clk.Now,
		Timeout: scaleTimeout, Scorer: Scorer{Staleness: 2 * scaleTimeout}})
	assert.Equal(t, 1.0, p.Saturation(), "1 before the first poll")
	assert.True(t, math.IsNaN(p.KVUsage(a)), "no KV usage before the first poll")
	require.NoError(t, p.Scrape(context.Background()))
	assert.InDelta(t, 1.25, p.Saturation(), 1e-12)
	assert.Equal(t, 0.4, p.KVUsage(a))

	rs := p.Readings()
	require.Len(t, rs, 2)
	assert.Equal(t, a, rs[0].Endpoint)
	assert.Equal(t, Reading{Waiting: 2, Running: 5, KVUsage: 0.4, At: clk.Now(), OK: true}, rs[0].Reading)
	assert.InDelta(t, 0.5, rs[0].Score, 1e-12)
	assert.True(t, rs[0].Usable)
	assert.NoError(t, rs[0].Err)
	assert.Equal(t, int64(1), rs[0].Scrapes)
	assert.InDelta(t, 2, rs[1].Score, 1e-12)

	// AppendReadings is Readings after what dst holds, in dst's array
	// when it has the room; the live in-flight count included.
	p.Dispatched(b)
	rs = p.Readings()
	require.Equal(t, int64(1), rs[1].InFlight)
	head := PodReading{Endpoint: "kept"}
	buf := p.AppendReadings(append(make([]PodReading, 0, 3), head))
	require.Equal(t, append([]PodReading{head}, rs...), buf)
	again := p.AppendReadings(buf[:0])
	require.Equal(t, rs, again)
	require.Same(t, &buf[0], &again[0], "dst's array is reused")
	p.Finished(b)
}

func TestPollerBadEndpoints(t *testing.T) {
	const okBody = "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
	cases := []struct {
		name    string
		handler func(t *testing.T) http.Handler
		wantErr error
	}{
		{"HTTP 500", func(*testing.T) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) })
		}, ErrHTTPStatus},
		{"hangs past the timeout", hang, context.DeadlineExceeded},
		{"garbage", func(*testing.T) http.Handler { return text("\x00\x17\xff{{{ not metrics") }, ErrParse},
		{"omits a metric", func(*testing.T) http.Handler { return text("vllm:num_requests_waiting 0\n") }, ErrMissingMetric},
		{"NaN", func(*testing.T) http.Handler {
			return text("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n")
		}, ErrBadValue},
		{"+Inf", func(*testing.T) http.Handler {
			return text("vllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc 0\n")
		}, ErrBadValue},
		{"-Inf", func(*testing.T) http.Handler {
			return text("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc -Inf\n")
		}, ErrBadValue},
		{"negative", func(*testing.T) http.Handler {
			return text("vllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 0\n")
		}, ErrBadValue},
		{"50 MB body", func(*testing.T) http.Handler { return huge(50 << 20) }, ErrBodyTooLarge},
		{"refuses connections", nil, errors.New("any")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			idle := serve(t, text(okBody)) // a healthy pod alongside
			var bad string
			if c.handler != nil {
				bad = serve(t, c.handler(t))
			} else {
				srv := httptest.NewServer(http.NotFoundHandler())
				bad = srv.URL + "/metrics"
				srv.Close() // nothing listens there any more
			}
			// Only the hanging pod needs a short timeout; the others get
			// 10 s (with a staleness to match: the clock is fake), so that
			// a slow read of a 1 MiB body (race-instrumented, on a loaded
			// 2-core machine: over 200 ms once in CI) is not mistaken for a
			// timeout.
			timeout, stale := 10*time.Second, 10*time.Second
			if c.wantErr == context.DeadlineExceeded {
				timeout, stale = 50*time.Millisecond, DefaultStaleness
			}
			p := newTestPoller(t, PollerConfig{
				Endpoints:    []string{idle, bad},
				Now:          clk.Now,
				Timeout:      timeout,
				MaxBodyBytes: 1 << 20,
				Scorer:       Scorer{Staleness: stale},
			})
			err := p.Scrape(context.Background())
			require.Error(t, err)
			if c.handler != nil {
				assert.ErrorIs(t, err, c.wantErr)
			}
			assert.Contains(t, err.Error(), "saturation: scrape "+bad)
			// The bad pod has no good reading: it scores 1, the healthy
			// one 0, the pool their mean.
			assert.Equal(t, 0.5, p.Saturation())
			assert.Equal(t, 0.0, p.KVUsage(idle))
			assert.True(t, math.IsNaN(p.KVUsage(bad)), "a pod without a usable reading: unknown")
			assert.True(t, math.IsNaN(p.KVUsage("http://nowhere/metrics")), "an unknown endpoint: unknown")
			rs := p.Readings()
			assert.NoError(t, rs[0].Err)
			assert.Error(t, rs[1].Err)
			assert.False(t, rs[1].OK)
			assert.False(t, rs[1].Usable)
			assert.Equal(t, 1, rs[1].Failures)

			// With IgnoreStale the failed pod is left out.
			p2 := newTestPoller(t, PollerConfig{
				Endpoints: []string{idle, bad}, Now: clk.Now, Timeout: timeout,
				MaxBodyBytes: 1 << 20, Scorer: Scorer{IgnoreStale: true, Staleness: stale},
			})
			require.Error(t, p2.Scrape(context.Background()))
			assert.Equal(t, 0.0, p2.Saturation())
		})
	}
}

// huge streams a syntactically valid body of n bytes (or until the client
// hangs up).
func huge(n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := []byte("vllm:num_requests_waiting{pad=\"" + strings.Repeat("x", 200) + "\"} 1\n")
		for sent := 0; sent < n; sent += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	})
}

func TestPollerBodyAtTheCap(t *testing.T) {
	body := "vllm:num_requests_waiting 5\nvllm:kv_cache_usage_perc 0\n"
	ep := serve(t, text(body))
	for _, c := range []struct {
		max  int64
		want error
	}{{int64(len(body)), nil}, {int64(len(body)) - 1, ErrBodyTooLarge}} {
		p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, MaxBodyBytes: c.max})
		err := p.Scrape(context.Background())
		if c.want == nil {
			assert.NoError(t, err, "a body of exactly MaxBodyBytes is accepted")
			assert.Equal(t, 1.0, p.Saturation())
		} else {
			assert.ErrorIs(t, err, c.want)
		}
	}
}

// TestPollerFlipping: a pod that alternates between good and bad keeps its
// last good reading until it is stale; with FailFast it scores 1 at once.
func TestPollerFlipping(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	ep := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.2\n")
	}))
	ctx := context.Background()

	clk := newFakeClock()
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Now: clk.Now})
	require.NoError(t, p.Scrape(ctx))
	assert.InDelta(t, 0.25, p.Saturation(), 1e-12) // max(1/5, 0.2/0.8)

	healthy.Store(false)
	clk.Advance(150 * time.Millisecond)
	assert.ErrorIs(t, p.Scrape(ctx), ErrHTTPStatus)
	assert.InDelta(t, 0.25, p.Saturation(), 1e-12, "last good reading is 150 ms old: still used")
	clk.Advance(51 * time.Millisecond)
	assert.ErrorIs(t, p.Scrape(ctx), ErrHTTPStatus)
	assert.Equal(t, 1.0, p.Saturation(), "last good reading is 201 ms old: stale")
	assert.Equal(t, 2, p.Readings()[0].Failures)

	healthy.Store(true)
	clk.Advance(time.Second)
	require.NoError(t, p.Scrape(ctx))
	assert.InDelta(t, 0.25, p.Saturation(), 1e-12, "recovers on the next good scrape")
	assert.Equal(t, 0, p.Readings()[0].Failures)

	ff := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Now: clk.Now, FailFast: true})
	require.NoError(t, ff.Scrape(ctx))
	assert.InDelta(t, 0.25, ff.Saturation(), 1e-12)
	healthy.Store(false)
	assert.Error(t, ff.Scrape(ctx))
	assert.Equal(t, 1.0, ff.Saturation(), "FailFast: one failure scores 1")
}

func TestPollerRescoreStaleness(t *testing.T) {
	clk := newFakeClock()
	ep, _ := vllmPod(t, 0, 0, 0.4)
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Now: clk.Now,
		Scorer: Scorer{Staleness: time.Second}})
	require.NoError(t, p.Scrape(context.Background()))
	assert.Equal(t, 0.5, p.Saturation())
	clk.Advance(time.Second)
	p.Rescore()
	assert.Equal(t, 0.5, p.Saturation(), "exactly Staleness old is fresh")
	clk.Advance(time.Nanosecond)
	p.Rescore()
	assert.Equal(t, 1.0, p.Saturation(), "older is stale")
	assert.False(t, p.Readings()[0].Usable)
}

// TestPollerLiveCredit: Dispatched and Finished move the saturation at once,
// without Rescore, by the formula of Scorer.
func TestPollerLiveCredit(t *testing.T) {
	clk := newFakeClock()
	a, _ := vllmPod(t, 1, 2, 0)   // waiting 1, running 2
	b, _ := vllmPod(t, 0, 0, 0.4) // kv 0.4 → 0.5
	p := newTestPoller(t, PollerConfig{
		Endpoints: []string{a, b}, Now: clk.Now,
		Scorer: Scorer{InFlightCredit: true},
	})
	require.NoError(t, p.Scrape(context.Background()))
	seq := p.ReadingSeq()
	assert.Equal(t, uint64(2), seq, "one result per pod")
	assert.InDelta(t, (0.2+0.5)/2, p.Saturation(), 1e-12)
	for range 8 {
		require.True(t, p.Dispatched(a))
	}
	// a: waiting' = 1 + (8 − 3) = 6 → 1.2; b unchanged.
	assert.InDelta(t, (1.2+0.5)/2, p.Saturation(), 1e-5)
	assert.Equal(t, int64(8), p.InFlight(a))
	assert.Equal(t, int64(8), p.Readings()[0].InFlight)
	// b: kv term 0.5 = 2.5 waiting: the first 2 requests add nothing,
	// the third 0.5/5, then 1/5 each.
	for range 2 {
		require.True(t, p.Dispatched(b))
	}
	assert.InDelta(t, (1.2+0.5)/2, p.Saturation(), 1e-5)
	require.True(t, p.Dispatched(b))
	assert.InDelta(t, (1.2+0.6)/2, p.Saturation(), 1e-5)
	require.True(t, p.Dispatched(b))
	assert.InDelta(t, (1.2+0.8)/2, p.Saturation(), 1e-5)
	for range 4 {
		require.True(t, p.Finished(b))
	}
	assert.False(t, p.Finished(b), "nothing in flight")
	assert.Equal(t, uint64(1), p.Unbalanced())
	assert.False(t, p.Dispatched("http://unknown/metrics"))
	assert.Equal(t, seq, p.ReadingSeq(), "credit is not a reading")
	p.Rescore()
	assert.Equal(t, seq, p.ReadingSeq(), "nor is a rescore")
	assert.InDelta(t, (1.2+0.5)/2, p.Saturation(), 1e-5)

	// A pod removed with requests in flight keeps its count out of the
	// score, and resumes it when added back.
	require.NoError(t, p.SetEndpoints([]string{b}))
	assert.InDelta(t, 0.5, p.Saturation(), 1e-12)
	assert.Equal(t, int64(8), p.InFlight(a))
	require.True(t, p.Finished(a))
	require.NoError(t, p.SetEndpoints([]string{a, b}))
	assert.Equal(t, int64(7), p.InFlight(a))
	require.NoError(t, p.Scrape(context.Background()))
	assert.Equal(t, seq+2, p.ReadingSeq())
	// a: waiting' = 1 + (7 − 3) = 5 → 1.
	assert.InDelta(t, (1+0.5)/2, p.Saturation(), 1e-5)
}

func TestPollerSetEndpoints(t *testing.T) {
	clk := newFakeClock()
	a, _ := vllmPod(t, 0, 0, 0)
	b, _ := vllmPod(t, 0, 0, 0.8)
	p := newTestPoller(t, PollerConfig{Now: clk.Now})
	assert.Equal(t, 1.0, p.Saturation(), "empty pool")
	require.NoError(t, p.Scrape(context.Background()), "polling no endpoints is fine")
	assert.Equal(t, 1.0, p.Saturation(), "empty pool after a round")

	require.NoError(t, p.SetEndpoints([]string{a, a}))
	assert.Equal(t, []string{a}, p.Endpoints(), "duplicates merged")
	require.NoError(t, p.Scrape(context.Background()))
	assert.Equal(t, 0.0, p.Saturation())

	require.NoError(t, p.SetEndpoints([]string{a, b}))
	assert.Equal(t, 0.5, p.Saturation(), "a new pod scores 1 until scraped; a keeps its reading")
	require.NoError(t, p.Scrape(context.Background()))
	assert.Equal(t, 0.5, p.Saturation(), "b scraped: (0 + 1)/2")

	for _, bad := range []string{"", "localhost:80/metrics", "ftp://x/metrics", "http://", "http://[::1"} {
		err := p.SetEndpoints([]string{a, bad})
		assert.ErrorIs(t, err, ErrInvalidConfig, "%q", bad)
	}
	assert.Equal(t, []string{a, b}, p.Endpoints(), "a failed SetEndpoints changes nothing")

	require.NoError(t, p.SetEndpoints(nil))
	assert.Equal(t, 1.0, p.Saturation())
	assert.Empty(t, p.Readings())
}

func TestPollerDefaults(t *testing.T) {
	p, err := NewPoller(PollerConfig{})
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, DefaultInterval, p.cfg.Interval)
	assert.Equal(t, DefaultTimeout, p.cfg.Timeout)
	assert.Equal(t, int64(DefaultMaxBodyBytes), p.cfg.MaxBodyBytes)
	assert.Equal(t, DefaultMaxConcurrency, p.cfg.MaxConcurrency)
	assert.Equal(t, VLLM(), p.cfg.Metrics)
	assert.NotNil(t, p.cfg.Client)
	assert.NotNil(t, p.cfg.Now)
	assert.Equal(t, 1.0, p.Saturation())
}

// TestNewPollerValidation covers every configuration rule: each bad value
// is an ErrInvalidConfig error, prefixed with the package name, naming the
// field; each edge value is accepted.
func TestNewPollerValidation(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	bad := []struct {
		field string
		cfg   PollerConfig
	}{
		{"PollerConfig.Interval", PollerConfig{Interval: -1}},
		{"PollerConfig.Interval", PollerConfig{Interval: time.Nanosecond}}, // scrapeInterval: 1ns
		{"PollerConfig.Interval", PollerConfig{Interval: MinInterval - 1}},
		{"PollerConfig.Interval", PollerConfig{Interval: MaxInterval + 1}},
		{"PollerConfig.Timeout", PollerConfig{Timeout: -1}},
		{"PollerConfig.Timeout", PollerConfig{Timeout: MinTimeout - 1}},
		{"PollerConfig.Timeout", PollerConfig{Timeout: DefaultStaleness + 1}},
		{"PollerConfig.Timeout", PollerConfig{Timeout: 2 * time.Second, Scorer: Scorer{Staleness: time.Second}}},
		{"PollerConfig.MaxConcurrency", PollerConfig{MaxConcurrency: -1}},
		{"PollerConfig.MaxBodyBytes", PollerConfig{MaxBodyBytes: -1}},
		{"Scorer.QueueDepthThreshold", PollerConfig{Scorer: Scorer{QueueDepthThreshold: -2}}},
		{"Scorer.QueueDepthThreshold", PollerConfig{Scorer: Scorer{QueueDepthThreshold: nan}}},
		{"Scorer.QueueDepthThreshold", PollerConfig{Scorer: Scorer{QueueDepthThreshold: inf}}},
		{"Scorer.KVUtilThreshold", PollerConfig{Scorer: Scorer{KVUtilThreshold: 5}}},
		{"Scorer.KVUtilThreshold", PollerConfig{Scorer: Scorer{KVUtilThreshold: -0.5}}},
		{"Scorer.KVUtilThreshold", PollerConfig{Scorer: Scorer{KVUtilThreshold: nan}}},
		{"Scorer.Staleness", PollerConfig{Scorer: Scorer{Staleness: -1}}},
		{"Scorer.Staleness", PollerConfig{Scorer: Scorer{Staleness: time.Nanosecond}}},
		{"Scorer.Staleness", PollerConfig{Scorer: Scorer{Staleness: 87600 * time.Hour}}}, // metricsStalenessThreshold: 87600h
		{"MetricNames.KVUsage", PollerConfig{Metrics: MetricNames{Waiting: []string{"w"}}}},
		{"MetricNames.Waiting", PollerConfig{Metrics: MetricNames{KVUsage: []string{"kv"}}}},
		{"endpoint 0", PollerConfig{Endpoints: []string{"not a url"}}},
	}
	for _, c := range bad {
		_, err := NewPoller(c.cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, c.field)
		assert.ErrorContains(t, err, c.field)
		if err != nil {
			assert.True(t, strings.HasPrefix(err.Error(), "saturation: "), "%q", err)
		}
	}
	good := map[string]PollerConfig{
		"zero":                 {},
		"interval edges":       {Interval: MinInterval},
		"interval upper edge":  {Interval: MaxInterval},
		"timeout = staleness":  {Timeout: DefaultStaleness},
		"timeout lower edge":   {Timeout: MinTimeout},
		"staleness edges":      {Timeout: MinTimeout, Scorer: Scorer{Staleness: MinStaleness}},
		"staleness upper edge": {Timeout: time.Hour, Scorer: Scorer{Staleness: MaxStaleness}},
		"kv threshold 1":       {Scorer: Scorer{KVUtilThreshold: 1}},
		"credit, own counters": {Scorer: Scorer{InFlightCredit: true}},
		"credit with peers":    {Scorer: Scorer{InFlightCredit: true}, PeerInFlight: func(string) int64 { return 0 }},
	}
	for name, cfg := range good {
		p, err := NewPoller(cfg)
		if assert.NoError(t, err, name) {
			require.NoError(t, p.Close())
		}
	}
	// An unset Timeout never exceeds a short staleness.
	p, err := NewPoller(PollerConfig{Scorer: Scorer{Staleness: 50 * time.Millisecond}})
	require.NoError(t, err)
	assert.Equal(t, 50*time.Millisecond, p.cfg.Timeout)
	require.NoError(t, p.Close())
}

// TestPollerCancelledScrape: cancelling the caller's context ends a round stuck
// on a hanging pod at once, without waiting for Timeout.
func TestPollerCancelledScrape(t *testing.T) {
	ep := serve(t, hang(t))
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Timeout: time.Hour, Scorer: Scorer{Staleness: time.Hour}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- p.Scrape(ctx) }()
	cancel()
	err := <-errc
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 1.0, p.Saturation())
}

// counting wraps a handler and reports each request on hits.
func counting(h http.Handler, hits chan<- struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		select {
		case hits <- struct{}{}:
		default:
		}
	})
}

func TestPollerStartClose(t *testing.T) {
	hits := make(chan struct{})
	ep := serve(t, counting(text("vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0\n"), hits))
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Interval: time.Millisecond})
	require.NoError(t, p.Start())
	assert.ErrorIs(t, p.Start(), ErrRunning)
	assert.ErrorIs(t, p.Run(context.Background()), ErrRunning)
	<-hits
	<-hits // the second request starts after the first round has been scored
	assert.InDelta(t, 0.2, p.Saturation(), 1e-12)
	require.NoError(t, p.Close())
	assert.Equal(t, 1.0, p.Saturation(), "a stopped poller is fail safe")
	require.NoError(t, p.Close(), "Close is idempotent")

	require.NoError(t, p.Start(), "restartable")
	// A scrape of the first run still in flight at Close may answer now
	// (its result is dropped): one hit may be its. Of three, at least two
	// are the new run's, the second of them started after its first
	// round was scored.
	<-hits
	<-hits
	<-hits
	assert.InDelta(t, 0.2, p.Saturation(), 1e-12)
	require.NoError(t, p.Close())
}

func TestPollerRun(t *testing.T) {
	hits := make(chan struct{})
	ep := serve(t, counting(text("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.6\n"), hits))
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}, Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- p.Run(ctx) }()
	for i := 0; i < 3; i++ {
		<-hits
	}
	assert.InDelta(t, 0.75, p.Saturation(), 1e-12)
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	assert.Equal(t, 1.0, p.Saturation())
}

// TestPollerConcurrentUse: readers of Saturation and Readings, SetEndpoints
// and rounds all at once (run with -race). Every value read is in range and
// is one the rules allow: a mean of 0 (a), 1 (b: 5 waiting) and 1 (failed or
// new) over the current pods.
func TestPollerConcurrentUse(t *testing.T) {
	a, _ := vllmPod(t, 0, 0, 0)
	b, _ := vllmPod(t, 5, 0, 0)
	// Generous timeouts: this test is about concurrent use, and a 100 ms
	// scrape timeout fails it on a loaded CI machine.
	p := newTestPoller(t, PollerConfig{Endpoints: []string{a}, Interval: time.Millisecond,
		Timeout: 10 * time.Second, Scorer: Scorer{Staleness: time.Minute}})
	require.NoError(t, p.Start())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := p.Saturation()
				if s != 0 && s != 0.5 && s != 1 {
					bad.Inc()
				}
				for _, r := range p.Readings() {
					if !inRange(r.Score) {
						bad.Inc()
					}
				}
			}
		}()
	}
	sets := [][]string{{a}, {a, b}, {b}, nil, {b, a}}
	for i := 0; i < 50*scale(); i++ {
		require.NoError(t, p.SetEndpoints(sets[i%len(sets)]))
		require.NoError(t, p.Scrape(context.Background()))
	}
	close(stop)
	wg.Wait()
	require.NoError(t, p.Close())
	assert.Zero(t, bad.Load())
}

func TestPollerScoresNeverBad(t *testing.T) {
	// Whatever a pod serves, the pool value stays in range (complements
	// FuzzParse over real HTTP).
	bodies := append(fuzzSeeds(t), "vllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc 1e300\n")
	eps := make([]string, len(bodies))
	for i, b := range bodies {
		eps[i] = serve(t, text(b))
	}
	p := newTestPoller(t, PollerConfig{Endpoints: eps})
	_ = p.Scrape(context.Background())
	s := p.Saturation()
	assert.True(t, inRange(s) && !math.IsNaN(s), "%v", s)
	assert.Greater(t, s, 0.0)
}

// TestReadsAllocFree: what a dispatcher reads each tick never allocates.
// (The root BenchmarkSaturation measures the same with a poller running; its
// allocations per op are process-wide, so only this test isolates the read.)
func TestReadsAllocFree(t *testing.T) {
	ep, _ := vllmPod(t, 1, 1, 0.5)
	p := newTestPoller(t, PollerConfig{Endpoints: []string{ep}})
	require.NoError(t, p.Scrape(context.Background()))
	var v Value
	v.Set(0.3)
	inflight, err := NewInFlight(8)
	require.NoError(t, err)
	e, err := NewEWMA(Max(p, &v, inflight), time.Second, nil)
	require.NoError(t, err)
	srcs := map[string]Source{"poller": p, "value": &v, "inflight": inflight,
		"max": Max(p, &v, inflight), "mean": Mean(p, &v), "ewma": e,
		"func": Func(func() float64 { return 0.5 })}
	for name, s := range srcs {
		var sink float64
		allocs := testing.AllocsPerRun(200, func() {
			sink += s.Saturation()
			inflight.Inc()
			inflight.Dec()
		})
		assert.Zero(t, allocs, name)
		assert.True(t, inRange(sink/201), name)
	}
}
