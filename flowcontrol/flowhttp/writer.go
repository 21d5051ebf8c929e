package flowhttp

import (
	"net/http"

	"github.com/flowgate/flowgate/flowcontrol"
)

// recorder wraps a gated request's ResponseWriter: it remembers the final
// status, lets 1xx answers through without taking them for the status, and
// sets BandHeader (removing the wrapped handler's copies of flowhttp's
// headers) when the final header is written, so a handler that clears the
// header map after a 1xx (httputil.ReverseProxy does) does not lose it.
type recorder struct {
	http.ResponseWriter
	band    string
	bandIdx int // the band's index (BandOf)
	code    int
	own     bool // WriteError answered through it: keep DroppedReasonHeader
	// intake and forwarded serve Gateway.Forward: the request holds a
	// release, and whether it was already handed to an endpoint.
	intake    *intake
	forwarded bool
	permit    flowcontrol.Permit // the request's controller slot, for Forward's early end
	reason    string             // SetReason's
	// With eviction on (forwardEvictable), at is the current attempt and
	// the recorder holds the status and headers (in hdr) until the first
	// body byte: a response whose headers reached the client could not be
	// re-queued. tracked is the request's evictor record, kept across
	// attempts (its eviction count).
	at      *attempt
	hdr     http.Header
	tracked *flowcontrol.Tracked
}

// Header is the wrapped writer's header map, or the held one while the
// recorder holds the response (eviction on).
func (r *recorder) Header() http.Header {
	if r.at != nil {
		return r.hdr
	}
	return r.ResponseWriter.Header()
}

// SetReason tells flowhttp why the wrapped handler answered as it did, for
// the request w serves: Result.Reason reports it instead of
// ReasonForwarded (for example "no-backend" or "backend-error" when the
// handler refused on its own behalf with WriteError). It does nothing for a
// writer that is not a gated request's.
func SetReason(w http.ResponseWriter, reason string) {
	if r := recorderOf(w); r != nil {
		r.reason = reason
	}
}

// BandOf returns the band flowhttp placed the request w answers in, for the
// handler Handler (or Gateway.Handler) wraps: after the objective header,
// Options.Classify, the body's "priority" and Options.DefaultObjective
// (see the package documentation), the band the request waited in. ok is
// false for a writer that is not a gated request's (an ungated method, or
// a handler called outside Handler); w may wrap flowhttp's writer (it is
// unwrapped through Unwrap, as http.ResponseController does).
func BandOf(w http.ResponseWriter) (band int, ok bool) {
	if r := recorderOf(w); r != nil {
		return r.bandIdx, true
	}
	return 0, false
}

// recorderOf finds flowhttp's recorder under w (through Unwrap), or nil.
func recorderOf(w http.ResponseWriter) *recorder {
	for w != nil {
		if r, ok := w.(*recorder); ok {
			return r
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// markOwn finds flowhttp's recorder under w (through Unwrap) and marks the
// answer as the gateway's own.
func markOwn(w http.ResponseWriter) {
	if r := recorderOf(w); r != nil {
		r.own = true
	}
}

func (r *recorder) WriteHeader(code int) {
	if r.code != 0 {
		return // net/http would log a superfluous call; say nothing
	}
	if r.at != nil {
		// Held until the first body byte. An informational answer
		// (103 Early Hints) is dropped: it would reach a client whose
		// request may yet be re-queued, and it is only a hint.
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			return
		}
		r.code = code
		if code == http.StatusSwitchingProtocols {
			_, _ = r.Write(nil) // the connection is handed over now
		}
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		r.ResponseWriter.WriteHeader(code)
		return
	}
	h := r.ResponseWriter.Header()
	if !r.own {
		delete(h, droppedKey)
	}
	h[bandKey] = []string{r.band}
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if a := r.at; a != nil {
		if len(b) == 0 && r.code != http.StatusSwitchingProtocols {
			return 0, nil // no body byte: the response has not started
		}
		a.mu.Lock()
		if a.evicted {
			a.mu.Unlock()
			return 0, errEvicted
		}
		first := !a.committed
		a.committed = true
		t := a.tracked
		a.mu.Unlock()
		if first {
			r.commit()
			if t != nil {
				t.Start()
			}
		}
	}
	return r.ResponseWriter.Write(b)
}

// Flush flushes through to the underlying writer (handlers that assert
// http.Flusher, such as SSE handlers, find it here).
func (r *recorder) Flush() {
	if r.at != nil && !r.at.committed {
		// Nothing to flush before the first body byte: the status and
		// headers are held (the flag is written only on this goroutine).
		return
	}
	if r.code == 0 {
		r.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
