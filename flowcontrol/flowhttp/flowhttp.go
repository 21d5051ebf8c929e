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
	ReasonMemoryFull   = "body-memory-full" // 429: Options.MaxBodyMemory is spent (bodies being read and waiting)
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
	// ErrMemoryFull: the body does not fit in what is left of
	// Options.MaxBodyMemory (for a request outside band 0, of what the
	// critical reserve leaves).
	ErrMemoryFull = errors.New("flowhttp: body memory budget full")
)

// Defaults of Options' zero fields.
const (
	DefaultMaxBodyBytes = 8 << 20         // 8 MiB
	DefaultBodyGrace    = 5 * time.Second // before MinBodyRate applies
	DefaultMinBodyRate  = 1 << 10         // 1 KiB/s
	// DefaultMaxBodyMemory bounds every gated body being read or waiting,
	// together: thousands of typical prompts fit, and the process's memory
	// stays bounded whatever its clients send (resident memory may grow by
	// about three times it: a growing buffer lives beside its copy for a
	// moment, and the collector lets the heap reach twice what is live).
	DefaultMaxBodyMemory = 64 << 20
	// DefaultBodyIdleTimeout: a body of which nothing arrives for 10 s is
	// cut, longer than any pause of a healthy client's connection.
	DefaultBodyIdleTimeout = 10 * time.Second
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
	// Evictions is how many times the gateway evicted the request before
	// its response started and re-queued it (GatewayConfig.Eviction).
	Evictions int
}

// MaxFairnessIDLen bounds the fairness id taken from a header: a longer one
// (or one with control characters) counts as no id, so a client cannot make
// the controller remember arbitrary strings.
const MaxFairnessIDLen = 128

// clientFlow is the fairness id a request's headers name ("" if none or
// unfit).
func clientFlow(hd http.Header) string {
	var id string
	if v := hd[fairnessKey]; len(v) > 0 && v[0] != "" {
		id = v[0]
	} else if v := hd[legacyFairnessKey]; len(v) > 0 {
		id = v[0]
	}
	if len(id) > MaxFairnessIDLen || strings.IndexFunc(id, func(c rune) bool { return c < 0x20 || c == 0x7f }) >= 0 {
		id = ""
	}
	return id
}

// deadlineOf is the request's deadline from its SLO header (zero: none).
func deadlineOf(r *http.Request, start time.Time) time.Time {
	if v := r.Header.Get(SLOTTFTHeader); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 && ms < int64(24*time.Hour/time.Millisecond) {
			return start.Add(time.Duration(ms) * time.Millisecond)
		}
	}
	return time.Time{}
}

// Identity is who sent a request, as the host established it
// (Options.Identify): the band it may use and the flow it queues in.
type Identity struct {
	// Ceiling is the most critical band the caller may use: its
	// requests go to this band or a less critical one, never a more
	// critical one. Out of range, it is clamped to the bands.
	Ceiling int
	// Flow is the caller's fairness id in a band with fairness
	// (flowcontrol.BandConfig.Fairness), whatever the request's
	// fairness-id header says. "" is flowcontrol.DefaultFlow, the flow
	// anonymous callers share.
	Flow string
}

// Options configures Handler and Gateway.Handler. The zero value protects:
// a client cannot place its request above the default (most sheddable)
// band, whatever header or body it sends; bodies are bounded in size, pace
// and total memory; and the critical band keeps a share of that memory no
// other request can take. The bands' names and byte budgets come from the
// controller (flowcontrol.BandConfig's Name and MaxBytes): the bodies of a
// band's waiting requests together may not exceed its MaxBytes (over it:
// 429 queue-bytes-full).
//
// A band is granted, not claimed: Identify (the host's) or, with
// TrustObjectiveHeader, the objective header sets the most critical band a
// request may use, its ceiling; without either the ceiling is
// DefaultObjective's band. What the client asks (its objective header,
// Classify's answer, its body's "priority") can only move it to a less
// critical band than the ceiling.
type Options struct {
	// Identify, if set, tells who sent a request, from what its client
	// cannot forge (an API key the host checks, r.TLS's verified chain, a
	// header the host's authenticating front proxy sets): the identity's
	// Ceiling is the most critical band the request may use, and its
	// Flow the fairness id it queues under. ok false is an anonymous
	// caller: ceiling as without Identify, and the flow shared by all
	// anonymous callers (so none can out-share a tenant by naming many
	// fairness ids). It runs before the body is read (it must not read
	// r.Body), possibly more than once per request (Gateway.Serve's
	// reserved connections ask too), so it should be cheap. Nil: every
	// caller is anonymous, and its fairness-id header names its flow.
	Identify func(r *http.Request) (id Identity, ok bool)
	// TrustObjectiveHeader trusts the objective header from every caller
	// Identify does not identify: its value grants the band, as in llm-d.
	// Set it only behind a front proxy that authenticates callers and
	// sets (or strips) the header itself; false (the default), the
	// header can only lower a request below DefaultObjective's band, so
	// a client cannot make itself critical.
	TrustObjectiveHeader bool
	// Objectives maps objective header values to bands; a value matches
	// a key exactly, up to ASCII case ("Critical" is "critical", "CRİTİCAL"
	// is neither). Nil: "critical" → 0, "sheddable" → the last band, and
	// every band's name → itself. A map given replaces the default
	// entirely. The header is a comma-separated list, and every line of
	// it counts (x-llm-d-inference-objective and the legacy name
	// together): a request asks for the least critical band its known
	// values name, so a value a front proxy appends cannot lose to the
	// client's own, and a client can only lower itself by adding one.
	Objectives map[string]int
	// DefaultObjective is the band of a request no identity places: an
	// Objectives key or a band name. It is the ceiling of every
	// anonymous request (without TrustObjectiveHeader) and where a
	// request that asks nothing goes. Empty means the last, most
	// sheddable band, so a client cannot jump the queue by leaving the
	// header out; set "critical" (or band 0's name) to trust every
	// caller with every band.
	DefaultObjective string
	// Classify, if set, answers for requests the objective header does
	// not place (missing or unknown value), before the body's priority
	// is consulted; ok false or a band out of range falls through. Its
	// answer is an ask like the header's: it can lower a request below
	// its ceiling, never raise it (Identify grants). body is the
	// buffered request body; do not keep it or change it.
	Classify func(r *http.Request, body []byte) (band int, ok bool)
	// IgnoreBodyPriority stops flowhttp from placing a request by the
	// "priority" field of its JSON body (see Priority). A body priority
	// only ever lowers a request below its ceiling.
	IgnoreBodyPriority bool
	// Priority is the model server's priority convention: how the body's
	// "priority" is read, and written when ForwardPriority is
	// PrioritySet. The zero value is vLLM's.
	Priority Convention
	// ForwardPriority says what happens to the body's "priority" field on
	// its way to the wrapped handler: kept where the client wrote one,
	// with the granted band's value in the Priority convention (the zero
	// value, PriorityKeep: the client's own value never reaches the
	// server), written with it whether or not the client wrote one
	// (PrioritySet: the model server then schedules and preempts by the
	// same band as the gateway), or removed (PriorityStrip: vLLM refuses
	// a non-zero priority unless it runs with --scheduling-policy
	// priority).
	ForwardPriority PriorityMode
	// Gated reports whether a request goes through flow control; the
	// others go straight to the wrapped handler. Nil: DefaultGated.
	Gated func(r *http.Request) bool
	// MaxBodyBytes caps a gated request's body (413 over it). 0:
	// DefaultMaxBodyBytes; negative: no cap.
	MaxBodyBytes int64
	// MaxBodyMemory bounds the bytes held for gated request bodies, being
	// read, waiting in any band or being served (until the wrapped handler
	// returns), all together: a body that would take it past the bound is
	// refused (429 body-memory-full) before more of it is read. 0:
	// DefaultMaxBodyMemory; negative: no bound.
	MaxBodyMemory int64
	// CriticalReserve is the part of MaxBodyMemory that only requests
	// granted band 0 before their body is read (by Identify, the trusted
	// objective header or DefaultObjective) may use, so uploads to the
	// other bands cannot take the memory critical requests need. 0:
	// MaxBodyMemory/4; negative: none.
	CriticalReserve int64
	// BodyGrace and MinBodyRate (bytes per second) cut a body that
	// arrives slower than MinBodyRate once BodyGrace has passed, with a
	// 408: from arrival + BodyGrace on, the bytes that arrived in the last
	// BodyRateWindow must be at least MinBodyRate times the part of that
	// window past arrival + BodyGrace, so bytes sent early buy no idle
	// time. Zero: DefaultBodyGrace, DefaultMinBodyRate;
	// MinBodyRate negative: no limit. It needs a writer that supports
	// http.ResponseController.SetReadDeadline (net/http's does).
	BodyGrace   time.Duration
	MinBodyRate int64
	// BodyIdleTimeout cuts, with a 408, a body of which no byte arrived
	// for this long, however fast it came before. 0:
	// DefaultBodyIdleTimeout; negative: none.
	BodyIdleTimeout time.Duration
	// OnFinish, if set, is called once per gated request when flowhttp is
	// done with it (after its Permit.Done, for a forwarded one), from the request's
	// goroutine.
	OnFinish func(r *http.Request, res Result)
}

var (
	objectiveKey       = http.CanonicalHeaderKey(ObjectiveHeader)
	legacyObjectiveKey = http.CanonicalHeaderKey(LegacyObjectiveHeader)
	fairnessKey        = http.CanonicalHeaderKey(FairnessIDHeader)
	legacyFairnessKey  = http.CanonicalHeaderKey(LegacyFairnessIDHeader)
	bandKey            = http.CanonicalHeaderKey(BandHeader)
	droppedKey         = http.CanonicalHeaderKey(DroppedReasonHeader)
)

// intake is the HTTP side of a Handler: it reads a gated request's body
// within the budgets, classifies the request into a band, waits on the
// controller and answers refusals. Every handler built on one intake (a
// Gateway's Handler calls) shares its bands, classification and budgets.
type intake struct {
	c          *flowcontrol.Controller
	bands      []band
	used       []atomic.Int64 // bytes of waiting bodies per band
	mem        *memory        // every body being read or waiting; nil: no bound
	objectives map[string]int // keys lower-cased in ASCII
	identify   func(*http.Request) (Identity, bool)
	trust      bool // Options.TrustObjectiveHeader
	classify   func(*http.Request, []byte) (int, bool)
	bodyPrio   bool
	conv       Convention
	fwdPrio    PriorityMode
	defBand    int
	gated      func(*http.Request) bool
	maxBody    int64
	grace      time.Duration
	rate       int64
	idle       time.Duration
	onFinish   func(*http.Request, Result)
	// forwarded counts the released requests Gateway.Forward has handed
	// to the poller whose handler has not returned (the credit's gap is
	// Controller.InFlight minus it).
	forwarded atomic.Int64
	// evict is the eviction side of a Gateway's intake (nil: off).
	evict *evicting
}

type handler struct {
	*intake
	next http.Handler
}

// Handler returns a handler that gates requests through c (see the package
// documentation) and serves them with next. It panics, naming the field, if
// opts are invalid for the controller's bands (an objective or
// DefaultObjective outside them, a negative duration); NewGateway reports
// the same as an error.
func Handler(c *flowcontrol.Controller, next http.Handler, opts Options) http.Handler {
	in, err := newIntake(c, opts)
	if err != nil {
		panic(err.Error())
	}
	return &handler{intake: in, next: next}
}

// newIntake validates opts against c's bands and fills the defaults.
func newIntake(c *flowcontrol.Controller, opts Options) (*intake, error) {
	in := &intake{
		c:        c,
		identify: opts.Identify,
		trust:    opts.TrustObjectiveHeader,
		classify: opts.Classify,
		bodyPrio: !opts.IgnoreBodyPriority,
		conv:     opts.Priority,
		fwdPrio:  opts.ForwardPriority,
		gated:    opts.Gated,
		maxBody:  opts.MaxBodyBytes,
		grace:    opts.BodyGrace,
		rate:     opts.MinBodyRate,
		idle:     opts.BodyIdleTimeout,
		onFinish: opts.OnFinish,
	}
	in.bands = bandsOf(c)
	n := len(in.bands)
	in.used = make([]atomic.Int64, n)
	in.objectives = map[string]int{}
	if opts.Objectives == nil {
		in.objectives["critical"] = 0
		in.objectives["sheddable"] = n - 1
		for i, b := range in.bands {
			in.objectives[asciiLower(b.name)] = i
		}
	} else {
		for k, v := range opts.Objectives {
			if v < 0 || v >= n {
				return nil, fmt.Errorf("flowhttp: Options.Objectives[%q] = %d: not a band in [0, %d)", k, v, n)
			}
			in.objectives[asciiLower(k)] = v
		}
	}
	in.defBand = n - 1
	if o := opts.DefaultObjective; o != "" {
		b, ok := in.objectives[asciiLower(o)]
		if !ok {
			for i, bd := range in.bands {
				if asciiEqualFold(bd.name, o) {
					b, ok = i, true
				}
			}
		}
		if !ok {
			return nil, fmt.Errorf("flowhttp: Options.DefaultObjective %q: neither an objective nor a band name", o)
		}
		in.defBand = b
	}
	switch opts.Priority {
	case ConventionVLLM, ConventionSGLang:
	default:
		return nil, fmt.Errorf("flowhttp: Options.Priority = %d: not a Convention", opts.Priority)
	}
	switch opts.ForwardPriority {
	case PriorityKeep, PrioritySet, PriorityStrip:
	default:
		return nil, fmt.Errorf("flowhttp: Options.ForwardPriority = %d: not a PriorityMode", opts.ForwardPriority)
	}
	if opts.BodyGrace < 0 {
		return nil, fmt.Errorf("flowhttp: Options.BodyGrace must be ≥ 0, got %v", opts.BodyGrace)
	}
	if in.gated == nil {
		in.gated = DefaultGated
	}
	if in.maxBody == 0 {
		in.maxBody = DefaultMaxBodyBytes
	}
	if in.grace == 0 {
		in.grace = DefaultBodyGrace
	}
	if in.rate == 0 {
		in.rate = DefaultMinBodyRate
	}
	if in.idle == 0 {
		in.idle = DefaultBodyIdleTimeout
	}
	total := opts.MaxBodyMemory
	if total == 0 {
		total = DefaultMaxBodyMemory
	}
	if total > 0 {
		reserve := opts.CriticalReserve
		switch {
		case reserve == 0:
			reserve = total / 4
		case reserve < 0:
			reserve = 0
		case reserve >= total:
			return nil, fmt.Errorf("flowhttp: Options.CriticalReserve (%d) must be below MaxBodyMemory (%d)", reserve, total)
		}
		in.mem = &memory{total: total, shared: total - reserve}
	}
	return in, nil
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

// asciiLower is s with its ASCII letters lower-cased and every other byte
// kept: unlike strings.ToLower, it folds no other letter into ASCII
// ("İ" stays "İ", not "i̇").
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// asciiEqualFold reports whether s and t are equal up to ASCII case: unlike
// strings.EqualFold, "CRİTİCAL" is not "critical".
func asciiEqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		a, b := s[i], t[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// objectiveBand looks one objective value up, exactly up to ASCII case,
// without allocating.
func (in *intake) objectiveBand(v string) (int, bool) {
	if b, ok := in.objectives[v]; ok {
		return b, true
	}
	var buf [2 * flowcontrol.MaxBandNameLen]byte
	if len(v) > len(buf) {
		for k, b := range in.objectives {
			if asciiEqualFold(k, v) {
				return b, true
			}
		}
		return 0, false
	}
	l := buf[:len(v)]
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		l[i] = c
	}
	b, ok := in.objectives[string(l)] // no allocation: a map index by a converted []byte
	return b, ok
}

// headerBand is the band the objective headers ask for: the least critical
// band any of their known values names (every line of both headers, each a
// comma-separated list), or ok false when they name none. The least
// critical wins because a client may always lower itself: a value it adds
// cannot raise it, and a value a front proxy appends or sets beside the
// client's is never overridden by a more critical one.
func (in *intake) headerBand(hd http.Header) (band int, ok bool) {
	band = -1
	for _, key := range [2]string{objectiveKey, legacyObjectiveKey} {
		for _, line := range hd[key] {
			for line != "" {
				var v string
				v, line, _ = strings.Cut(line, ",")
				if b, known := in.objectiveBand(strings.TrimSpace(v)); known && b > band {
					band = b
				}
			}
		}
	}
	return band, band >= 0
}

// grant is what a request's identity allows it, before its body is read:
// ceiling, the most critical band it may use, and flow, its fairness id in
// a band with fairness.
func (in *intake) grant(r *http.Request) (ceiling int, flow string) {
	if in.identify != nil {
		if id, ok := in.identify(r); ok {
			return min(max(id.Ceiling, 0), len(in.bands)-1), id.Flow
		}
		if !in.trust {
			return in.defBand, "" // anonymous callers share one flow
		}
	}
	flow = clientFlow(r.Header)
	if in.trust {
		if b, ok := in.headerBand(r.Header); ok {
			return b, flow
		}
	}
	return in.defBand, flow
}

// trustMode names, for the gateway's start log, whom the intake trusts with
// a band.
func (in *intake) trustMode() string {
	switch {
	case in.identify != nil && in.trust:
		return "identity, else the objective header (trusted from every other caller)"
	case in.identify != nil:
		return "identity (Options.Identify): a client's header or body only lowers its band"
	case in.trust:
		return "objective header trusted from every caller (llm-d's; behind an authenticating front proxy only)"
	}
	return "no identity: a client's header or body only lowers its band below the default"
}

// preBand is the band a request counts as while its body is read: its
// ceiling, lowered by what its headers ask. Classify and the body's
// priority may still lower it once the body is in.
func (in *intake) preBand(hd http.Header, ceiling int) int {
	if b, ok := in.headerBand(hd); ok {
		return max(b, ceiling)
	}
	return ceiling
}

// classifyBand is the granted band: what the request asks (its objective
// header, else Classify's answer, else its body's priority prio if hasPrio,
// else nothing), never more critical than its ceiling.
func (in *intake) classifyBand(r *http.Request, body []byte, ceiling int, prio int64, hasPrio bool) int {
	if b, ok := in.headerBand(r.Header); ok {
		return max(b, ceiling)
	}
	if in.classify != nil {
		if b, ok := in.classify(r, body); ok && b >= 0 && b < len(in.bands) {
			return max(b, ceiling)
		}
	}
	if in.bodyPrio && hasPrio {
		return max(in.conv.band(prio, len(in.bands)), ceiling)
	}
	return ceiling
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.gated(r) {
		h.next.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	ceiling, flow := h.grant(r)
	res := Result{Band: h.preBand(r.Header, ceiling)}
	finish := func() {
		if h.onFinish != nil {
			h.onFinish(r, res)
		}
	}
	body, held, err := h.readBody(w, r, start, res.Band == 0)
	res.BodyBytes = len(body)
	// held stays charged until the wrapped handler returns (or the
	// request is refused): a released body is still in memory.
	if err != nil {
		h.mem.release(held)
		res.Waited = time.Since(start)
		h.refuse(w, &res, err)
		finish()
		return
	}
	prio, hasPrio, bad := readPriority(body)
	if bad {
		// A priority the server may read and the gateway cannot
		// rewrite: it would reach the server as the client wrote it.
		h.mem.release(held)
		res.Waited = time.Since(start)
		h.refuse(w, &res, fmt.Errorf("%w: a JSON body the gateway cannot parse, or not plain UTF-8", ErrBadBody))
		finish()
		return
	}
	band := h.classifyBand(r, body, ceiling, prio, hasPrio)
	res.Band = band

	// Reserve the body's bytes in the band's budget while it waits.
	var reserved int64
	if max := h.bands[band].maxBytes; max > 0 && len(body) > 0 {
		n := int64(len(body))
		if n > max {
			h.mem.release(held)
			res.Waited = time.Since(start)
			h.refuse(w, &res, fmt.Errorf("%w: %d bytes, band %q holds at most %d", ErrBodyTooLarge, n, h.bands[band].name, max))
			finish()
			return
		}
		if h.used[band].Add(n) > max {
			h.used[band].Add(-n)
			h.mem.release(held)
			res.Waited = time.Since(start)
			h.refuse(w, &res, ErrBytesFull)
			finish()
			return
		}
		reserved = n
	}
	var permit flowcontrol.Permit
	var req *flowcontrol.Request
	queued := time.Now()
	if h.bands[band].flows {
		deadline := deadlineOf(r, start)
		res.Flow = flow
		req = &flowcontrol.Request{Flow: flow, Cost: float64(len(body)), Deadline: deadline}
		permit, err = h.c.WaitRequest(r.Context(), band, req)
	} else {
		permit, err = h.c.Wait(r.Context(), band)
	}
	if reserved > 0 {
		h.used[band].Add(-reserved)
	}
	res.Waited = time.Since(start)
	if err != nil {
		h.mem.release(held)
		h.refuse(w, &res, err)
		finish()
		return
	}

	body = rewritePriority(body, h.fwdPrio, h.conv.value(band, len(h.bands)))
	// Forward with the buffered body. Expect: 100-continue was answered
	// by net/http when the body was read; the wrapped handler must not
	// pass it on.
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Del("Expect")
	r.Header.Del("Content-Length")
	if h.evict != nil {
		h.forwardEvictable(w, r, &res, body, held, band, req, permit, start, queued, finish)
		return
	}
	rec := &recorder{ResponseWriter: w, band: h.bands[band].name, bandIdx: band, intake: h.intake, permit: permit}
	res.Reason = ReasonForwarded
	defer func() {
		if rec.forwarded {
			h.forwarded.Add(-1)
		}
		h.mem.release(held)
		permit.Done()
		v := recover()
		settle(&res, rec, r, v)
		finish()
		if v != nil {
			panic(v)
		}
	}()
	h.next.ServeHTTP(rec, r)
}

// Growth of a body buffer whose length is not declared (or is over
// exactBodyBytes): it starts at firstBodyChunk and doubles.
const (
	firstBodyChunk = 16 << 10
	exactBodyBytes = 1 << 20
)

// readBody reads the request body, bounded by size, by rate, by idle time
// and by the memory budget, and returns it with the bytes it holds in the
// budget (its capacity). critical says the request may use the reserve.
func (in *intake) readBody(w http.ResponseWriter, r *http.Request, start time.Time, critical bool) (_ []byte, held int64, _ error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	var src io.Reader = r.Body
	if in.maxBody > 0 {
		src = http.MaxBytesReader(w, r.Body, in.maxBody)
	}
	var rc *http.ResponseController
	var pc pace
	if in.rate > 0 || in.idle > 0 {
		pc.init(start, in.grace, in.rate, in.idle)
		rc = http.NewResponseController(w)
		if rc.SetReadDeadline(pc.deadline(time.Now())) != nil {
			rc = nil // not supported by this writer: no time limit
		}
	}
	// The buffer's capacity is what the body holds in the memory budget,
	// charged before it is allocated: a declared length up to
	// exactBodyBytes is allocated at once (one more byte, to read the
	// EOF into), anything else grows by doubling as bytes arrive, so a
	// client that declares 8 MiB and sends nothing holds 16 KiB.
	limit := int64(-1) // the most the buffer may need to hold; -1 = unbounded
	if in.maxBody > 0 {
		limit = in.maxBody + 1
	}
	if n := r.ContentLength; n > 0 && (limit < 0 || n+1 <= limit) {
		limit = n + 1
	}
	capFor := func(have int64) int64 {
		next := int64(firstBodyChunk)
		if have > 0 {
			next = 2 * have
		}
		if limit > 0 && (next > limit || limit <= exactBodyBytes) {
			next = limit
		}
		return max(next, have+1)
	}
	var buf []byte
	var err error
	for {
		if len(buf) == cap(buf) {
			c := capFor(int64(cap(buf)))
			// Charge the new buffer before the old one is let go: both
			// are live while the bytes are copied.
			if !in.mem.acquire(c, critical) {
				err = fmt.Errorf("%w: %d bytes read, %d more do not fit", ErrMemoryFull, len(buf), c-int64(cap(buf)))
				break
			}
			nb := make([]byte, len(buf), c)
			copy(nb, buf)
			in.mem.release(held)
			buf, held = nb, c
		}
		var n int
		n, err = src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
		if rc != nil && n > 0 {
			now := time.Now()
			pc.progress(int64(len(buf)), now)
			_ = rc.SetReadDeadline(pc.deadline(now))
		}
	}
	if rc != nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if errors.Is(err, io.EOF) {
		return buf, held, nil
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, ErrMemoryFull):
	case errors.As(err, &tooLarge):
		err = fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, tooLarge.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w: %d bytes in %v", ErrBodyTimeout, len(buf), time.Since(start).Round(time.Millisecond))
	case r.Context().Err() != nil:
		err = fmt.Errorf("%w: %w", ErrClientGone, r.Context().Err())
	default:
		err = fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	return nil, held, err
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
	case errors.Is(err, ErrMemoryFull):
		// The rest of the body was not read: the connection cannot be
		// reused.
		return refusal{http.StatusTooManyRequests, ReasonMemoryFull, true, true}, true
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
func (in *intake) refuse(w http.ResponseWriter, res *Result, err error) {
	res.Err = err
	f, answer := refusalFor(err)
	if !answer {
		res.Status, res.Reason = StatusClientClosed, ReasonCancelled
		return
	}
	res.Status, res.Reason = f.status, f.reason
	if res.Evictions > 0 && errors.Is(err, flowcontrol.ErrExpired) {
		// The gateway took this request back to serve more critical
		// work, and its wait ran out after: the client did nothing
		// wrong, and is told when to come back.
		f.retry = true
	}
	w.Header()[bandKey] = []string{in.bands[res.Band].name}
	if f.closeIt {
		w.Header().Set("Connection", "close")
	}
	msg := fmt.Sprintf("band %q, waited %v: %v", in.bands[res.Band].name, res.Waited.Round(time.Millisecond), err)
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

// settle fills in a forwarded request's Result once the wrapped handler
// returned (v is what it panicked with, if anything): the status written,
// the reason the recorder set (an eviction's included), or aborted or
// cancelled when the handler panicked or the client left before any
// status.
func settle(res *Result, rec *recorder, r *http.Request, v any) {
	res.Status = rec.code
	if rec.reason != "" {
		res.Reason = rec.reason
	}
	switch {
	case rec.reason == ReasonEvicted:
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
}
