package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/saturation"
)

// backendHeader names the backend that answered, so the chaos test can tell
// which backend a client's response came from.
const backendHeader = "x-test-backend"

// chaosBackend is one misbehaving model server. received counts the
// completions requests it got.
type chaosBackend struct {
	name     string
	received atomic.Int64
	h        http.Handler
}

func (b *chaosBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(backendHeader, b.name)
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		b.received.Add(1)
	}
	b.h.ServeHTTP(w, r)
}

// hangHandler never answers: the request (completion or metrics scrape)
// waits until its client gives up.
func hangHandler(quit <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-quit:
		}
	})
}

// err500Handler answers every completion 500 and its /metrics 404.
func err500Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			return
		}
		http.Error(w, `{"error":"engine dead"}`, http.StatusInternalServerError)
	})
}

// resetHandler starts a streamed completion (200, one event, flushed) and
// then resets the TCP connection; its /metrics serves garbage.
func resetHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting{{{ garbage \x00\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\" half\"}]}\n\n")
		http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with RST, not FIN
		}
		conn.Close()
	})
}

// vanishing serves h on a fixed loopback address and can go away (listener
// closed, graceful shutdown of its connections) and come back on the same
// address.
type vanishing struct {
	addr string
	h    http.Handler
	mu   sync.Mutex
	srv  *http.Server
	done chan struct{}
}

func (v *vanishing) up() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", v.addr)
	if err != nil {
		return err
	}
	v.addr = ln.Addr().String()
	v.srv = &http.Server{Handler: v.h}
	v.done = make(chan struct{})
	go func(srv *http.Server, done chan struct{}) { defer close(done); _ = srv.Serve(ln) }(v.srv, v.done)
	return nil
}

func (v *vanishing) down() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := v.srv.Shutdown(ctx)
	<-v.done
	v.srv = nil
	return err
}

// clientOutcome classifies what one client saw.
type clientOutcome int

const (
	outOK         clientOutcome = iota // 200, complete body, from a healthy backend
	outBackend500                      // the 500 backend's own answer, forwarded
	outProxyError                      // the proxy's own answer: 429/502/503 with a reason header
	outCut                             // 200 then the stream broke (the reset backend)
	outTimeout                         // no answer before the client's deadline (the hang backend)
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"ok", "backend-500", "proxy-error", "cut-mid-stream", "client-timeout"}

// TestChaosBackends: the proxy in front of five backends over real loopback
// HTTP — a healthy fake vLLM, one that hangs (completions and /metrics),
// one that answers 500 (and 404 on /metrics), one that resets the
// connection mid-stream (and serves garbage metrics), and a healthy one
// that vanishes and comes back several times during the run. Clients from
// 16 goroutines send a mix of critical and sheddable, streamed and plain
// requests, each with a deadline. Checks:
//
//   - every client gets a response or a clear error, and exactly the one
//     its backend explains: healthy → 200 with a complete body; 500 backend
//     → its 500; reset → 200 then a broken stream (a read error, never a
//     clean end); hang → the client's own deadline, exactly as many as the
//     hang backend received; proxy refusals carry x-flowgate-reason;
//   - the proxy finishes every request exactly once (OnFinish);
//   - saturation follows the fail-safe: each bad pod is scored 1, not
//     usable, with the scrape error its fault explains (timeout, HTTP
//     status, parse error, connection refused while vanished), and the
//     vanished pod becomes usable again when it comes back;
//   - in-flight counts (controller and per backend) return to 0, nothing
//     stays queued;
//   - the routing passes over failed backends: no request is sent to a
//     backend that failed within gateway.EjectFor or whose metrics the
//     poller cannot use while another backend is neither. Checked on every
//     choice the proxy made (Options.OnPick), against the state it chose
//     from; the choices made while every backend was passed over (the
//     documented fallback: fewest in flight among all; on a starved machine
//     the healthy pods' metrics go stale too) are counted and logged, not
//     bounded, as how many there are depends on scheduling.
//
// It sends 100 requests by default, 200 with FLOWGATE_FULL=1 (.ci/run) and
// 5,000 with FLOWGATE_SOAK=long.
//
// In parallel with the package's other slow tests: it mostly waits (its
// clients' 5 s deadline on the hanging backend), and nothing it asserts
// depends on how fast the machine is.
func TestChaosBackends(t *testing.T) {
	t.Parallel()
	total := 100
	switch {
	case os.Getenv("FLOWGATE_SOAK") == "long":
		total = 5000
		t.Logf("size: long (FLOWGATE_SOAK=long): %d requests", total)
	case fullSize():
		total = 200
		t.Logf("size: full (FLOWGATE_FULL=1): %d requests", total)
	default:
		t.Logf("size: default: %d requests (FLOWGATE_FULL=1 sends 200)", total)
	}
	const clients = 16
	// Long enough that only the hanging backend's requests reach it, even
	// on a loaded CI machine under -race; they pin a client each for this long.
	const clientTimeout = 5 * time.Second
	quit := make(chan struct{})

	fake, err := fakevllm.New(fakevllm.Config{SpeedUp: 50})
	require.NoError(t, err)
	defer fake.Close()
	fake2, err := fakevllm.New(fakevllm.Config{SpeedUp: 50})
	require.NoError(t, err)
	defer fake2.Close()

	healthy := &chaosBackend{name: "healthy", h: fake}
	hang := &chaosBackend{name: "hang", h: hangHandler(quit)}
	e500 := &chaosBackend{name: "500", h: err500Handler()}
	reset := &chaosBackend{name: "reset", h: resetHandler()}
	vanish := &chaosBackend{name: "vanish", h: fake2}
	var servers []*httptest.Server
	for _, b := range []*chaosBackend{healthy, hang, e500, reset} {
		servers = append(servers, httptest.NewServer(b))
	}
	van := &vanishing{addr: "127.0.0.1:0", h: vanish}
	require.NoError(t, van.up())
	defer func() {
		close(quit)
		require.NoError(t, van.down())
		for _, s := range servers {
			s.Close()
		}
	}()
	urls := []string{servers[0].URL, servers[1].URL, servers[2].URL, servers[3].URL, "http://" + van.addr}
	metricsURL := func(base string) string { return base + "/metrics" }

	cfg := testConfig()
	cfg.Saturation.MetricsStalenessThreshold = 100 * time.Millisecond
	cfg.Bands[0].MaxWait = 500 * time.Millisecond
	cfg.Bands[1].MaxWait = 200 * time.Millisecond
	var finished atomic.Int64
	var reasonsMu sync.Mutex
	reasons := map[string]int{}
	var picks pickLog
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: urls, Logf: func(string, ...any) {}, TrustObjectiveHeader: true,
		OnFinish: func(_, _ int, reason string) {
			finished.Add(1)
			reasonsMu.Lock()
			reasons[reason]++
			reasonsMu.Unlock()
		},
		OnPick: picks.add})
	require.NoError(t, err)
	p.Start()
	front := httptest.NewServer(p)
	defer func() {
		p.Close()
		front.Close()
	}()

	reading := func(base string) saturation.PodReading {
		for _, r := range p.Poller().Readings() {
			if r.Endpoint == metricsURL(base) {
				return r
			}
		}
		t.Errorf("no reading for %s", base)
		return saturation.PodReading{}
	}
	failSafe := func(base string, cause error) bool {
		r := reading(base)
		return !r.Usable && r.Score == 1 && r.Err != nil && (cause == nil || errors.Is(r.Err, cause))
	}

	// The vanishing backend goes down and comes back five times, driven
	// by the number of requests finished, not by the clock. While it is
	// down its pod must fall to the fail-safe score.
	toggles := make(chan struct{}, 16)
	var downSeen atomic.Int64
	togglerDone := make(chan struct{})
	go func() {
		defer close(togglerDone)
		isDown := false
		for range toggles {
			if isDown {
				if err := van.up(); err != nil {
					t.Errorf("vanishing backend back up: %v", err)
				}
			} else {
				if err := van.down(); err != nil {
					t.Errorf("vanishing backend down: %v", err)
				}
				// Spin (yielding) until the poller scores it 1;
				// bounded like eventually.
				deadline := time.Now().Add(20 * time.Second)
				for !failSafe("http://"+van.addr, nil) {
					if time.Now().After(deadline) {
						t.Errorf("vanished pod not scored 1: %+v", reading("http://"+van.addr))
						break
					}
					runtime.Gosched()
				}
				downSeen.Add(1)
			}
			isDown = !isDown
		}
		if err := van.up(); err != nil {
			t.Errorf("vanishing backend back up: %v", err)
		}
	}()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	var counts [nOutcomes]atomic.Int64
	var badGateway atomic.Int64
	var next, completed atomic.Int64
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				objective := []string{"critical", "sheddable"}[i%2]
				streamed := i%3 != 0
				body := fmt.Sprintf(`{"prompt":"chaos %d","max_tokens":%d,"stream":%v}`, i, 4+i%8, streamed)
				o, code, detail := chaosRequest(client, front.URL, objective, body, clientTimeout)
				if code == http.StatusBadGateway {
					badGateway.Add(1)
				}
				if o < 0 {
					t.Errorf("request %d (%s, stream %v): %s", i, objective, streamed, detail)
				} else {
					counts[o].Add(1)
				}
				if n := completed.Add(1); n%int64(total/9) == 0 && n < int64(total) {
					select {
					case toggles <- struct{}{}:
					default:
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(toggles)
	<-togglerDone

	// The fail-safe for each bad pod, with the error its fault explains.
	eventually(t, "hang pod scored 1 (timeout)", func() bool { return failSafe(servers[1].URL, context.DeadlineExceeded) })
	eventually(t, "500 pod scored 1 (404 metrics)", func() bool { return failSafe(servers[2].URL, saturation.ErrHTTPStatus) })
	eventually(t, "reset pod scored 1 (garbage metrics)", func() bool { return failSafe(servers[3].URL, saturation.ErrParse) })
	eventually(t, "healthy pod usable", func() bool { return reading(servers[0].URL).Usable })
	eventually(t, "vanished pod usable again", func() bool { return reading("http://" + van.addr).Usable })
	// Three pods of five are failed: the pool mean is at least 3/5.
	require.GreaterOrEqual(t, p.Poller().Saturation(), 0.6)

	// Every request finished exactly once at the proxy; in-flight counts
	// return to 0 once the handlers of timed-out clients have returned.
	eventually(t, "every request finished at the proxy", func() bool { return finished.Load() >= int64(total) })
	eventually(t, "in flight back to 0", func() bool {
		for _, n := range p.InFlight() {
			if n != 0 {
				return false
			}
		}
		return p.Controller().InFlight() == 0
	})
	require.Equal(t, int64(total), finished.Load())
	for b, bs := range p.Controller().Stats().Bands {
		require.Zero(t, bs.Queued, "band %d", b)
	}

	var sum int64
	for o := range counts {
		sum += counts[o].Load()
	}
	require.Equal(t, int64(total), sum, "every client got exactly one classified outcome")
	require.Equal(t, hang.received.Load(), counts[outTimeout].Load(), "client timeouts are the hang backend's requests")
	// A reset backend's request ends as a cut stream, or — when the RST
	// overtakes the response headers in the proxy's socket — as a 502.
	require.LessOrEqual(t, counts[outCut].Load(), reset.received.Load(), "cut streams come from the reset backend")
	require.LessOrEqual(t, reset.received.Load()-counts[outCut].Load(), badGateway.Load(), "the reset backend's other requests are 502s")
	require.Equal(t, e500.received.Load(), counts[outBackend500].Load(), "500s are the 500 backend's requests")
	require.Positive(t, counts[outOK].Load(), "the healthy backends kept serving")
	// A backend that failed (5xx, transport error, cut stream) is passed
	// over for EjectFor, and one whose metrics fail (all three failing
	// backends here, and the vanishing one while it is down) for as long
	// as they fail; otherwise the fast-failing backends, having the fewest
	// requests in flight, would draw the most traffic. Judged on every
	// choice, against the state the proxy chose from (see pickLog.judge),
	// not as a share of the traffic, which a starved run changes: while
	// the healthy pods' metrics are stale too, every backend is passed
	// over and the fallback may pick a failing one.
	backendName := map[string]string{urls[0]: healthy.name, urls[1]: hang.name, urls[2]: e500.name, urls[3]: reset.name, urls[4]: vanish.name}
	verdict := picks.judge(backendName)
	for i, v := range verdict.violations {
		if i == 10 {
			t.Errorf("routing: and %d more choices against the rule", len(verdict.violations)-i)
			break
		}
		t.Errorf("routing: %s", v)
	}
	// Every request a backend received was one of the choices judged.
	for _, b := range []*chaosBackend{healthy, hang, e500, reset, vanish} {
		require.GreaterOrEqual(t, verdict.picked[b.name], int(b.received.Load()), "%s: received more requests than the proxy chose it for", b.name)
	}
	require.Positive(t, downSeen.Load(), "the vanishing backend went down at least once")
	var summary []string
	for o := range counts {
		summary = append(summary, fmt.Sprintf("%s %d", outcomeNames[o], counts[o].Load()))
	}
	t.Logf("%d requests: %s; backends received healthy %d, hang %d, 500 %d, reset %d, vanish %d (down %d times); proxy reasons %v; pool saturation %.2f",
		total, strings.Join(summary, ", "), healthy.received.Load(), hang.received.Load(), e500.received.Load(),
		reset.received.Load(), vanish.received.Load(), downSeen.Load(), reasons, p.Poller().Saturation())
	t.Logf("routing: %s", verdict)
}

// pickLog records every choice of a backend the proxy made (as
// gateway.Options.OnPick).
type pickLog struct {
	mu    sync.Mutex
	picks []pickRecord
}

type pickRecord struct {
	now      time.Time
	backends []gateway.BackendState
	picked   int
}

func (l *pickLog) add(now time.Time, backends []gateway.BackendState, picked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.picks = append(l.picks, pickRecord{now, backends, picked})
}

// passedOver is the proxy's documented rule: a backend is passed over while
// it failed within gateway.EjectFor (its ejection window) or its metrics are
// unusable.
func passedOver(b gateway.BackendState, now time.Time) (ejected, unusable bool) {
	return !b.FailedAt.IsZero() && now.Sub(b.FailedAt) < gateway.EjectFor, b.Unusable
}

// pickVerdict is what the choices show, per backend name.
type pickVerdict struct {
	picks      int
	picked     map[string]int // choices of each backend
	ejected    map[string]int // of which inside its ejection window
	unusable   map[string]int // of which while its metrics were unusable
	fallback   int            // choices made while every backend was passed over
	violations []string
}

// judge checks every choice against the rule: the backend chosen is passed
// over only if every backend is.
func (l *pickLog) judge(name map[string]string) pickVerdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := pickVerdict{picks: len(l.picks), picked: map[string]int{}, ejected: map[string]int{}, unusable: map[string]int{}}
	for _, p := range l.picks {
		if p.picked < 0 || p.picked >= len(p.backends) {
			v.violations = append(v.violations, fmt.Sprintf("choice at %v: index %d of %d backends", p.now.Format(time.StampMicro), p.picked, len(p.backends)))
			continue
		}
		all, eligible := true, ""
		for _, b := range p.backends {
			if e, u := passedOver(b, p.now); !e && !u {
				all, eligible = false, name[b.URL]
			}
		}
		chosen := p.backends[p.picked]
		who := name[chosen.URL]
		v.picked[who]++
		e, u := passedOver(chosen, p.now)
		if e {
			v.ejected[who]++
		}
		if u {
			v.unusable[who]++
		}
		switch {
		case all:
			v.fallback++
		case e || u:
			var why []string
			if e {
				why = append(why, fmt.Sprintf("failed %v before", p.now.Sub(chosen.FailedAt)))
			}
			if u {
				why = append(why, "metrics unusable")
			}
			v.violations = append(v.violations, fmt.Sprintf("choice at %v: %s (%s) while %s was eligible",
				p.now.Format(time.StampMicro), who, strings.Join(why, ", "), eligible))
		}
	}
	return v
}

func (v pickVerdict) String() string {
	var per []string
	for _, n := range []string{"healthy", "vanish", "hang", "500", "reset"} {
		per = append(per, fmt.Sprintf("%s %d (ejected %d, metrics unusable %d)", n, v.picked[n], v.ejected[n], v.unusable[n]))
	}
	return fmt.Sprintf("%d choices: %s; %d while every backend was passed over (the fallback); %d against the rule",
		v.picks, strings.Join(per, ", "), v.fallback, len(v.violations))
}

// chaosRequest sends one completion through the proxy and classifies the
// outcome (with the status code, 0 if none), or returns -1 and a description if the outcome is not one the
// proxy documents.
func chaosRequest(client *http.Client, front, objective, body string, timeout time.Duration) (_ clientOutcome, code int, _ string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, front+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return -1, code, err.Error()
	}
	req.Header.Set(gateway.ObjectiveHeader, objective)
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return outTimeout, code, ""
		}
		return -1, code, "no response: " + err.Error()
	}
	defer resp.Body.Close()
	code = resp.StatusCode
	from := resp.Header.Get(backendHeader)
	reason := resp.Header.Get(gateway.ReasonHeader)
	data, readErr := io.ReadAll(bufio.NewReader(resp.Body))
	switch {
	case reason != "":
		if from != "" || readErr != nil || !strings.Contains(string(data), "flowgate: "+reason) {
			return -1, code, fmt.Sprintf("proxy refusal %d %s from %q: %q %v", resp.StatusCode, reason, from, data, readErr)
		}
		switch {
		case resp.StatusCode == http.StatusTooManyRequests && reason == gateway.ReasonQueueFull,
			resp.StatusCode == http.StatusServiceUnavailable && reason == gateway.ReasonExpired,
			resp.StatusCode == http.StatusBadGateway && reason == gateway.ReasonBackendError:
			return outProxyError, code, ""
		}
		return -1, code, fmt.Sprintf("undocumented refusal %d %s", resp.StatusCode, reason)
	case from == "500":
		if resp.StatusCode != http.StatusInternalServerError || readErr != nil {
			return -1, code, fmt.Sprintf("500 backend: %d %v", resp.StatusCode, readErr)
		}
		return outBackend500, code, ""
	case from == "reset":
		if resp.StatusCode != http.StatusOK || readErr == nil {
			return -1, code, fmt.Sprintf("reset backend: %d, read error %v (a cut stream must end in an error)", resp.StatusCode, readErr)
		}
		return outCut, code, ""
	case from == "healthy" || from == "vanish":
		if resp.StatusCode != http.StatusOK || readErr != nil {
			return -1, code, fmt.Sprintf("%s backend: %d %v %q", from, resp.StatusCode, readErr, data)
		}
		if strings.Contains(body, `"stream":true`) && !strings.Contains(string(data), "data: [DONE]") {
			return -1, code, fmt.Sprintf("%s backend: stream without [DONE]: %q", from, data)
		}
		if !strings.Contains(body, `"stream":true`) && !strings.Contains(string(data), `"choices"`) {
			return -1, code, fmt.Sprintf("%s backend: body %q", from, data)
		}
		return outOK, code, ""
	}
	if errors.Is(readErr, context.DeadlineExceeded) {
		return outTimeout, code, ""
	}
	return -1, code, fmt.Sprintf("unexplained answer %d from %q: %q %v", resp.StatusCode, from, data, readErr)
}
