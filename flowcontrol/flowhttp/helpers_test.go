package flowhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// env is a running controller behind a flowhttp handler on loopback.
type env struct {
	ctrl     *flowcontrol.Controller
	pool     *saturation.Value
	srv      *httptest.Server
	finished chan flowhttp.Result // every OnFinish, in order
}

// start runs a controller (2 bands unless cfg says otherwise) and serves
// next through Handler. Saturation 1 blocks the last band under the
// default soft-reflective policy; band 0 always passes.
// wrap, if given, wraps the Handler (to count or catch what reaches it).
func start(t testing.TB, bands []flowcontrol.BandConfig, next http.Handler, opts flowhttp.Options, wrap ...func(http.Handler) http.Handler) *env {
	t.Helper()
	e := &env{pool: new(saturation.Value), finished: make(chan flowhttp.Result, 1024)}
	if bands == nil {
		bands = []flowcontrol.BandConfig{{Capacity: 16}, {Capacity: 16}} // band0, band1
	}
	ctrl, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: e.pool}})
	if err != nil {
		t.Fatal(err)
	}
	e.ctrl = ctrl
	ran := ctrl.Start(context.Background())
	user := opts.OnFinish
	opts.OnFinish = func(r *http.Request, res flowhttp.Result) {
		if user != nil {
			user(r, res)
		}
		select {
		case e.finished <- res:
		default:
		}
	}
	h := flowhttp.Handler(ctrl, next, opts)
	for _, w := range wrap {
		h = w(h)
	}
	e.srv = httptest.NewUnstartedServer(h)
	e.srv.Config.ErrorLog = quietLog()
	e.srv.Start()
	t.Cleanup(func() {
		ctrl.Close()
		e.srv.Close()
		<-ran
	})
	return e
}

// waitFor polls cond every millisecond for at most a minute: a bound only
// a hang reaches (40 uploads of 8 MiB under -race beside a CPU hog took
// longer than the 5 s this was).
func waitFor(t interface {
	Helper()
	Fatalf(string, ...any)
}, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, time.Minute, what, cond)
}

// waitWithin polls cond every millisecond for at most d.
func waitWithin(t interface {
	Helper()
	Fatalf(string, ...any)
}, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// result waits for the next OnFinish.
func (e *env) result(t testing.TB) flowhttp.Result {
	t.Helper()
	select {
	case r := <-e.finished:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no OnFinish within 30s")
		return flowhttp.Result{}
	}
}

func (e *env) queued(band int) int { return e.ctrl.Stats().Bands[band].Queued }

// post sends a POST with an objective and returns status, headers and body.
func post(t testing.TB, ctx context.Context, url, objective, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if objective != "" {
		req.Header.Set(flowhttp.ObjectiveHeader, objective)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// apiError is the OpenAI error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeError(t testing.TB, body string) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, "ok")
})

func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// saturate sets the pool's saturation and waits for a tick to read it
// (bands are gated by the last tick's reading).
func (e *env) saturate(t testing.TB, v float64) {
	t.Helper()
	e.pool.Set(v)
	waitFor(t, "a tick to read the saturation", func() bool {
		// An idle dispatcher sleeps; a pass through band 0 (never
		// gated) wakes it, and its next tick reads the source.
		if p, err := e.ctrl.Wait(context.Background(), 0); err == nil {
			p.Done()
		}
		return e.ctrl.Stats().Saturation == v
	})
}

// band is a BandConfig of capacity 16 unless given otherwise.
func band(name string, capacity int, maxWait time.Duration, maxBytes int64) flowcontrol.BandConfig {
	if capacity == 0 {
		capacity = 16
	}
	return flowcontrol.BandConfig{Name: name, Capacity: capacity, MaxWait: maxWait, MaxBytes: maxBytes}
}

// critShed is the usual two bands: critical and sheddable.
func critShed(shedCap int, shedWait time.Duration, shedBytes int64) []flowcontrol.BandConfig {
	return []flowcontrol.BandConfig{band("critical", 4, 0, 0), band("sheddable", shedCap, shedWait, shedBytes)}
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

func newRec() *httptest.ResponseRecorder { return httptest.NewRecorder() }

// counting counts the requests that reach the server.
func counting(n *atomic.Int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1); h.ServeHTTP(w, r) })
}
