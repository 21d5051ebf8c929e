package main

import (
	"bufio"
	"context"
	"fmt"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeBinary()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fullSize reports whether FLOWGATE_FULL=1 asks for the heavy tests (the
// chaos run, the replicas' end-to-end load) at full size, as .ci/run does;
// otherwise they run smaller, and each logs which size it ran.
func fullSize() bool { return os.Getenv("FLOWGATE_FULL") == "1" }

// eventually spins (yielding, never sleeping) until cond holds, failing
// after 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// backendStub is a fake vLLM server whose /metrics can be overridden to
// report a saturated pod, so that tests choose when bands are gated.
type backendStub struct {
	fake      *fakevllm.Server
	srv       *httptest.Server
	saturated atomic.Bool
}

func (b *backendStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" && b.saturated.Load() {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, "vllm:num_requests_waiting 100\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 1\n")
		return
	}
	b.fake.ServeHTTP(w, r)
}

func newStub(t *testing.T, speedUp float64) *backendStub {
	t.Helper()
	return newStubWith(t, fakevllm.Config{SpeedUp: speedUp})
}

func newStubWith(t *testing.T, cfg fakevllm.Config) *backendStub {
	t.Helper()
	f, err := fakevllm.New(cfg)
	require.NoError(t, err)
	b := &backendStub{fake: f}
	b.srv = httptest.NewServer(b)
	t.Cleanup(func() {
		f.Close()
		b.srv.Close()
	})
	return b
}

type harness struct {
	p        *gateway.Proxy
	srv      *httptest.Server
	finished chan [3]any // band, code, reason of each gated request
}

func newHarness(t *testing.T, cfg gateway.Config, backends ...*backendStub) *harness {
	t.Helper()
	var urls []string
	for _, b := range backends {
		urls = append(urls, b.srv.URL)
	}
	h := &harness{finished: make(chan [3]any, 1024)}
	// The tests send the objective header as a trusted front proxy would.
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: urls, Logf: t.Logf, TrustObjectiveHeader: true,
		OnFinish: func(band, code int, reason string) { h.finished <- [3]any{band, code, reason} }})
	require.NoError(t, err)
	p.Start()
	h.p = p
	h.srv = httptest.NewServer(p)
	t.Cleanup(func() {
		p.Close()
		h.srv.Close()
	})
	return h
}

func (h *harness) send(ctx context.Context, t *testing.T, objective, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	if objective != "" {
		req.Header.Set(gateway.ObjectiveHeader, objective)
	}
	return http.DefaultClient.Do(req)
}

func (h *harness) nextFinish(t *testing.T) (band, code int, reason string) {
	t.Helper()
	select {
	case f := <-h.finished:
		return f[0].(int), f[1].(int), f[2].(string)
	case <-time.After(20 * time.Second):
		t.Fatal("no request finished")
	}
	return
}

func testConfig() gateway.Config {
	cfg := gateway.DefaultConfig()
	cfg.Saturation.ScrapeInterval = 5 * time.Millisecond
	cfg.Saturation.MetricsStalenessThreshold = time.Second
	return cfg
}

func firstEvent(t *testing.T, resp *http.Response) (string, *bufio.Scanner) {
	t.Helper()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if after, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			return after, sc
		}
	}
	t.Fatalf("no event: %v", sc.Err())
	return "", nil
}

// TestStreamingFirstTokenBeforeLast: through the proxy, the first token
// reaches the client while the backend is still generating; the band header
// is set.
func TestStreamingFirstTokenBeforeLast(t *testing.T) {
	b := newStub(t, 2)
	h := newHarness(t, testConfig(), b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := h.send(ctx, t, "critical", `{"prompt":"x","max_tokens":500,"stream":true}`)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "critical", resp.Header.Get(gateway.BandHeader))
	ev, _ := firstEvent(t, resp)
	require.Contains(t, ev, `"text":" the"`)
	require.Zero(t, b.fake.Completed(), "500 tokens at 2x take seconds: the first must arrive before the last")
	cancel()
	_, code, reason := h.nextFinish(t)
	require.Equal(t, 200, code)
	require.Equal(t, gateway.ReasonCancelled, reason)
}

// TestDisconnectMidStreamReleasesSlot: a client that leaves mid-stream
// releases its in-flight slot (controller and backend count).
func TestDisconnectMidStreamReleasesSlot(t *testing.T) {
	b := newStub(t, 1)
	h := newHarness(t, testConfig(), b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := h.send(ctx, t, "sheddable", `{"prompt":"x","max_tokens":1000,"stream":true}`)
	require.NoError(t, err)
	defer resp.Body.Close()
	firstEvent(t, resp)
	require.Equal(t, int64(1), h.p.Controller().InFlight())
	require.Equal(t, []int64{1}, h.p.InFlight())
	cancel()
	band, code, reason := h.nextFinish(t)
	require.Equal(t, 1, band)
	require.Equal(t, 200, code)
	require.Equal(t, gateway.ReasonCancelled, reason)
	require.Equal(t, int64(0), h.p.Controller().InFlight())
	require.Equal(t, []int64{0}, h.p.InFlight())
	require.Equal(t, uint64(1), h.p.Controller().Stats().Bands[1].Dispatched)
}

// TestDisconnectWhileQueuedFreesPlace: sheddable is gated (backend reports
// saturation 20); a queued client leaves; the proxy records the cancelled
// outcome, the place is free at once although the band stays gated, and the
// next request takes it and goes through when the band opens.
func TestDisconnectWhileQueuedFreesPlace(t *testing.T) {
	b := newStub(t, 20)
	b.saturated.Store(true)
	cfg := testConfig()
	cfg.Bands[1].Capacity = 1
	h := newHarness(t, cfg, b)
	ctrl := h.p.Controller()
	eventually(t, "saturation read", func() bool { return ctrl.Stats().Saturation >= 1 })

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		resp, err := h.send(ctx, t, "sheddable", `{"prompt":"x","max_tokens":2}`)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "queued", func() bool { return ctrl.Stats().Bands[1].Queued == 1 })
	// The band holds one: a second is refused at once.
	resp, err := h.send(context.Background(), t, "sheddable", `{"prompt":"x","max_tokens":2}`)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, gateway.ReasonQueueFull, resp.Header.Get(gateway.ReasonHeader))
	_, code, reason := h.nextFinish(t)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, gateway.ReasonQueueFull, reason)

	cancel()
	require.Error(t, <-errc)
	band, code, reason := h.nextFinish(t)
	require.Equal(t, 1, band)
	require.Equal(t, 0, code)
	require.Equal(t, gateway.ReasonCancelled, reason)

	// Still gated: the dispatcher reaps the dead entry at once (cancelled
	// outcome, place given back) without waiting for the band to open.
	eventually(t, "cancelled outcome", func() bool {
		st := ctrl.Stats().Bands[1]
		return st.Cancelled == 1 && st.Queued == 0
	})
	require.Equal(t, 0, ctrl.Stats().Bands[1].Gate.Every, "band still blocked")
	// The freed place takes the next request, which waits until the band
	// opens and is then served.
	codes := make(chan int, 1)
	go func() {
		resp, err := h.send(context.Background(), t, "sheddable", `{"prompt":"x","max_tokens":2}`)
		if err != nil {
			codes <- -1
			return
		}
		resp.Body.Close()
		codes <- resp.StatusCode
	}()
	eventually(t, "queued in the freed place", func() bool { return ctrl.Stats().Bands[1].Queued == 1 })
	b.saturated.Store(false)
	require.Equal(t, http.StatusOK, <-codes)
	st := ctrl.Stats().Bands[1]
	require.Equal(t, uint64(1), st.Dispatched)
	require.Equal(t, uint64(1), st.Cancelled)
	require.Equal(t, 0, st.Queued)
}

// TestMetricsEndpointMatchesStats scrapes the proxy's /metrics over HTTP,
// parses it with expfmt and compares it to the Stats snapshot of the
// stopped controller (stopped so that nothing moves between the two).
func TestMetricsEndpointMatchesStats(t *testing.T) {
	b := newStub(t, 50)
	h := newHarness(t, testConfig(), b)
	for i, obj := range []string{"critical", "sheddable", "critical", ""} {
		resp, err := h.send(context.Background(), t, obj, fmt.Sprintf(`{"prompt":"x","max_tokens":%d}`, i+1))
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body) // read it all: closing early is leaving
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	for range 4 { // the handler counts after the client has the response
		_, code, reason := h.nextFinish(t)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, gateway.ReasonForwarded, reason)
	}
	h.p.Close() // stops ticking; /metrics is still served
	st := h.p.Controller().Stats()
	resp, err := http.Get(h.srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	get := func(name string, labels ...string) *dto.Metric {
		f := fams[name]
		require.NotNil(t, f, name)
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				ok := false
				for _, l := range m.GetLabel() {
					ok = ok || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !ok {
					continue next
				}
			}
			return m
		}
		t.Fatalf("%s %v missing", name, labels)
		return nil
	}
	require.Equal(t, st.Saturation, get("flowgate_saturation").GetGauge().GetValue())
	require.Equal(t, float64(st.Ticks), get("flowgate_ticks_total").GetCounter().GetValue())
	total := 0.0
	for i, name := range []string{"critical", "sheddable"} {
		bs := st.Bands[i]
		require.Equal(t, float64(bs.Queued), get("flowgate_queue_depth", "band", name).GetGauge().GetValue())
		require.Equal(t, bs.Gate.Ceiling, get("flowgate_band_ceiling", "band", name).GetGauge().GetValue())
		require.Equal(t, float64(bs.Gate.Every), get("flowgate_band_duty_cycle_ticks", "band", name).GetGauge().GetValue())
		for reason, v := range map[string]uint64{"queue_full": bs.Rejected, "closed": bs.Refused.Closed,
			"cancelled": bs.Refused.Cancelled, "not_running": bs.Refused.NotRunning} {
			require.Equal(t, float64(v), get("flowgate_refused_total", "band", name, "reason", reason).GetCounter().GetValue())
		}
		for outcome, v := range map[string]uint64{"dispatched": bs.Dispatched, "cancelled": bs.Cancelled,
			"expired": bs.Expired, "closed": bs.Closed} {
			require.Equal(t, float64(v), get("flowgate_requests_total", "band", name, "outcome", outcome).GetCounter().GetValue())
			require.Equal(t, v, get("flowgate_wait_seconds", "band", name, "outcome", outcome).GetHistogram().GetSampleCount())
		}
		total += get("flowgate_requests_total", "band", name, "outcome", "dispatched").GetCounter().GetValue()
		require.Equal(t, float64(bs.Dispatched), get("flowgate_proxy_responses_total", "band", name, "code", "200", "reason", "forwarded").GetCounter().GetValue())
	}
	require.Equal(t, 4.0, total)
	require.Equal(t, uint64(2), st.Bands[0].Dispatched)
	require.Equal(t, uint64(2), st.Bands[1].Dispatched) // "" → default band
	require.Equal(t, 0.0, get("flowgate_endpoint_inflight", "endpoint", b.srv.URL).GetGauge().GetValue())
}

// TestShutdownUnderLoadLosesNothing: critical requests stream while
// sheddable ones are held (gated); a graceful shutdown answers every queued
// one 503 shutting-down and lets every stream finish with [DONE].
func TestShutdownUnderLoadLosesNothing(t *testing.T) {
	b := newStub(t, 20)
	b.saturated.Store(true) // sheddable gated, critical flows
	h := newHarness(t, testConfig(), b)
	ctrl := h.p.Controller()
	eventually(t, "saturation read", func() bool { return ctrl.Stats().Saturation >= 1 })

	const nCrit, nShed = 6, 10
	type outcome struct {
		critical bool
		code     int
		reason   string
		complete bool
		err      error
	}
	results := make(chan outcome, nCrit+nShed)
	var wg sync.WaitGroup
	run := func(critical bool, started chan<- struct{}) {
		defer wg.Done()
		obj := "sheddable"
		if critical {
			obj = "critical"
		}
		resp, err := h.send(context.Background(), t, obj, `{"prompt":"x","max_tokens":200,"stream":true}`)
		if err != nil {
			results <- outcome{critical: critical, err: err}
			return
		}
		defer resp.Body.Close()
		o := outcome{critical: critical, code: resp.StatusCode, reason: resp.Header.Get(gateway.ReasonHeader)}
		sc := bufio.NewScanner(resp.Body)
		first := true
		for sc.Scan() {
			if first && strings.HasPrefix(sc.Text(), "data: ") {
				first = false
				if started != nil {
					started <- struct{}{}
				}
			}
			o.complete = o.complete || sc.Text() == "data: [DONE]"
		}
		results <- o
	}
	started := make(chan struct{}, nCrit)
	wg.Add(nCrit + nShed)
	for range nCrit {
		go run(true, started)
	}
	for range nShed {
		go run(false, nil)
	}
	for range nCrit {
		<-started // every critical stream is under way
	}
	eventually(t, "sheddable queued", func() bool { return ctrl.Stats().Bands[1].Queued == nShed })

	// Graceful shutdown, as main does on SIGTERM.
	h.p.Drain()
	h.srv.Config.SetKeepAlivesEnabled(false)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, h.srv.Config.Shutdown(sctx))
	wg.Wait()
	close(results)
	var crit, shed int
	for o := range results {
		require.NoError(t, o.err)
		if o.critical {
			crit++
			require.Equal(t, http.StatusOK, o.code)
			require.True(t, o.complete, "a stream in flight was cut by the shutdown")
		} else {
			shed++
			require.Equal(t, http.StatusServiceUnavailable, o.code)
			require.Equal(t, gateway.ReasonShutdown, o.reason)
		}
	}
	require.Equal(t, nCrit, crit)
	require.Equal(t, nShed, shed)
	st := ctrl.Stats()
	require.Equal(t, uint64(nCrit), st.Bands[0].Dispatched)
	require.Equal(t, uint64(nShed), st.Bands[1].Closed)
	require.Equal(t, 0, st.Bands[1].Queued)
	require.Equal(t, int64(0), ctrl.InFlight())
}

// TestBandResolution: header, body priority and default, end to end. The
// backend schedules by priority: the proxy forwards a body's priority with
// the granted band's value (bodyPriority keep), which the fake, like vLLM's
// V0 engine, refuses under fcfs. A body priority only lowers a request
// below its ceiling (the default band, for a caller without a key).
func TestBandResolution(t *testing.T) {
	b := newStubWith(t, fakevllm.Config{SpeedUp: 50, SchedulingPolicy: fakevllm.PolicyPriority})
	h := newHarness(t, testConfig(), b)
	for _, tc := range []struct {
		objective, body, band string
	}{
		{"critical", `{"prompt":"x","max_tokens":1}`, "critical"},
		{"sheddable", `{"prompt":"x","max_tokens":1,"priority":0}`, "sheddable"},
		{"", `{"prompt":"x","max_tokens":1,"priority":0}`, "sheddable"},
		{"", `{"prompt":"x","max_tokens":1,"priority":7}`, "sheddable"},
		{"unknown-objective", `{"prompt":"x","max_tokens":1,"priority":-3}`, "sheddable"},
		{"", `{"prompt":"x","max_tokens":1}`, "sheddable"},
	} {
		resp, err := h.send(context.Background(), t, tc.objective, tc.body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, tc.band, resp.Header.Get(gateway.BandHeader), "%+v", tc)
	}
}
