package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// ObjectiveHeader names the request's objective, as in the Gateway API
// Inference Extension; the proxy maps it to a band through Config.Objectives.
const ObjectiveHeader = "x-gateway-inference-objective"

// objectiveKey is ObjectiveHeader in canonical form, so that the lookup
// does not canonicalise (and allocate) on every request.
var objectiveKey = http.CanonicalHeaderKey(ObjectiveHeader)

// Where a request's band came from (the x-flowgate-band-source response
// header and the logs say which).
const (
	sourceHeader  = "header"
	sourceBody    = "priority"
	sourceDefault = "default"
)

// bandFor resolves a request's band, in this order:
//
//  1. the x-gateway-inference-objective header, if present and known:
//     Objectives[value] (by default critical → band 0, sheddable → the last
//     band, and every band's own name). An unknown objective falls through.
//  2. vLLM's body field "priority", if the body is a JSON object whose
//     top-level "priority" is an integer: vLLM's convention is lower = more
//     urgent, so priority p goes to band clamp(p, 0, bands−1): priority ≤ 0
//     is band 0, 1 is band 1, and anything ≥ bands−1 the last band.
//  3. otherwise DefaultBand.
//
// It never fails: a malformed body or header only means the next rule
// applies (the body is forwarded untouched and the model server judges it).
func bandFor(cfg *Config, h http.Header, body []byte) (band int, source string) {
	if vs := h[objectiveKey]; len(vs) > 0 && vs[0] != "" {
		v := vs[0]
		if b, ok := cfg.Objectives[v]; ok {
			return b, sourceHeader
		}
	}
	if p, ok := bodyPriority(body); ok {
		n := int64(len(cfg.Bands) - 1)
		return int(min(max(p, 0), n)), sourceBody
	}
	return cfg.DefaultBand, sourceDefault
}

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
