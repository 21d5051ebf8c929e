package flowhttp_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
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

// evictStall is the tests' EvictionConfig.Stall: a critical request
// without its first byte for this long counts as held.
const evictStall = 20 * time.Millisecond

// evictEnv is a Gateway with eviction on over one pod, its OnFinish
// results and the pod's metrics URL (the poller's name for it).
type evictEnv struct {
	gw      *flowhttp.Gateway
	srv     *httptest.Server
	pod     *pod
	metrics string
	mu      sync.Mutex
	results map[string][]flowhttp.Result // by the request's x-test-id
}

// newEvictEnv starts it; handle serves the pod's requests.
func newEvictEnv(t testing.TB, cfg flowhttp.GatewayConfig, handle func(w http.ResponseWriter, r *http.Request)) *evictEnv {
	t.Helper()
	e := &evictEnv{results: map[string][]flowhttp.Result{}}
	e.pod = newPod(t, handle)
	e.metrics = e.pod.srv.URL + "/metrics"
	cfg.Eviction.Enabled = true
	if cfg.Eviction.Stall == 0 {
		cfg.Eviction.Stall = evictStall
	}
	cfg.HTTP.TrustObjectiveHeader = true
	cfg.HTTP.OnFinish = func(r *http.Request, res flowhttp.Result) {
		e.mu.Lock()
		id := r.Header.Get("x-test-id")
		e.results[id] = append(e.results[id], res)
		e.mu.Unlock()
	}
	e.gw, e.srv = runGateway(t, cfg, e.pod)
	readAll(t, e.gw)
	return e
}

// result waits for the one result of request id.
func (e *evictEnv) result(t testing.TB, id string) flowhttp.Result {
	t.Helper()
	waitFor(t, "the result of "+id, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.results[id]) > 0
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	require.Len(t, e.results[id], 1, "results of %s", id)
	return e.results[id][0]
}

// send posts body as objective with id and returns the response's status,
// headers and whole body (the status is 0 if the request failed).
func (e *evictEnv) send(ctx context.Context, id, objective, body string) (int, http.Header, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set(flowhttp.ObjectiveHeader, objective)
	req.Header.Set("x-test-id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header, string(b) + "<read error: " + err.Error() + ">"
	}
	return resp.StatusCode, resp.Header, string(b)
}

// saturate makes the pod read saturated (10 waiting: score 1.6) with its
// KV cache full, and waits for the gateway to see it.
func (e *evictEnv) saturate(t testing.TB) {
	t.Helper()
	e.pod.waiting.Store(10)
	e.pod.kv.Store(1000)
	waitFor(t, "the pool read saturated and full", func() bool {
		return e.gw.Saturation() >= 1 && e.gw.Poller().KVUsage(e.metrics) >= flowcontrol.DefaultEvictionKVThreshold
	})
}

// idle makes the pod read idle.
func (e *evictEnv) idle() { e.pod.waiting.Store(0); e.pod.kv.Store(0) }

type reply struct {
	code   int
	header http.Header
	body   string
}

// goSend is send on a goroutine of its own.
func (e *evictEnv) goSend(ctx context.Context, id, objective, body string) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		code, hd, b := e.send(ctx, id, objective, body)
		ch <- reply{code, hd, b}
	}()
	return ch
}

func recv(t testing.TB, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(time.Minute):
		t.Fatal("no response within a minute")
		return reply{}
	}
}

// scripted is a pod's handler: the sheddable request's first attempt
// waits until the gateway cancels it (the model server's abort), later
// ones answer its full body; a critical request stalls (no first byte)
// until crit is closed.
type scripted struct {
	shedAttempts atomic.Int64
	aborted      chan struct{} // closed when the first sheddable attempt was cancelled
	crit         chan struct{}
	once         sync.Once
}

func newScripted() *scripted {
	return &scripted{aborted: make(chan struct{}), crit: make(chan struct{})}
}

// release lets the critical requests answer.
func (s *scripted) release() { s.once.Do(func() { close(s.crit) }) }

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(flowhttp.ObjectiveHeader) == "critical" {
		select {
		case <-s.crit:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "critical answer")
		return
	}
	if s.shedAttempts.Add(1) == 1 {
		<-r.Context().Done() // held: the server never answers it
		close(s.aborted)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"text":"the whole sheddable answer"}`)
}

// A forwarded sheddable request that has sent nothing to its client is
// evicted for a critical request stalled behind it on a saturated pool: its
// upstream request is cancelled (the server sees the abort), it waits again
// at the head of its band, and once the pool has room its client gets one
// 200 with the whole body of the second attempt, nothing of the first.
// While it waits again it counts nowhere: not on its endpoint, not in the
// controller's in-flight (the test fails if either counts it twice).
func TestEvictionRequeuesAnUnstartedVictim(t *testing.T) {
	s := newScripted()
	e := newEvictEnv(t, flowhttp.GatewayConfig{}, s.serve)
	t.Cleanup(s.release) // before the servers close: a failed test must not leave handlers waiting
	const shedBody = `{"prompt":"a long sheddable prompt"}`
	shed := e.goSend(context.Background(), "shed", "sheddable", shedBody)
	waitFor(t, "the sheddable request at the pod", func() bool { return s.shedAttempts.Load() == 1 })
	e.saturate(t)
	crit := e.goSend(context.Background(), "crit", "critical", `{"prompt":"urgent"}`)

	select {
	case <-s.aborted:
	case <-time.After(time.Minute):
		t.Fatal("the sheddable request was never evicted")
	}
	ctrl := e.gw.Controller()
	waitFor(t, "the victim queued again", func() bool { return ctrl.Stats().Bands[1].Queued == 1 })
	// The critical request is the one request on the endpoint and in
	// flight: the victim's first attempt was given back exactly once.
	require.Equal(t, int64(1), e.gw.Poller().InFlight(e.metrics), "requests counted on the endpoint")
	require.Equal(t, int64(1), ctrl.InFlight(), "requests in flight at the controller")
	ev, ok := e.gw.Evictions()
	require.True(t, ok)
	require.Equal(t, uint64(1), ev.Requeued[1])
	require.Equal(t, uint64(len(shedBody)), ev.ResentBytes[1])
	require.Positive(t, ev.Wasted[1])
	require.Equal(t, 1, ev.Tracked, "only the critical request is tracked")

	s.release()
	c := recv(t, crit)
	require.Equal(t, 200, c.code)
	require.Equal(t, "critical answer", c.body)

	e.idle()
	r := recv(t, shed)
	require.Equal(t, 200, r.code, r.body)
	require.Equal(t, `{"text":"the whole sheddable answer"}`, r.body)
	require.Equal(t, "sheddable", r.header.Get(flowhttp.BandHeader))
	require.Empty(t, r.header.Get(flowhttp.DroppedReasonHeader))
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.Equal(t, int64(2), s.shedAttempts.Load())

	res := e.result(t, "shed")
	require.Equal(t, flowhttp.ReasonForwarded, res.Reason)
	require.Equal(t, 200, res.Status)
	require.Equal(t, 1, res.Evictions)
	require.Nil(t, res.Err)
	require.Equal(t, 0, e.result(t, "crit").Evictions)

	waitFor(t, "nothing in flight", func() bool {
		return ctrl.InFlight() == 0 && e.gw.Poller().InFlight(e.metrics) == 0
	})
	ev, _ = e.gw.Evictions()
	require.Equal(t, 0, ev.Tracked)
	require.Equal(t, 0, ev.Evicting)
	require.Equal(t, uint64(1), ev.Evicted[1])
	require.Equal(t, uint64(0), ev.Ended[1]+ev.Declined[1])
}

// A victim re-queued keeps its first wait's deadline: when its band's
// MaxWait runs out before the pool has room, it is answered 503 expired,
// with Retry-After (the gateway, not the client, cost it its turn).
func TestEvictionRequeuedVictimExpires(t *testing.T) {
	s := newScripted()
	bands := flowhttp.DefaultBands()
	bands[1].MaxWait = 2 * time.Second
	e := newEvictEnv(t, flowhttp.GatewayConfig{Flow: flowcontrol.Config{Bands: bands}}, s.serve)
	t.Cleanup(s.release)
	shed := e.goSend(context.Background(), "shed", "sheddable", `{"prompt":"x"}`)
	waitFor(t, "the sheddable request at the pod", func() bool { return s.shedAttempts.Load() == 1 })
	e.saturate(t)
	crit := e.goSend(context.Background(), "crit", "critical", `{"prompt":"urgent"}`)

	r := recv(t, shed) // the pool stays saturated: its band stays blocked
	require.Equal(t, 503, r.code, r.body)
	require.Equal(t, flowhttp.ReasonExpired, decodeError(t, r.body).Error.Code)
	require.Equal(t, flowhttp.ReasonExpired, r.header.Get(flowhttp.DroppedReasonHeader))
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Empty(t, r.header.Get(flowhttp.ShouldRetryHeader))
	res := e.result(t, "shed")
	require.Equal(t, flowhttp.ReasonExpired, res.Reason)
	require.ErrorIs(t, res.Err, flowcontrol.ErrExpired)
	require.Equal(t, 1, res.Evictions)
	require.Equal(t, int64(1), s.shedAttempts.Load())

	s.release()
	require.Equal(t, 200, recv(t, crit).code)
	waitFor(t, "nothing in flight", func() bool {
		return e.gw.Controller().InFlight() == 0 && e.gw.Poller().InFlight(e.metrics) == 0
	})
}

// A streamed response that has started is never cut by default, however
// long a critical request stalls behind it; with Started, the evictor takes
// it and its stream ends with an OpenAI-shaped error event.
func TestEvictionStartedStream(t *testing.T) {
	for _, started := range []bool{false, true} {
		t.Run(fmt.Sprintf("started=%v", started), func(t *testing.T) {
			crit, more := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(crit); close(more) }) }
			var cut atomic.Bool
			handle := func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(flowhttp.ObjectiveHeader) == "critical" {
					select {
					case <-crit:
					case <-r.Context().Done():
						return
					}
					_, _ = io.WriteString(w, "critical answer")
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: {\"text\":\"one\"}\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-more:
				case <-r.Context().Done():
					cut.Store(true)
					return
				}
				_, _ = io.WriteString(w, "data: {\"text\":\"two\"}\n\ndata: [DONE]\n\n")
			}
			e := newEvictEnv(t, flowhttp.GatewayConfig{Eviction: flowcontrol.EvictionConfig{Started: started}}, handle)
			t.Cleanup(release) // before the servers close: a failed test must not leave handlers waiting

			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
			req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
			req.Header.Set("x-test-id", "shed")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			br := bufio.NewReader(resp.Body)
			first, err := br.ReadString('\n')
			require.NoError(t, err)
			require.Equal(t, "data: {\"text\":\"one\"}\n", first)

			e.saturate(t)
			sent := time.Now()
			critReply := e.goSend(context.Background(), "crit", "critical", `{"prompt":"urgent"}`)
			ev := e.gw.Controller().Evictor()
			if !started {
				// The critical request is held (tracked, no first byte
				// past Stall) on a saturated pool, and the one candidate
				// has started: nothing is taken.
				waitFor(t, "the critical request held", func() bool {
					return ev.Stats().Tracked == 2 && time.Since(sent) > 3*evictStall
				})
				require.GreaterOrEqual(t, e.gw.Saturation(), 1.0)
				require.Zero(t, ev.Check())
				require.Equal(t, uint64(0), ev.Stats().Evicted[1])
				release()
				rest, err := io.ReadAll(br)
				require.NoError(t, err)
				require.Equal(t, "\ndata: {\"text\":\"two\"}\n\ndata: [DONE]\n\n", string(rest))
				require.False(t, cut.Load())
				require.Equal(t, flowhttp.ReasonForwarded, e.result(t, "shed").Reason)
			} else {
				rest, err := io.ReadAll(br)
				require.NoError(t, err, "the stream ends cleanly after the error event")
				require.NotContains(t, string(rest), "two")
				i := strings.Index(string(rest), "data: {\"error\":")
				require.GreaterOrEqual(t, i, 0, "no error event in %q", rest)
				ae := decodeError(t, strings.TrimSpace(string(rest)[i+len("data: "):]))
				require.Equal(t, flowhttp.ReasonEvicted, ae.Error.Code)
				require.Equal(t, "service_unavailable_error", ae.Error.Type)
				require.True(t, strings.HasSuffix(string(rest), "\n\n"))
				waitFor(t, "the upstream stream cancelled", cut.Load)
				res := e.result(t, "shed")
				require.Equal(t, flowhttp.ReasonEvicted, res.Reason)
				require.Equal(t, 200, res.Status)
				st, _ := e.gw.Evictions()
				require.Equal(t, uint64(1), st.Ended[1])
				require.Equal(t, uint64(0), st.Requeued[1])
			}
			release()
			require.Equal(t, 200, recv(t, critReply).code)
			waitFor(t, "nothing in flight", func() bool {
				return e.gw.Controller().InFlight() == 0 && e.gw.Poller().InFlight(e.metrics) == 0
			})
		})
	}
}

// With eviction on, a response's status and headers wait for its first
// body byte; a response without a body is sent when the handler returns,
// with the headers the handler set.
func TestEvictionHoldsHeadersUntilBody(t *testing.T) {
	e := newEvictEnv(t, flowhttp.GatewayConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "yes")
		w.WriteHeader(http.StatusNoContent)
	})
	code, hd, body := e.send(context.Background(), "a", "critical", `{}`)
	require.Equal(t, http.StatusNoContent, code)
	require.Empty(t, body)
	require.Equal(t, "yes", hd.Get("x-upstream"))
	require.Equal(t, "critical", hd.Get(flowhttp.BandHeader))
	require.Equal(t, 204, e.result(t, "a").Status)
}

// Eviction's Grace may not be shorter than the poller's interval.
func TestEvictionGraceAtLeastTheScrapeInterval(t *testing.T) {
	_, err := flowhttp.NewGateway(flowhttp.GatewayConfig{
		Poller:   pollerEvery(100 * time.Millisecond),
		Eviction: flowcontrol.EvictionConfig{Enabled: true, Grace: 50 * time.Millisecond},
	})
	require.ErrorIs(t, err, flowhttp.ErrInvalidConfig)
	require.ErrorContains(t, err, "Eviction.Grace")
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{
		Poller:   pollerEvery(100 * time.Millisecond),
		Eviction: flowcontrol.EvictionConfig{Enabled: true},
	})
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, gw.Controller().Evictor().Config().Grace)
	gw, err = flowhttp.NewGateway(flowhttp.GatewayConfig{})
	require.NoError(t, err)
	require.Nil(t, gw.Controller().Evictor(), "eviction is off by default")
	_, ok := gw.Evictions()
	require.False(t, ok)
}

func pollerEvery(d time.Duration) saturation.PollerConfig {
	return saturation.PollerConfig{Interval: d, Scorer: saturation.Scorer{Staleness: 10 * d}}
}

// Evictions, re-queues, client cancellations and completions interleaved
// over two pods: every request ends in exactly one outcome (one OnFinish),
// a client that got a 200 got its own whole answer, a request is re-queued
// at most MaxEvictions times, and once every request finished nothing is
// left counted anywhere (controller, endpoints, evictor, body memory).
func TestEvictionExactlyOnceUnderChurn(t *testing.T) {
	const (
		nShed = 60
		nCrit = 20
	)
	var shedDelay [nShed]time.Duration
	for i := range shedDelay {
		shedDelay[i] = time.Duration(i*7%40) * time.Millisecond
	}
	handle := func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("x-test-id")
		if strings.HasPrefix(id, "c") {
			select { // the server makes it wait: it is held past Stall
			case <-time.After(30 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "answer "+id)
			return
		}
		var i int
		_, _ = fmt.Sscanf(id, "s%d", &i)
		if i%2 == 1 {
			// Headers first, as vLLM may send them before the first
			// token: the request is still re-queueable.
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
		}
		select {
		case <-time.After(shedDelay[i]):
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "answer "+id)
	}
	var pods []*pod
	for range 2 {
		pods = append(pods, newPod(t, handle))
	}
	results := map[string][]flowhttp.Result{}
	var mu sync.Mutex
	cfg := flowhttp.GatewayConfig{
		Flow:     flowcontrol.Config{Policy: flowcontrol.NewStatic(100)}, // no gate: every band goes at once
		Eviction: flowcontrol.EvictionConfig{Enabled: true, Stall: 5 * time.Millisecond, Grace: 5 * time.Millisecond},
		HTTP: flowhttp.Options{TrustObjectiveHeader: true, OnFinish: func(r *http.Request, res flowhttp.Result) {
			mu.Lock()
			id := r.Header.Get("x-test-id")
			results[id] = append(results[id], res)
			mu.Unlock()
		}},
	}
	gw, _ := runGateway(t, cfg, pods...)
	// A client may cancel before its request reaches the gateway: the
	// requests that arrived are those owed an outcome.
	arrived := map[string]bool{}
	gated := gw.Handler(route(gw, pods...))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived[r.Header.Get("x-test-id")] = true
		mu.Unlock()
		gated.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	for _, p := range pods {
		p.waiting.Store(10)
		p.kv.Store(1000) // full: a held request waits for memory
	}
	waitFor(t, "the pool read saturated and full", func() bool {
		return gw.Saturation() >= 1 && gw.Poller().KVUsage(pods[0].srv.URL+"/metrics") == 1 &&
			gw.Poller().KVUsage(pods[1].srv.URL+"/metrics") == 1
	})
	e := &evictEnv{gw: gw, srv: srv}

	type got struct {
		id        string
		code      int
		body      string
		cancelled bool
	}
	replies := make(chan got, nShed+nCrit)
	var wg sync.WaitGroup
	for i := range nShed + nCrit {
		id, objective := fmt.Sprintf("s%d", i), "sheddable"
		if i >= nShed {
			id, objective = fmt.Sprintf("c%d", i-nShed), "critical"
		}
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cancelled := objective == "sheddable" && i%4 == 3
			if cancelled {
				time.AfterFunc(time.Duration(i%5)*10*time.Millisecond, cancel)
			}
			code, _, body := e.send(ctx, id, objective, `{"prompt":"`+id+`"}`)
			replies <- got{id, code, body, cancelled}
		})
	}
	wg.Wait()
	close(replies)
	waitWithin(t, 5*time.Second, "every request finished", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) == len(arrived)
	})
	requeued := 0
	mu.Lock()
	for id := range arrived {
		rs := results[id]
		require.Len(t, rs, 1, "outcomes of %s", id)
		require.LessOrEqual(t, rs[0].Evictions, flowcontrol.DefaultMaxEvictions, id)
		requeued += rs[0].Evictions
	}
	for g := range replies {
		if !arrived[g.id] {
			require.True(t, g.cancelled && g.code == 0, "%s never reached the gateway", g.id)
			continue
		}
		res := results[g.id][0]
		switch {
		case g.code == 200:
			require.Equal(t, "answer "+g.id, g.body, "the client of %s", g.id)
			require.Equal(t, flowhttp.ReasonForwarded, res.Reason, g.id)
		case g.cancelled && g.code == 0:
			require.Contains(t, []string{flowhttp.ReasonCancelled, flowhttp.ReasonForwarded}, res.Reason, g.id)
		default:
			t.Errorf("%s: status %d body %q result %+v", g.id, g.code, g.body, res)
		}
	}
	mu.Unlock()

	ev, _ := gw.Evictions()
	require.Positive(t, ev.Requeued[1], "no eviction happened: the test proved nothing")
	require.Equal(t, uint64(requeued), ev.Requeued[1]+ev.Requeued[0])
	require.Zero(t, ev.Evicted[0], "band 0 is never a victim")
	waitFor(t, "every eviction's act accounted", func() bool {
		ev, _ = gw.Evictions()
		return ev.Requeued[1]+ev.Ended[1]+ev.Declined[1] == ev.Evicted[1]
	})
	t.Logf("%d requests arrived; evictions: %d requeued, %d declined, %d immune", len(arrived), ev.Requeued[1], ev.Declined[1], ev.Immune[1])
	require.Zero(t, ev.Ended[1], "no response had started when taken")
	require.Equal(t, 0, ev.Tracked)
	require.Equal(t, 0, ev.Evicting)
	require.Equal(t, int64(0), gw.Controller().InFlight())
	for _, p := range pods {
		require.Equal(t, int64(0), gw.Poller().InFlight(p.srv.URL+"/metrics"))
	}
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(gw.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	seen := 0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "flowgate_body_memory_bytes":
			require.Zero(t, mf.GetMetric()[0].GetGauge().GetValue(), "body memory held")
			seen++
		case "flowgate_evictions_total":
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "sheddable" && m.GetLabel()[1].GetValue() == "requeued" {
					require.Equal(t, float64(ev.Requeued[1]), m.GetCounter().GetValue())
					seen++
				}
			}
		}
	}
	require.Equal(t, 2, seen)
}

// Trailers the handler sets after the body (announced in the Trailer
// header, as httputil.ReverseProxy copies a backend's) reach the client
// through the held headers.
func TestEvictionKeepsTrailers(t *testing.T) {
	e := newEvictEnv(t, flowhttp.GatewayConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Checksum", "abc")
	})
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader(`{}`))
	req.Header.Set(flowhttp.ObjectiveHeader, "critical")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "body", string(b))
	require.Equal(t, "abc", resp.Trailer.Get("X-Checksum"))
}

// Eviction frees memory: while the pod's KV cache has room, a critical
// request stalled there on a saturated pool (it waits for compute) takes
// nothing; once the pod's cache reads full, the sheddable request released
// before it is taken. The endpoint the host forwards to is the backend's
// URL, the poller's name for it its metrics URL: the gateway maps one to
// the other (the test fails if it does not: nothing is ever taken).
func TestEvictionWaitsForAFullCache(t *testing.T) {
	s := newScripted()
	e := newEvictEnv(t, flowhttp.GatewayConfig{}, s.serve)
	t.Cleanup(s.release)
	shed := e.goSend(context.Background(), "shed", "sheddable", `{"prompt":"p"}`)
	waitFor(t, "the sheddable request at the pod", func() bool { return s.shedAttempts.Load() == 1 })
	e.saturate(t)
	e.pod.kv.Store(500)
	waitFor(t, "the cache read half full", func() bool { return e.gw.Poller().KVUsage(e.metrics) == 0.5 })
	crit := e.goSend(context.Background(), "crit", "critical", `{"prompt":"urgent"}`)
	ev := e.gw.Controller().Evictor()
	waitFor(t, "the critical request stalled", func() bool {
		st := e.gw.Controller().Stats()
		return st.Eviction.Tracked == 2 && e.gw.Controller().InFlight() == 2
	})
	// Past the stall (on the real clock the evictor reads), checking
	// all along, as its own Run does too: nothing is taken.
	deadline := time.Now().Add(2 * evictStall)
	for time.Now().Before(deadline) {
		require.Zero(t, ev.Check(), "a pod with room in its cache gives nothing way")
		runtime.Gosched()
	}
	require.Zero(t, ev.Stats().Evicted[1], "nor did the evictor's Run")
	require.Equal(t, int64(1), s.shedAttempts.Load())
	e.pod.kv.Store(1000)
	select {
	case <-s.aborted:
	case <-time.After(time.Minute):
		t.Fatal("the sheddable request was never evicted once the cache read full")
	}
	s.release()
	require.Equal(t, 200, recv(t, crit).code)
	e.idle()
	r := recv(t, shed)
	require.Equal(t, 200, r.code, r.body)
	require.Equal(t, int64(2), s.shedAttempts.Load())
}
