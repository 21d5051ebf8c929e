package flowhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// Headers flowhttp reads and writes.
const (
	// ObjectiveHeader names the request's objective (llm-d's
	// InferenceObjective); its value selects the band.
	ObjectiveHeader = "x-llm-d-inference-objective"
	// LegacyObjectiveHeader is the Gateway API Inference Extension's name
	// for ObjectiveHeader, still accepted when ObjectiveHeader is absent.
	LegacyObjectiveHeader = "x-gateway-inference-objective"
	// FairnessIDHeader names the request's flow (its tenant) within its
	// band, for bands with fairness (flowcontrol.BandConfig.Fairness).
	FairnessIDHeader = "x-llm-d-inference-fairness-id"
	// LegacyFairnessIDHeader is the Gateway API Inference Extension's name
	// for FairnessIDHeader, still accepted when FairnessIDHeader is absent.
	LegacyFairnessIDHeader = "x-gateway-inference-fairness-id"
	// SLOTTFTHeader gives the request's time-to-first-token objective in
	// milliseconds (llm-d's name); arrival + it is the request's deadline
	// in an edf band.
	SLOTTFTHeader = "x-llm-d-slo-ttft-ms"
	// BandHeader carries, on every gated response, the name of the band
	// the request was queued in.
	BandHeader = "x-flowgate-band"
	// DroppedReasonHeader carries the reason of a refusal (llm-d's name).
	DroppedReasonHeader = "x-llm-d-request-dropped-reason"
	// ShouldRetryHeader tells the OpenAI SDKs whether to retry ("false":
	// do not, whatever the status).
	ShouldRetryHeader = "x-should-retry"
)

// Reasons: the code of a refusal's JSON error and the value of
// DroppedReasonHeader, and Result.Reason.
const (
	ReasonQueueFull    = "queue-full"       // 429: the band holds its capacity of waiters
	ReasonShed         = "shed"             // 429: the admission stage shed it (ControllerConfig.Admitter); not retried
	ReasonFlowFull     = "flow-full"        // 429: the request's flow (fairness id) holds the band's FlowCapacity
	ReasonBytesFull    = "queue-bytes-full" // 429: the band's byte budget is spent
	ReasonExpired      = "expired"          // 503: waited the band's MaxWait
	ReasonShuttingDown = "shutting-down"    // 503: the controller is closed
	ReasonNotRunning   = "not-running"      // 503: the controller is not running (not started, or stopped)
	ReasonTooLarge     = "body-too-large"   // 413: body over MaxBodyBytes (or over the band's whole budget)
	ReasonBodyTimeout  = "body-timeout"     // 408: body slower than MinBodyRate
	ReasonBadBody      = "bad-body"         // 400: the body could not be read
	ReasonCancelled    = "cancelled"        // the client left before an answer (nothing sent)
	ReasonForwarded    = "forwarded"        // Result only: the wrapped handler answered
	ReasonAborted      = "aborted"          // Result only: the wrapped handler panicked
	ReasonInternal     = "internal"         // 500: the controller refused the band (a bug)
)

// StatusClientClosed is the status Result reports for a client that left
// before any answer (nothing is sent), as nginx logs it.
const StatusClientClosed = 499

// Errors in Result.Err beside flowcontrol's (ErrQueueFull, ErrShed,
// ErrExpired, ErrClosed, ErrCancelled, ErrNotRunning).
var (
	// ErrBytesFull: the band's byte budget cannot take the body.
	ErrBytesFull = errors.New("flowhttp: band byte budget full")
	// ErrBodyTooLarge: the body exceeds MaxBodyBytes or the band's budget.
	ErrBodyTooLarge = errors.New("flowhttp: request body too large")
	// ErrBodyTimeout: the body arrived slower than MinBodyRate.
	ErrBodyTimeout = errors.New("flowhttp: request body too slow")
	// ErrClientGone: the client left while sending the body (nothing is
	// answered; Result.Reason is ReasonCancelled).
	ErrClientGone = errors.New("flowhttp: client left while sending the body")
	// ErrBadBody: reading the body failed.
	ErrBadBody = errors.New("flowhttp: request body unreadable")
)

// Defaults of Options' zero fields.
const (
	DefaultMaxBodyBytes = 8 << 20         // 8 MiB
	DefaultBodyGrace    = 5 * time.Second // before MinBodyRate applies
	DefaultMinBodyRate  = 1 << 10         // 1 KiB/s
)

// Result is what Options.OnFinish learns about a gated request.
type Result struct {
	Band   int    // the band it was classified into
	Status int    // status sent; StatusClientClosed if none (client gone)
	Reason string // ReasonForwarded, ReasonAborted, ReasonCancelled or a refusal's reason
	// Waited is the time from arrival (before the body was read) to
	// release or refusal.
	Waited time.Duration
	// Err is the error behind a refusal or a cancellation before release
	// (flowcontrol's or flowhttp's sentinels; errors.Is-able); nil once
	// released, whatever happened next (Reason says).
	Err error
	// BodyBytes is the size of the buffered request body.
	BodyBytes int
	// Flow is the fairness id the request was queued under ("" =
	// flowcontrol.DefaultFlow).
	Flow string
}

// MaxFairnessIDLen bounds the fairness id taken from a header: a longer one
// (or one with control characters) counts as no id, so a client cannot make
// the controller remember arbitrary strings.
const MaxFairnessIDLen = 128

// flowOf returns the request's fairness id and deadline from its headers.
func flowOf(r *http.Request, start time.Time) (string, time.Time) {
	id := r.Header.Get(FairnessIDHeader)
	if id == "" {
		id = r.Header.Get(LegacyFairnessIDHeader)
	}
	if len(id) > MaxFairnessIDLen || strings.IndexFunc(id, func(c rune) bool { return c < 0x20 || c == 0x7f }) >= 0 {
		id = ""
	}
	var deadline time.Time
	if v := r.Header.Get(SLOTTFTHeader); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 && ms < int64(24*time.Hour/time.Millisecond) {
			deadline = start.Add(time.Duration(ms) * time.Millisecond)
		}
	}
	return id, deadline
}

// Options configures Handler. The zero value is usable. The bands' names
// and byte budgets come from the controller (flowcontrol.BandConfig's Name
// and MaxBytes): the bodies of a band's waiting requests together may not
// exceed its MaxBytes (over it: 429 queue-bytes-full).
type Options struct {
	// Objectives maps objective header values, case-insensitively, to
	// bands. Nil: "critical" → 0, "sheddable" → the last band, and every
	// band's name → itself. A map given replaces the default entirely.
	Objectives map[string]int
	// Classify, if set, places requests the objective header does not
	// (missing or unknown value); ok false or a band out of range falls
	// through to DefaultBand. body is the buffered request body; do not
	// keep it or change it.
	Classify func(r *http.Request, body []byte) (band int, ok bool)
	// DefaultBand is the band of everything else. Negative values count
	// from the end (-1 is the last, most sheddable band); the zero value
	// is band 0.
	DefaultBand int
	// Gated reports whether a request goes through flow control; the
	// others go straight to the wrapped handler. Nil: DefaultGated.
	Gated func(r *http.Request) bool
	// MaxBodyBytes caps a gated request's body (413 over it). 0:
	// DefaultMaxBodyBytes; negative: no cap.
	MaxBodyBytes int64
	// BodyGrace and MinBodyRate (bytes per second) cut a body that
	// arrives slower than MinBodyRate once BodyGrace has passed, with a
	// 408: reading byte n must finish by arrival + BodyGrace +
	// n/MinBodyRate. Zero: DefaultBodyGrace, DefaultMinBodyRate;
	// MinBodyRate negative: no limit. It needs a writer that supports
	// http.ResponseController.SetReadDeadline (net/http's does).
	BodyGrace   time.Duration
	MinBodyRate int64
	// OnFinish, if set, is called once per gated request when flowhttp is
	// done with it (after done, for a forwarded one), from the request's
	// goroutine.
	OnFinish func(r *http.Request, res Result)
}

var (
	objectiveKey       = http.CanonicalHeaderKey(ObjectiveHeader)
	legacyObjectiveKey = http.CanonicalHeaderKey(LegacyObjectiveHeader)
	bandKey            = http.CanonicalHeaderKey(BandHeader)
	droppedKey         = http.CanonicalHeaderKey(DroppedReasonHeader)
)

type handler struct {
	c          *flowcontrol.Controller
	next       http.Handler
	bands      []band
	used       []atomic.Int64 // bytes of waiting bodies per band
	objectives map[string]int // lower-case keys
	classify   func(*http.Request, []byte) (int, bool)
	defBand    int
	gated      func(*http.Request) bool
	maxBody    int64
	grace      time.Duration
	rate       int64
	onFinish   func(*http.Request, Result)
}

// Handler returns a handler that gates requests through c (see the package
// documentation) and serves them with next. It panics, naming the field, if
// opts maps an objective or DefaultBand outside the controller's bands.
func Handler(c *flowcontrol.Controller, next http.Handler, opts Options) http.Handler {
	h := &handler{
		c:        c,
		next:     next,
		classify: opts.Classify,
		gated:    opts.Gated,
		maxBody:  opts.MaxBodyBytes,
		grace:    opts.BodyGrace,
		rate:     opts.MinBodyRate,
		onFinish: opts.OnFinish,
	}
	h.bands = bandsOf(c)
	n := len(h.bands)
	h.used = make([]atomic.Int64, n)
	h.objectives = map[string]int{}
	if opts.Objectives == nil {
		h.objectives["critical"] = 0
		h.objectives["sheddable"] = n - 1
		for i, b := range h.bands {
			h.objectives[strings.ToLower(b.name)] = i
		}
	} else {
		for k, v := range opts.Objectives {
			if v < 0 || v >= n {
				panic(fmt.Sprintf("flowhttp: Options.Objectives[%q] = %d: not a band in [0, %d)", k, v, n))
			}
			h.objectives[strings.ToLower(k)] = v
		}
	}
	h.defBand = opts.DefaultBand
	if h.defBand < 0 {
		h.defBand += n
	}
	if h.defBand < 0 || h.defBand >= n {
		panic(fmt.Sprintf("flowhttp: Options.DefaultBand = %d: not a band of %d", opts.DefaultBand, n))
	}
	if h.gated == nil {
		h.gated = DefaultGated
	}
	if h.maxBody == 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.grace == 0 {
		h.grace = DefaultBodyGrace
	}
	if h.rate == 0 {
		h.rate = DefaultMinBodyRate
	}
	return h
}

// DefaultGated is Options.Gated's default: every method except GET, HEAD and
// OPTIONS, on any path. A wrapped handler that must know whether the request
// it serves holds a release (to count it, say) can call it too.
func DefaultGated(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// objective returns the request's objective header value: the llm-d one,
// else the legacy one.
func objective(hd http.Header) string {
	if v := hd[objectiveKey]; len(v) > 0 && v[0] != "" {
		return v[0]
	}
	if v := hd[legacyObjectiveKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// classifyBand applies the objective map, Classify and DefaultBand.
func (h *handler) classifyBand(r *http.Request, body []byte) int {
	if o := objective(r.Header); o != "" {
		if b, ok := h.objectives[o]; ok {
			return b
		}
		if b, ok := h.objectives[strings.ToLower(o)]; ok {
			return b
		}
	}
	if h.classify != nil {
		if b, ok := h.classify(r, body); ok && b >= 0 && b < len(h.bands) {
			return b
		}
	}
	return h.defBand
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.gated(r) {
		h.next.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	res := Result{Band: h.defBand}
	finish := func() {
		if h.onFinish != nil {
			h.onFinish(r, res)
		}
	}
	body, err := h.readBody(w, r, start)
	res.BodyBytes = len(body)
	if err != nil {
		res.Band = h.classifyBand(r, nil)
		res.Waited = time.Since(start)
		h.refuse(w, &res, err)
		finish()
		return
	}
	band := h.classifyBand(r, body)
	res.Band = band

	// Reserve the body's bytes in the band's budget while it waits.
	var reserved int64
	if max := h.bands[band].maxBytes; max > 0 && len(body) > 0 {
		n := int64(len(body))
		if n > max {
			res.Waited = time.Since(start)
			h.refuse(w, &res, fmt.Errorf("%w: %d bytes, band %q holds at most %d", ErrBodyTooLarge, n, h.bands[band].name, max))
			finish()
			return
		}
		if h.used[band].Add(n) > max {
			h.used[band].Add(-n)
			res.Waited = time.Since(start)
			h.refuse(w, &res, ErrBytesFull)
			finish()
			return
		}
		reserved = n
	}
	var done func()
	if h.bands[band].flows {
		flow, deadline := flowOf(r, start)
		res.Flow = flow
		done, err = h.c.WaitRequest(r.Context(), band, &flowcontrol.Request{Flow: flow, Cost: float64(len(body)), Deadline: deadline})
	} else {
		done, err = h.c.Wait(r.Context(), band)
	}
	if reserved > 0 {
		h.used[band].Add(-reserved)
	}
	res.Waited = time.Since(start)
	if err != nil {
		h.refuse(w, &res, err)
		finish()
		return
	}

	// Forward with the buffered body. Expect: 100-continue was answered
	// by net/http when the body was read; the wrapped handler must not
	// pass it on.
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Del("Expect")
	r.Header.Del("Content-Length")
	rec := &recorder{ResponseWriter: w, band: h.bands[band].name}
	res.Reason = ReasonForwarded
	defer func() {
		done()
		v := recover()
		res.Status = rec.code
		switch {
		case v != nil:
			res.Reason = ReasonAborted
			if r.Context().Err() != nil {
				res.Reason = ReasonCancelled
			}
		case r.Context().Err() != nil && rec.code == 0:
			res.Reason = ReasonCancelled
		}
		if res.Status == 0 {
			res.Status = StatusClientClosed
			if v == nil && res.Reason == ReasonForwarded {
				res.Status = http.StatusOK // net/http sends 200 for a handler that wrote nothing
			}
		}
		finish()
		if v != nil {
			panic(v)
		}
	}()
	h.next.ServeHTTP(rec, r)
}

// chunks are readBody's read buffers.
var chunks = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// readBody reads the request body, bounded by size and by rate.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request, start time.Time) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var src io.Reader = r.Body
	if h.maxBody > 0 {
		src = http.MaxBytesReader(w, r.Body, h.maxBody)
	}
	var rc *http.ResponseController
	if h.rate > 0 {
		rc = http.NewResponseController(w)
		if rc.SetReadDeadline(start.Add(h.grace)) != nil {
			rc = nil // not supported by this writer: no rate limit
		}
	}
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && (h.maxBody < 0 || n <= h.maxBody) {
		buf.Grow(int(min(n, 1<<20)))
	}
	cp := chunks.Get().(*[32 << 10]byte)
	defer chunks.Put(cp)
	chunk := cp[:]
	var err error
	for {
		var n int
		n, err = src.Read(chunk)
		buf.Write(chunk[:n])
		if err != nil {
			break
		}
		if rc != nil && n > 0 {
			allowed := time.Duration(float64(buf.Len()) / float64(h.rate) * float64(time.Second))
			_ = rc.SetReadDeadline(start.Add(h.grace + allowed))
		}
	}
	if rc != nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if errors.Is(err, io.EOF) {
		return buf.Bytes(), nil
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, tooLarge.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, fmt.Errorf("%w: %d bytes in %v", ErrBodyTimeout, buf.Len(), time.Since(start).Round(time.Millisecond))
	case r.Context().Err() != nil:
		return nil, fmt.Errorf("%w: %w", ErrClientGone, r.Context().Err())
	}
	return nil, fmt.Errorf("%w: %w", ErrBadBody, err)
}

// refusal is how one kind of refusal is answered.
type refusal struct {
	status  int
	reason  string
	retry   bool // Retry-After: 1; else x-should-retry: false
	closeIt bool // Connection: close
}

func refusalFor(err error) (refusal, bool) {
	switch {
	case errors.Is(err, flowcontrol.ErrFlowFull): // before ErrQueueFull, which it wraps
		return refusal{http.StatusTooManyRequests, ReasonFlowFull, true, false}, true
	case errors.Is(err, flowcontrol.ErrQueueFull):
		return refusal{http.StatusTooManyRequests, ReasonQueueFull, true, false}, true
	case errors.Is(err, ErrBytesFull):
		return refusal{http.StatusTooManyRequests, ReasonBytesFull, true, false}, true
	case errors.Is(err, flowcontrol.ErrShed):
		// Shed because the pool is saturated: an immediate retry is
		// more load on the pool that shed it, so the SDKs are told not
		// to.
		return refusal{http.StatusTooManyRequests, ReasonShed, false, false}, true
	case errors.Is(err, flowcontrol.ErrExpired):
		return refusal{http.StatusServiceUnavailable, ReasonExpired, false, false}, true
	case errors.Is(err, flowcontrol.ErrClosed):
		return refusal{http.StatusServiceUnavailable, ReasonShuttingDown, true, false}, true
	case errors.Is(err, flowcontrol.ErrNotRunning):
		return refusal{http.StatusServiceUnavailable, ReasonNotRunning, true, false}, true
	case errors.Is(err, ErrBodyTooLarge):
		// Not closed here: over MaxBodyBytes, net/http closes the
		// connection itself; over the band's budget the body was read.
		return refusal{http.StatusRequestEntityTooLarge, ReasonTooLarge, false, false}, true
	case errors.Is(err, ErrBodyTimeout):
		return refusal{http.StatusRequestTimeout, ReasonBodyTimeout, false, true}, true
	case errors.Is(err, ErrBadBody):
		return refusal{http.StatusBadRequest, ReasonBadBody, false, true}, true
	case errors.Is(err, flowcontrol.ErrCancelled), errors.Is(err, ErrClientGone):
		return refusal{}, false
	}
	return refusal{http.StatusInternalServerError, ReasonInternal, false, false}, true
}

// errorType is the OpenAI error type of a status.
func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusRequestTimeout:
		return "timeout_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// refuse answers err on flowhttp's own behalf and fills res.
func (h *handler) refuse(w http.ResponseWriter, res *Result, err error) {
	res.Err = err
	f, answer := refusalFor(err)
	if !answer {
		res.Status, res.Reason = StatusClientClosed, ReasonCancelled
		return
	}
	res.Status, res.Reason = f.status, f.reason
	w.Header()[bandKey] = []string{h.bands[res.Band].name}
	if f.closeIt {
		w.Header().Set("Connection", "close")
	}
	msg := fmt.Sprintf("band %q, waited %v: %v", h.bands[res.Band].name, res.Waited.Round(time.Millisecond), err)
	WriteError(w, f.status, f.reason, msg, f.retry)
}

// WriteError answers in flowhttp's format on the gateway's own behalf, for
// the refusals a gateway adds (no backend, backend failed): the
// OpenAI-shaped JSON error {"error":{"message","type","code"}} with code
// reason and message "flowgate: <reason>: <message>", DroppedReasonHeader set to
// reason, and Retry-After: 1 if retry, else x-should-retry: false.
func WriteError(w http.ResponseWriter, status int, reason, message string, retry bool) {
	markOwn(w)
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd[droppedKey] = []string{reason}
	if retry {
		hd.Set("Retry-After", "1")
	} else {
		hd.Set(ShouldRetryHeader, "false")
	}
	w.WriteHeader(status)
	var b bytes.Buffer
	b.WriteString(`{"error":{"message":`)
	m, _ := json.Marshal("flowgate: " + reason + ": " + message) // a string always marshals
	b.Write(m)
	b.WriteString(`,"type":"`)
	b.WriteString(errorType(status))
	b.WriteString(`","param":null,"code":`)
	c, _ := json.Marshal(reason)
	b.Write(c)
	b.WriteString("}}\n")
	_, _ = w.Write(b.Bytes())
}
