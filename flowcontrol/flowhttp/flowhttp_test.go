package flowhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

func TestObjectiveHeaderSelectsBand(t *testing.T) {
	bands := []flowcontrol.BandConfig{band("critical", 0, 0, 0), band("Standard", 0, 0, 0), band("sheddable", 0, 0, 0)}
	e := start(t, bands, ok, flowhttp.Options{TrustObjectiveHeader: true,
		DefaultObjective: "standard",
		Classify: func(r *http.Request, body []byte) (int, bool) {
			if strings.Contains(string(body), "batch") {
				return 2, true
			}
			return 0, false
		},
	})
	for _, c := range []struct {
		header, value, body, want string
	}{
		{flowhttp.ObjectiveHeader, "critical", "", "critical"},
		{flowhttp.ObjectiveHeader, "CRITICAL", "", "critical"},
		{flowhttp.ObjectiveHeader, "standard", "", "Standard"},
		{flowhttp.ObjectiveHeader, "Sheddable", "", "sheddable"},
		{flowhttp.LegacyObjectiveHeader, "critical", "", "critical"},
		{flowhttp.ObjectiveHeader, "unknown", "batch", "sheddable"}, // classifier
		{flowhttp.ObjectiveHeader, "unknown", "", "Standard"},       // default
		{"", "", "", "Standard"},
	} {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader(c.body))
		if c.header != "" {
			req.Header.Set(c.header, c.value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get(flowhttp.BandHeader); got != c.want || resp.StatusCode != 200 {
			t.Errorf("%s: %q body %q: band %q status %d, want %q 200", c.header, c.value, c.body, got, resp.StatusCode, c.want)
		}
		e.result(t)
	}
	// The llm-d header wins over the legacy one.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/x", nil)
	req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
	req.Header.Set(flowhttp.LegacyObjectiveHeader, "critical")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get(flowhttp.BandHeader); got != "sheddable" {
		t.Errorf("both headers: band %q, want sheddable", got)
	}
}

func TestRefusalsAreOpenAIErrors(t *testing.T) {
	e := start(t, critShed(1, 50*time.Millisecond, 0), ok, flowhttp.Options{})
	e.saturate(t, 1) // sheddable blocked

	// expired: 503, not to be retried.
	resp, body, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "sheddable", "{}")
	if err != nil {
		t.Fatal(err)
	}
	ae := decodeError(t, body)
	if resp.StatusCode != 503 || ae.Error.Code != "expired" || ae.Error.Type != "service_unavailable_error" ||
		resp.Header.Get("x-should-retry") != "false" || resp.Header.Get("Retry-After") != "" ||
		resp.Header.Get(flowhttp.DroppedReasonHeader) != "expired" || resp.Header.Get(flowhttp.BandHeader) != "sheddable" {
		t.Errorf("expired: %d %+v headers %v", resp.StatusCode, ae, resp.Header)
	}
	if !strings.Contains(ae.Error.Message, `band "sheddable"`) || !strings.Contains(ae.Error.Message, "waited ") {
		t.Errorf("expired message %q lacks band or wait", ae.Error.Message)
	}
	if r := e.result(t); r.Status != 503 || r.Reason != flowhttp.ReasonExpired || !errors.Is(r.Err, flowcontrol.ErrExpired) || r.Waited < 50*time.Millisecond {
		t.Errorf("expired result %+v", r)
	}

	// queue full: 429 with Retry-After. Fill the one place with a
	// request that waits until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e2 := start(t, critShed(1, 0, 0), ok, flowhttp.Options{})
	e2.saturate(t, 1)
	errc := make(chan error, 1)
	go func() { _, _, err := post(t, ctx, e2.srv.URL+"/v1/completions", "sheddable", "{}"); errc <- err }()
	waitFor(t, "one queued", func() bool { return e2.queued(1) == 1 })
	resp, body, err = post(t, context.Background(), e2.srv.URL+"/v1/completions", "sheddable", "{}")
	if err != nil {
		t.Fatal(err)
	}
	ae = decodeError(t, body)
	if resp.StatusCode != 429 || ae.Error.Code != "queue-full" || ae.Error.Type != "rate_limit_error" ||
		resp.Header.Get("Retry-After") != "1" || resp.Header.Get("x-should-retry") != "" ||
		resp.Header.Get(flowhttp.DroppedReasonHeader) != "queue-full" {
		t.Errorf("queue full: %d %+v headers %v", resp.StatusCode, ae, resp.Header)
	}
	if r := e2.result(t); r.Status != 429 || r.Reason != flowhttp.ReasonQueueFull {
		t.Errorf("queue-full result %+v", r)
	}
	// The client that leaves while queued: no answer, reported 499.
	cancel()
	if err := <-errc; err == nil {
		t.Error("cancelled client got an answer")
	}
	if r := e2.result(t); r.Status != flowhttp.StatusClientClosed || r.Reason != flowhttp.ReasonCancelled || !errors.Is(r.Err, flowcontrol.ErrCancelled) {
		t.Errorf("cancelled result %+v", r)
	}

	// closed: 503 with Retry-After (another replica may serve it).
	e2.ctrl.Close()
	resp, body, err = post(t, context.Background(), e2.srv.URL+"/v1/completions", "critical", "{}")
	if err != nil {
		t.Fatal(err)
	}
	ae = decodeError(t, body)
	if resp.StatusCode != 503 || ae.Error.Code != "shutting-down" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("closed: %d %+v headers %v", resp.StatusCode, ae, resp.Header)
	}
}

func TestGatedMethodsAndPaths(t *testing.T) {
	e := start(t, []flowcontrol.BandConfig{band("", 0, 0, 0), band("", 0, time.Millisecond, 0)}, ok, flowhttp.Options{})
	e.saturate(t, 1) // the last band is blocked: a gated request expires
	for _, c := range []struct {
		method, path string
		gated        bool
	}{
		{"POST", "/v1/completions", true},
		{"POST", "/invocations", true},
		{"POST", "/v2/rerank", true},
		{"POST", "/pooling", true},
		{"PUT", "/v1/completions", true},
		{"PATCH", "/anything", true},
		{"DELETE", "/v1/x", true},
		{"GET", "/v1/models", false},
		{"HEAD", "/health", false},
		{"OPTIONS", "/v1/completions", false},
	} {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := 200
		if c.gated {
			want = 503
		}
		if resp.StatusCode != want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, want)
		}
	}
	// A custom predicate.
	e2 := start(t, []flowcontrol.BandConfig{band("", 0, 0, 0), band("", 0, time.Millisecond, 0)}, ok, flowhttp.Options{
		Gated: func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/v1/") },
	})
	e2.saturate(t, 1)
	for path, want := range map[string]int{"/v1/completions": 503, "/admin": 200} {
		resp, _, err := post(t, context.Background(), e2.srv.URL+path, "", "{}")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			t.Errorf("Gated predicate, POST %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// The slot is held until a streamed response has been written in full.
func TestDoneAfterStreamedResponse(t *testing.T) {
	release := make(chan struct{})
	firstSent := make(chan struct{})
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		close(firstSent)
		<-release
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	e := start(t, nil, stream, flowhttp.Options{})
	resp, err := http.Post(e.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: 1\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	<-firstSent
	if n := e.ctrl.InFlight(); n != 1 {
		t.Errorf("in flight mid-stream %d, want 1", n)
	}
	close(release)
	if r := e.result(t); r.Reason != flowhttp.ReasonForwarded || r.Status != 200 {
		t.Errorf("result %+v", r)
	}
	if n := e.ctrl.InFlight(); n != 0 {
		t.Errorf("in flight after the stream %d, want 0", n)
	}
}

// A panicking handler releases its slot, and the panic goes on.
func TestPanicReleasesSlotAndRepanics(t *testing.T) {
	for _, v := range []any{http.ErrAbortHandler, "boom"} {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "partial")
			w.(http.Flusher).Flush()
			panic(v)
		})
		var seen any
		var mu sync.Mutex
		// Catch the re-panic in front of flowhttp, as net/http would.
		catch := func(front http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() {
					mu.Lock()
					seen = recover()
					mu.Unlock()
					panic(http.ErrAbortHandler)
				}()
				front.ServeHTTP(w, r)
			})
		}
		e := start(t, nil, h, flowhttp.Options{}, catch)
		resp, err := http.Post(e.srv.URL+"/v1/completions", "application/json", strings.NewReader("{}"))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Errorf("%v: the client saw a complete response", v)
		}
		if r := e.result(t); r.Reason != flowhttp.ReasonAborted || r.Status != 200 {
			t.Errorf("%v: result %+v", v, r)
		}
		if n := e.ctrl.InFlight(); n != 0 {
			t.Errorf("%v: in flight %d after a panic", v, n)
		}
		waitFor(t, "the re-panic", func() bool { mu.Lock(); defer mu.Unlock(); return seen != nil })
		mu.Lock()
		if seen != v {
			t.Errorf("re-panicked with %v, want %v", seen, v)
		}
		mu.Unlock()
	}
}

func TestByteBudget(t *testing.T) {
	e := start(t, []flowcontrol.BandConfig{band("", 0, 0, 0), band("", 0, 0, 100)}, ok, flowhttp.Options{TrustObjectiveHeader: true})
	e.saturate(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t, ctx, e.srv.URL+"/v1/completions", "", strings.Repeat("a", 60))
		errc <- err
	}()
	waitFor(t, "one queued", func() bool { return e.queued(1) == 1 })
	resp, body, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("b", 60))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || decodeError(t, body).Error.Code != flowhttp.ReasonBytesFull || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("over the byte budget: %d %s", resp.StatusCode, body)
	}
	e.result(t)
	// A body larger than the band's whole budget can never fit: 413, not retried.
	resp, body, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("c", 101))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 413 || resp.Header.Get("x-should-retry") != "false" {
		t.Errorf("over the whole budget: %d %s", resp.StatusCode, body)
	}
	e.result(t)
	// The queued request leaves: its bytes are given back.
	cancel()
	<-errc
	e.result(t)
	e.saturate(t, 0)
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("d", 100))
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("budget not given back: %v %v", resp, err)
	}
	// The critical band has no budget.
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "critical", strings.Repeat("e", 1000))
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("critical: %v %v", resp, err)
	}
}

func TestMaxBodyBytes(t *testing.T) {
	e := start(t, nil, ok, flowhttp.Options{MaxBodyBytes: 10})
	resp, body, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("x", 11))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 413 || decodeError(t, body).Error.Code != flowhttp.ReasonTooLarge {
		t.Errorf("11 bytes over a 10-byte cap: %d %s", resp.StatusCode, body)
	}
	if r := e.result(t); !errors.Is(r.Err, flowhttp.ErrBodyTooLarge) {
		t.Errorf("result %+v", r)
	}
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("x", 10))
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("10 bytes: %v %v", resp, err)
	}
}

// A body dribbled slower than MinBodyRate is cut with 408 once the grace
// has passed, and the slot was never taken.
func TestSlowBodyCut408(t *testing.T) {
	called := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called <- struct{}{} })
	e := start(t, nil, h, flowhttp.Options{BodyGrace: 100 * time.Millisecond, MinBodyRate: 100})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	began := time.Now()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
	// One byte every 20 ms: 50 B/s, half the minimum rate.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a dribbled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 408 || resp.Header.Get(flowhttp.DroppedReasonHeader) != flowhttp.ReasonBodyTimeout {
		t.Errorf("dribbled body: %d %v", resp.StatusCode, resp.Header)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("answered after %v", d)
	}
	select {
	case <-called:
		t.Error("the wrapped handler ran")
	default:
	}
	// A body at the minimum rate or above passes.
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "", strings.Repeat("y", 1000))
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("fast body: %v %v", resp, err)
	}
}

// Expect: 100-continue is answered here, not passed on; a 1xx from the
// wrapped handler is not the status; the handler's copies of our headers
// are replaced.
func TestExpectAnd1xxAndOwnHeaders(t *testing.T) {
	var expect string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		expect = r.Header.Get("Expect")
		w.Header().Set(flowhttp.BandHeader, "backend-band")
		w.Header().Set(flowhttp.DroppedReasonHeader, "queue-full")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set(flowhttp.BandHeader, "backend-band")
		w.Header().Set(flowhttp.DroppedReasonHeader, "queue-full")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	e := start(t, nil, h, flowhttp.Options{})
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader("{}"))
	req.Header.Set("Expect", "100-continue")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if expect != "" {
		t.Errorf("Expect forwarded: %q", expect)
	}
	if resp.StatusCode != 429 || resp.Header.Values(flowhttp.BandHeader)[0] != "band1" || len(resp.Header.Values(flowhttp.BandHeader)) != 1 ||
		resp.Header.Get(flowhttp.DroppedReasonHeader) != "" {
		t.Errorf("backend 429: %d %v", resp.StatusCode, resp.Header)
	}
	if r := e.result(t); r.Status != 429 || r.Reason != flowhttp.ReasonForwarded {
		t.Errorf("result %+v, want the backend's 429 forwarded", r)
	}
}

func TestInvalidOptionsPanic(t *testing.T) {
	e := start(t, nil, ok, flowhttp.Options{})
	for name, o := range map[string]flowhttp.Options{
		"objective": {Objectives: map[string]int{"x": 2}},
		"default":   {DefaultObjective: "nope"},
		"priority":  {ForwardPriority: 7},
		"reserve":   {MaxBodyMemory: 10, CriticalReserve: 10},
	} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.HasPrefix(fmt.Sprint(v), "flowhttp: ") {
					t.Errorf("%s: panic %v", name, v)
				}
			}()
			flowhttp.Handler(e.ctrl, ok, o)
		}()
	}
}

// A client that leaves while sending its body is not answered and not
// queued: the result is cancelled, with ErrClientGone.
func TestClientGoneMidBody(t *testing.T) {
	e := start(t, nil, ok, flowhttp.Options{})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\npartial")
	conn.Close() // net/http cancels the request's context on the read error
	r := e.result(t)
	if r.Status != flowhttp.StatusClientClosed || r.Reason != flowhttp.ReasonCancelled || !errors.Is(r.Err, flowhttp.ErrClientGone) {
		t.Errorf("result %+v", r)
	}
	for _, b := range e.ctrl.Stats().Bands {
		if b.Dispatched+b.Cancelled+b.Rejected != 0 {
			t.Errorf("a request that never sent its body reached the controller: %+v", b)
		}
	}
}

// shedAll sheds every band but 0.
type shedAll struct{}

func (shedAll) Admit(band, _ int) bool { return band == 0 }

// TestShedIs429NotRetried: a request the controller's admission stage sheds
// gets 429 "shed" with x-should-retry: false (an SDK retry would add load to
// the pool that shed it); band 0 passes.
func TestShedIs429NotRetried(t *testing.T) {
	ctrl, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
		Config:   flowcontrol.Config{Bands: []flowcontrol.BandConfig{{Name: "critical", Capacity: 4}, {Name: "sheddable", Capacity: 4}}, Source: new(saturation.Value)},
		Admitter: shedAll{},
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := ctrl.Start(context.Background())
	defer func() { ctrl.Close(); <-ran }()
	srv := httptest.NewServer(flowhttp.Handler(ctrl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), flowhttp.Options{TrustObjectiveHeader: true}))
	defer srv.Close()
	resp, body, err := post(t, context.Background(), srv.URL+"/v1/completions", "sheddable", "{}")
	if err != nil {
		t.Fatal(err)
	}
	ae := decodeError(t, body)
	if resp.StatusCode != 429 || ae.Error.Code != flowhttp.ReasonShed || resp.Header.Get("x-should-retry") != "false" ||
		resp.Header.Get("Retry-After") != "" || resp.Header.Get(flowhttp.DroppedReasonHeader) != flowhttp.ReasonShed {
		t.Errorf("shed: %d %+v headers %v", resp.StatusCode, ae, resp.Header)
	}
	resp, _, err = post(t, context.Background(), srv.URL+"/v1/completions", "critical", "{}")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("critical: %v %v", resp, err)
	}
	if st := ctrl.Stats(); st.Bands[1].Refused.Shed != 1 {
		t.Errorf("Stats shed %d, want 1", st.Bands[1].Refused.Shed)
	}
}

// TestFairnessIDHeader: on a round-robin band with FlowCapacity 1, the
// fairness id header is the request's flow: tenant A's second waiting
// request is refused 429 flow-full while tenant B's first still queues (on
// an fcfs band they would share one queue); the legacy header counts too,
// and an overlong id counts as none (the default flow).
func TestFairnessIDHeader(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	bands := []flowcontrol.BandConfig{{Name: "critical", Capacity: 8}, {Name: "sheddable", Capacity: 8, Fairness: flowcontrol.FairnessRoundRobin, FlowCapacity: 1}}
	e := start(t, bands, ok, flowhttp.Options{TrustObjectiveHeader: true})
	e.saturate(t, 1) // sheddable blocked
	send := func(ctx context.Context, header, tenant string) (*http.Response, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/completions", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
		req.Header.Set(header, tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 3) // the three requests left waiting
	go func() { _, _, err := send(ctx, flowhttp.FairnessIDHeader, "tenant-a"); errc <- err }()
	waitFor(t, "A queued", func() bool { return e.queued(1) == 1 })
	resp, body, err := send(context.Background(), flowhttp.LegacyFairnessIDHeader, "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || decodeError(t, string(body)).Error.Code != flowhttp.ReasonFlowFull || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("tenant A's second request: %d %s, want 429 flow-full (its FlowCapacity)", resp.StatusCode, body)
	}
	go func() { _, _, err := send(ctx, flowhttp.FairnessIDHeader, "tenant-b"); errc <- err }()
	waitFor(t, "B queued beside A", func() bool { return e.queued(1) == 2 })
	// An id over MaxFairnessIDLen is the default flow, which has room too;
	// a second one is refused like A's.
	long := strings.Repeat("x", flowhttp.MaxFairnessIDLen+1)
	go func() { _, _, err := send(ctx, flowhttp.FairnessIDHeader, long); errc <- err }()
	waitFor(t, "the overlong id queued in the default flow", func() bool { return e.queued(1) == 3 })
	resp, _, err = send(context.Background(), flowhttp.FairnessIDHeader, long+"y")
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("second default-flow request: %v %v, want 429", resp, err)
	}
	cancel()
	for range 3 {
		<-errc // each ends with the client's cancellation
	}
}
