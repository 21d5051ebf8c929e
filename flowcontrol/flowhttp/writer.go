package flowhttp

import "net/http"

// recorder wraps a gated request's ResponseWriter: it remembers the final
// status, lets 1xx answers through without taking them for the status, and
// sets BandHeader (removing the wrapped handler's copies of flowhttp's
// headers) when the final header is written, so a handler that clears the
// header map after a 1xx (httputil.ReverseProxy does) does not lose it.
type recorder struct {
	http.ResponseWriter
	band string
	code int
	own  bool // WriteError answered through it: keep DroppedReasonHeader
}

// markOwn finds flowhttp's recorder under w (through Unwrap) and marks the
// answer as the gateway's own.
func markOwn(w http.ResponseWriter) {
	for w != nil {
		if r, ok := w.(*recorder); ok {
			r.own = true
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

func (r *recorder) WriteHeader(code int) {
	if r.code != 0 {
		return // net/http would log a superfluous call; say nothing
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
	return r.ResponseWriter.Write(b)
}

// Flush flushes through to the underlying writer (handlers that assert
// http.Flusher, such as SSE handlers, find it here).
func (r *recorder) Flush() {
	if r.code == 0 {
		r.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
