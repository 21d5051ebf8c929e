package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// The objective headers the proxy reads (flowhttp's): llm-d's, and the
// Gateway API Inference Extension's legacy name.
const (
	ObjectiveHeader       = flowhttp.ObjectiveHeader
	LegacyObjectiveHeader = flowhttp.LegacyObjectiveHeader
)

// A request's band is found by flowhttp, in this order:
//
//  1. the objective header (x-llm-d-inference-objective, else the legacy
//     x-gateway-inference-objective), if its value is a known objective,
//     case-insensitively: Config.Objectives (by default critical → band 0,
//     sheddable → the last band, and every band's own name). An unknown
//     objective falls through.
//  2. vLLM's body field "priority", if the body is a JSON object whose
//     top-level "priority" is an integer: vLLM's convention is lower = more
//     urgent, so priority p goes to band clamp(p, 0, bands−1): priority ≤ 0
//     is band 0, 1 is band 1, and anything ≥ bands−1 the last band.
//  3. otherwise DefaultBand.
//
// It never fails: a malformed body or header only means the next rule
// applies (the body is forwarded untouched and the model server judges it).

// bodyPriority extracts the top-level integer "priority" of a JSON object.
// It reports false for anything else: not JSON, not an object, no such key,
// or a value that is not an integer in int64 range (1.5, "1", 1e3, null).
func bodyPriority(body []byte) (int64, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return 0, false
	}
	// Cheap exit for the common request without a priority: the key is
	// written either literally or with a \u escape (no other JSON escape
	// can spell one of its letters), so a body with neither has no such key
	// and would decode to the same answer.
	if !bytes.Contains(body, []byte("priority")) && !bytes.Contains(body, []byte(`\u`)) {
		return 0, false
	}
	// A map, not a struct: encoding/json matches struct fields without
	// regard to case, and vLLM's "PRIORITY" is not its "priority".
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return 0, false
	}
	raw, ok := fields["priority"]
	if !ok {
		return 0, false
	}
	p, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, false
	}
	return p, true
}

// stripPriority removes the top-level "priority" of a JSON object body
// (Config.BodyPriority strip): vLLM refuses a non-zero priority unless it runs
// with --scheduling-policy priority. A body without one, or not a JSON
// object, is forwarded as it is.
func stripPriority(r *http.Request) {
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err == nil {
		if _, ok := bodyPriority(body); ok {
			var fields map[string]json.RawMessage
			if json.Unmarshal(body, &fields) == nil {
				delete(fields, "priority")
				if out, err := json.Marshal(fields); err == nil {
					body = out
				}
			}
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}
