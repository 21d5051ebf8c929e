package flowhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// ReasonEvicted is Result.Reason for a request whose response had started
// when the gateway evicted it (GatewayConfig.Eviction with Started): its
// stream ended with an error event, or its connection was cut.
const ReasonEvicted = "evicted"

// errEvicted is what the wrapped handler's writes return once its attempt
// was evicted: nothing more of it reaches the client.
var errEvicted = errors.New("flowhttp: request evicted")

// Eviction outcomes, the values of flowgate_evictions_total's outcome
// label and the indexes of evictCounts.outcome.
const (
	// evictRequeued: the victim had sent nothing to its client; it was
	// put back at the head of its band.
	evictRequeued = iota
	// evictEnded: the victim's response had started (EvictionConfig.Started);
	// it was ended with an error.
	evictEnded
	// evictDeclined: the act came when the request had already finished
	// at its server, or had started its response with Started off;
	// nothing was cut.
	evictDeclined
	evictOutcomes
)

var evictOutcomeNames = [evictOutcomes]string{"requeued", "ended", "declined"}

// evictCounts is one band's eviction accounting.
type evictCounts struct {
	outcome [evictOutcomes]atomic.Uint64
	// wasted is the time victims had run at their endpoint (from Forward
	// to the eviction), in nanoseconds: work the server did for nothing.
	wasted atomic.Int64
	// resent is the body bytes of re-queued victims: the prompt the
	// server will read and prefill again.
	resent atomic.Uint64
}

// evicting is a gateway intake's eviction side (nil: eviction off).
type evicting struct {
	ev      *flowcontrol.Evictor
	started bool // EvictionConfig.Started: a started response may be cut
	counts  []evictCounts
}

// attempt is one call of the wrapped handler for a request the evictor may
// take back. Its lock orders the act (on the evictor's goroutine) against
// the response's first body byte and the handler's return, so that exactly
// one of them wins: a response that started is not re-queued, and one that
// finished is not cut.
type attempt struct {
	rec    *recorder
	cancel context.CancelFunc // ends the context of the request next serves

	mu        sync.Mutex
	tracked   *flowcontrol.Tracked
	gen       int // Forward calls in this attempt; a done counts only for the latest
	fwd       []func() bool
	evicted   bool // the act took it
	committed bool // the response started: status and headers went with its first body byte
	over      bool // next returned: the attempt ended; its Forward dones no longer speak for the tracked request
	forwarded time.Time
	evictedAt time.Time
}

// forward records a Forward to endpoint in the attempt and tracks the
// request there; it returns done wrapped so that the host's done also
// tells the evictor the server is done with the request.
func (a *attempt) forward(ev *flowcontrol.Evictor, endpoint string, done func() bool) func() bool {
	a.mu.Lock()
	a.gen++
	gen := a.gen
	if a.forwarded.IsZero() {
		a.forwarded = time.Now()
	}
	a.fwd = append(a.fwd, done)
	t := a.tracked
	a.mu.Unlock()
	if t == nil {
		t = a.rec.tracked // from an earlier attempt
	}
	if t == nil {
		t = ev.Track(a.rec.bandIdx, endpoint, a.act)
	} else {
		t.Again(endpoint, a.act)
	}
	a.rec.tracked = t
	a.mu.Lock()
	a.tracked = t
	a.mu.Unlock()
	return func() bool {
		retired := done()
		a.mu.Lock()
		t, latest := a.tracked, !a.over && gen == a.gen
		a.mu.Unlock()
		if latest && t != nil {
			t.Done()
		}
		return retired
	}
}

// act is the evictor's act: it cancels the attempt's upstream request,
// unless the request finished or its response started (with Started off):
// then it declines (Tracked.Decline).
func (a *attempt) act() {
	in := a.rec.intake
	a.mu.Lock()
	take := !a.over && !a.evicted && (!a.committed || in.evict.started)
	if take {
		a.evicted, a.evictedAt = true, time.Now()
	}
	t, over := a.tracked, a.over
	a.mu.Unlock()
	if take {
		a.cancel()
		return
	}
	in.evict.counts[a.rec.bandIdx].outcome[evictDeclined].Add(1)
	if !over && t != nil {
		// Nothing is freed, and the request is no victim any more (it
		// finished, or started with Started off): the eviction is
		// undone, so it counts for nothing and the endpoint's next one
		// is not held up by it.
		t.Decline()
	}
}

// end marks the attempt over once next returned, gives back the endpoint
// counts of its Forwards (once each: their dones are idempotent) and ends
// its tracking, and reports whether the act took it and whether its
// response had started.
func (a *attempt) end() (evicted, committed bool) {
	a.mu.Lock()
	a.over = true
	evicted, committed = a.evicted, a.committed
	fwd, t := a.fwd, a.tracked
	a.mu.Unlock()
	for _, done := range fwd {
		done()
	}
	if t != nil {
		t.Done()
	}
	return evicted, committed
}

// ran is how long an evicted attempt had run at its endpoint: from its
// first Forward to the act (0 if it was never forwarded). Read after end.
func (a *attempt) ran() time.Duration {
	if a.forwarded.IsZero() {
		return 0
	}
	return a.evictedAt.Sub(a.forwarded)
}

// callNext serves r with next and returns what it panicked with, if
// anything, so that an attempt the gateway cut (httputil.ReverseProxy
// panics with http.ErrAbortHandler when its upstream copy fails) can be
// retried.
func callNext(next http.Handler, w http.ResponseWriter, r *http.Request) (v any) {
	defer func() { v = recover() }()
	next.ServeHTTP(w, r)
	return nil
}

// forwardEvictable is ServeHTTP's forwarding with eviction on: the request
// goes to next in attempts, each with a context the evictor's act cancels;
// an attempt evicted before its response started is discarded and the
// request re-queued at the head of its band, with its first wait's
// deadline; an attempt evicted after (EvictionConfig.Started) ends the
// response with an error. The request finishes (OnFinish) exactly once.
func (h *handler) forwardEvictable(w http.ResponseWriter, r *http.Request, res *Result, body []byte, held int64,
	band int, req *flowcontrol.Request, permit flowcontrol.Permit, start, queued time.Time, finish func()) {
	rec := &recorder{ResponseWriter: w, band: h.bands[band].name, bandIdx: band, intake: h.intake, permit: permit}
	base := w.Header().Clone()
	hdr := r.Header
	res.Reason = ReasonForwarded
	var v any
	refused := false
	defer func() {
		// (The forwarding gauge is given back after each attempt, below.)
		h.mem.release(held)
		rec.permit.Done()
		if refused {
			finish()
			return
		}
		settle(res, rec, r, v)
		finish()
		if v != nil {
			panic(v)
		}
	}()
	counts := &h.evict.counts[band]
	for {
		ctx, cancel := context.WithCancel(r.Context())
		a := &attempt{rec: rec, cancel: cancel}
		rec.begin(a, base)
		r2 := r.WithContext(ctx)
		// Each attempt gets the headers and body the client sent: what
		// an evicted attempt's handler changed is not carried over.
		r2.Header = hdr.Clone()
		r2.Body = io.NopCloser(bytes.NewReader(body))
		v = callNext(h.next, rec, r2)
		evicted, committed := a.end()
		cancel()
		if rec.forwarded {
			h.forwarded.Add(-1)
			rec.forwarded = false
		}
		if !evicted {
			if v == nil && !committed {
				rec.commit() // a response without body: its status and headers now
			}
			return
		}
		if committed {
			counts.outcome[evictEnded].Add(1)
			counts.wasted.Add(int64(a.ran()))
			rec.reason = ReasonEvicted
			v = rec.endStarted()
			return
		}
		// Evicted before its first body byte: whatever next wrote since
		// (a reverse proxy's 502, its abort) is the gateway's doing and
		// is dropped, and the request waits again.
		v = nil
		counts.outcome[evictRequeued].Add(1)
		counts.wasted.Add(int64(a.ran()))
		counts.resent.Add(uint64(len(body)))
		res.Evictions++
		rec.permit.Done()
		rec.permit = flowcontrol.Permit{}
		// The body waits again: it counts in its band's byte budget as
		// it did in its first wait (not refused for it: it was admitted).
		n := int64(0)
		if h.bands[band].maxBytes > 0 {
			n = int64(len(body))
			h.used[band].Add(n)
		}
		p, err := h.c.Requeue(r.Context(), band, req, queued)
		h.used[band].Add(-n)
		res.Waited = time.Since(start)
		if err != nil {
			refused = true
			h.refuse(w, res, err)
			return
		}
		rec.permit = p
	}
}

// begin readies the recorder for attempt a: nothing written, the headers
// as they were before the first attempt.
func (r *recorder) begin(a *attempt, base http.Header) {
	r.at = a
	r.hdr = base.Clone()
	r.code, r.own, r.reason = 0, false, ""
}

// commit sends the held status and headers.
func (r *recorder) commit() {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	h := r.ResponseWriter.Header()
	clear(h)
	maps.Copy(h, r.hdr)
	if !r.own {
		delete(h, droppedKey)
	}
	h[bandKey] = []string{r.band}
	r.ResponseWriter.WriteHeader(r.code)
	// From here on the handler writes the live map: trailers
	// (http.TrailerPrefix keys, set after the body) must reach it.
	r.hdr = h
}

// endStarted ends a started response the evictor took: a streamed one
// (text/event-stream) with an OpenAI-shaped error event, after which the
// stream ends; any other by cutting the connection, the one way to tell
// its client the body is incomplete. It returns the panic that cuts, or
// nil.
func (r *recorder) endStarted() any {
	if mt, _, _ := mime.ParseMediaType(r.hdr.Get("Content-Type")); mt != "text/event-stream" {
		return http.ErrAbortHandler
	}
	var b bytes.Buffer
	// The blank lines end an event the cut left open, so the error is an
	// event of its own.
	b.WriteString("\n\ndata: ")
	m, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": "flowgate: " + ReasonEvicted + ": the gateway took the request back for more critical work",
		"type":    errorType(http.StatusServiceUnavailable),
		"param":   nil,
		"code":    ReasonEvicted,
	}})
	b.Write(m)
	b.WriteString("\n\n")
	_, _ = r.ResponseWriter.Write(b.Bytes())
	_ = http.NewResponseController(r.ResponseWriter).Flush()
	return nil
}

// EvictionStats is a Gateway's eviction state (Gateway.Evictions): the
// evictor's, and what became of its evictions over HTTP. Slices are per
// band.
type EvictionStats struct {
	flowcontrol.EvictionStats
	// Requeued counts victims that had sent nothing to their client and
	// waited again at the head of their band.
	Requeued []uint64
	// Ended counts victims whose response had started and was ended with
	// an error (EvictionConfig.Started).
	Ended []uint64
	// Declined counts evictions that cut nothing: the request had
	// finished at its server, or had started its response (Started off),
	// when the act came.
	Declined []uint64
	// Wasted is the time victims had run at their endpoint, from Forward
	// to their eviction: the server's work thrown away.
	Wasted []time.Duration
	// ResentBytes is the body bytes of re-queued victims, which their
	// endpoint reads and prefills again.
	ResentBytes []uint64
}

// Evictions returns a snapshot of the eviction state; ok is false when
// eviction is off (GatewayConfig.Eviction).
func (g *Gateway) Evictions() (st EvictionStats, ok bool) {
	e := g.intake.evict
	if e == nil {
		return EvictionStats{}, false
	}
	st.EvictionStats = e.ev.Stats()
	n := len(e.counts)
	st.Requeued, st.Ended, st.Declined = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	st.Wasted, st.ResentBytes = make([]time.Duration, n), make([]uint64, n)
	for i := range e.counts {
		c := &e.counts[i]
		st.Requeued[i] = c.outcome[evictRequeued].Load()
		st.Ended[i] = c.outcome[evictEnded].Load()
		st.Declined[i] = c.outcome[evictDeclined].Load()
		st.Wasted[i] = time.Duration(c.wasted.Load())
		st.ResentBytes[i] = c.resent.Load()
	}
	return st, true
}
