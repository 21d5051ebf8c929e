package flowhttp

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Convention is a model server's reading of the request body's integer
// "priority" field. flowhttp reads it to place a request no objective header
// places, and writes it (Options.ForwardPriority PrioritySet) so that the
// server's own scheduler orders and preempts by the gateway's band.
type Convention int

const (
	// ConventionVLLM is vLLM's (--scheduling-policy priority): lower is
	// more urgent, default 0. Priority p places a request in band
	// clamp(p, 0, bands−1); band i is written as i.
	ConventionVLLM Convention = iota
	// ConventionSGLang is SGLang's default (--enable-priority-scheduling
	// without --schedule-low-priority-values-first): higher is more
	// urgent. Priority p places a request in band clamp(bands−1−p, 0,
	// bands−1); band i is written as bands−1−i, so the critical band 0
	// has the highest value.
	ConventionSGLang
)

// band is the band of body priority p among n bands.
func (c Convention) band(p int64, n int) int {
	if c == ConventionSGLang {
		p = int64(n-1) - min(max(p, -1), int64(n)) // clamped first: no overflow
	}
	return int(min(max(p, 0), int64(n-1)))
}

// value is the body priority that stands for band b among n bands.
func (c Convention) value(b, n int) int {
	if c == ConventionSGLang {
		return n - 1 - b
	}
	return b
}

// PriorityMode says what flowhttp does to the body's "priority" field of a
// released request (Options.ForwardPriority).
type PriorityMode int

const (
	// PriorityKeep forwards the body as the client sent it, but for its
	// top-level "priority", if it has one: that is written with the
	// request's band in Options.Priority's convention, so a client's own
	// value (say −1000000, ahead of every critical request under vLLM's
	// priority scheduling) never reaches the server.
	PriorityKeep PriorityMode = iota
	// PrioritySet writes the request's band, in Options.Priority's
	// convention, into the body's top-level "priority" (added or
	// replaced), so the model server schedules by the gateway's band.
	// The server must run with priority scheduling on: vLLM refuses a
	// non-zero priority otherwise.
	PrioritySet
	// PriorityStrip removes the body's top-level "priority".
	PriorityStrip
)

// BodyPriority returns the top-level integer "priority" of a JSON object
// body (vLLM's and SGLang's request field). It reports false for anything
// else: not JSON, not an object, no such key, or a value that is not an
// integer in int64 range (1.5, "1", 1e3, null). Keys match exactly
// ("PRIORITY" is not "priority"), as the servers read them.
func BodyPriority(body []byte) (int64, bool) { return scanPriority(body) }

// readPriority is BodyPriority, and also reports as bad a body that a model
// server may read a priority from but that flowhttp cannot rewrite: an
// object that may name the key but that encoding/json refuses (Python's
// json, vLLM's, reads NaN and Infinity), or a body that Python decodes as
// UTF-8 with a byte-order mark, UTF-16 or UTF-32 (a BOM, or a NUL in the
// first four bytes of a body with a '{').
func readPriority(body []byte) (p int64, ok, bad bool) {
	if hasBOM(body) {
		return 0, false, true
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || !mayNamePriority(body) {
		return 0, false, false
	}
	if !json.Valid(body) {
		return 0, false, true
	}
	p, ok = scanPriority(body)
	return p, ok, false
}

// mayNamePriority reports whether a JSON text may hold the key "priority":
// written literally or with a \u escape.
func mayNamePriority(t []byte) bool {
	return bytes.Contains(t, []byte("priority")) || bytes.Contains(t, []byte(`\u`))
}

// hasBOM reports whether body starts as Python's json.loads detects an
// encoding other than plain UTF-8: a byte-order mark, or a NUL in the first
// four bytes (UTF-16 or UTF-32 without one) of a body that has a '{' (a
// binary upload has no object to read a priority from).
func hasBOM(b []byte) bool {
	switch {
	case bytes.HasPrefix(b, []byte{0xEF, 0xBB, 0xBF}), bytes.HasPrefix(b, []byte{0xFE, 0xFF}), bytes.HasPrefix(b, []byte{0xFF, 0xFE}):
		return true
	}
	return bytes.IndexByte(b[:min(len(b), 4)], 0) >= 0 && bytes.IndexByte(b, '{') >= 0
}

// rewritePriority returns body with its top-level "priority" set to value
// (PrioritySet; PriorityKeep only if the body has one) or removed
// (PriorityStrip). A body that is not a JSON object
// is returned as it is: the model server judges it. Only the priority
// changes: every other field is copied as its raw JSON (their order becomes
// sorted).
func rewritePriority(body []byte, mode PriorityMode, value int) []byte {
	t := bytes.TrimSpace(body)
	if len(t) == 0 || t[0] != '{' {
		return body
	}
	if mode != PrioritySet && !mayNamePriority(t) {
		return body // nothing to strip or to overwrite
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(t, &fields) != nil || fields == nil {
		return body
	}
	switch mode {
	case PrioritySet:
		fields["priority"] = json.RawMessage(strconv.Itoa(value))
	case PriorityKeep:
		if _, ok := fields["priority"]; !ok {
			return body
		}
		fields["priority"] = json.RawMessage(strconv.Itoa(value))
	case PriorityStrip:
		if _, ok := fields["priority"]; !ok {
			return body
		}
		delete(fields, "priority")
	}
	// An encoder without HTML escaping: json.Marshal would rewrite every
	// <, > and & inside the other fields' strings as \u escapes.
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if enc.Encode(fields) != nil {
		return body
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}
