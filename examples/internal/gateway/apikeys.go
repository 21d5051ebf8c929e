package gateway

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// Tenant is what an API key grants (Options.APIKeys).
type Tenant struct {
	// Name names the tenant in logs; it is its fairness id when Flow is
	// empty.
	Name string
	// Ceiling is the name of the most critical band the tenant's requests
	// may use: a band of the configuration.
	Ceiling string
	// Flow is the tenant's fairness id; "" means Name.
	Flow string
}

// ParseAPIKeys reads API keys, one per line:
//
//	<key> <tenant> <ceiling band> [<fairness id>]
//
// Fields are separated by spaces or tabs; lines may also be separated by
// ';' (for an environment variable); empty lines and lines starting with #
// are skipped. A key given twice is an error. The keys are secrets: read
// them from a file or the environment, never from the YAML configuration.
func ParseAPIKeys(text string) (map[string]Tenant, error) {
	keys := map[string]Tenant{}
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(text, ";", "\n")))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 || len(f) > 4 {
			return nil, fmt.Errorf("api keys: entry %d: want <key> <tenant> <ceiling band> [<fairness id>], got %d fields", n, len(f))
		}
		if _, dup := keys[f[0]]; dup {
			return nil, fmt.Errorf("api keys: entry %d: key of tenant %q given twice", n, f[1])
		}
		t := Tenant{Name: f[1], Ceiling: f[2], Flow: f[1]}
		if len(f) == 4 {
			t.Flow = f[3]
		}
		keys[f[0]] = t
	}
	return keys, sc.Err()
}

// tenant is a Tenant resolved against the bands.
type tenant struct {
	id        flowhttp.Identity
	objective []string // the ceiling band's name, re-injected as the objective header
	flow      []string // the fairness id, re-injected as the fairness-id header
}

// identifier is the proxy's flowhttp Identify: the tenant of the request's
// API key (Authorization: Bearer <key>), and with strip llm-d's advice:
// every x-llm-d-* and x-gateway-inference-* request header removed at
// ingress, and the objective and fairness id re-injected from the key.
type identifier struct {
	keys  map[string]tenant
	strip bool
}

func newIdentifier(keys map[string]Tenant, bands []Band, strip bool) (*identifier, error) {
	id := &identifier{keys: make(map[string]tenant, len(keys)), strip: strip}
	for k, t := range keys {
		b := -1
		for i, band := range bands {
			if band.Name == t.Ceiling {
				b = i
			}
		}
		if b < 0 {
			return nil, fmt.Errorf("api keys: tenant %q: ceiling %q is not a band", t.Name, t.Ceiling)
		}
		flow := t.Flow
		if flow == "" {
			flow = t.Name
		}
		id.keys[k] = tenant{id: flowhttp.Identity{Ceiling: b, Flow: flow}, objective: []string{bands[b].Name}, flow: []string{flow}}
	}
	return id, nil
}

var (
	objectiveKey = http.CanonicalHeaderKey(flowhttp.ObjectiveHeader)
	fairnessKey  = http.CanonicalHeaderKey(flowhttp.FairnessIDHeader)
)

func (id *identifier) identify(r *http.Request) (flowhttp.Identity, bool) {
	t, ok := id.keys[bearer(r.Header.Get("Authorization"))]
	if id.strip {
		for k := range r.Header {
			if hasPrefixFold(k, "x-llm-d-") || hasPrefixFold(k, "x-gateway-inference-") {
				delete(r.Header, k)
			}
		}
		if ok {
			r.Header[objectiveKey] = t.objective
			r.Header[fairnessKey] = t.flow
		}
	}
	return t.id, ok
}

// bearer is the token of an Authorization header value ("" if none).
func bearer(v string) string {
	if len(v) > 7 && hasPrefixFold(v, "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// hasPrefixFold reports whether s starts with the lower-case ASCII prefix,
// up to ASCII case.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}
