package flowhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// FuzzHandler feeds arbitrary objective headers, methods and bodies: the
// answer is the wrapped handler's (with a band the controller has) or a
// refusal whose JSON error decodes and whose code is the dropped reason.
func FuzzHandler(f *testing.F) {
	f.Add("POST", "critical", "", `{"prompt":"hi"}`)
	f.Add("POST", "SHEDDABLE", "", `{}`)
	f.Add("PUT", "", "critical", "")
	f.Add("GET", "x\x00y", "", "")
	f.Add("POST", "Critical ", "sheddable", strings.Repeat("z", 300))
	f.Add("POST", "\xff\xfe", "", "\x00")
	var pool saturation.Value
	pool.Set(1) // the last band is blocked: its requests expire at once
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Source: &pool, Bands: []flowcontrol.BandConfig{
		band("critical", 8, 0, 0), band("standard", 8, time.Millisecond, 0), band("sheddable", 8, time.Millisecond, 200)}}})
	if err != nil {
		f.Fatal(err)
	}
	ran := c.Start(context.Background())
	f.Cleanup(func() { c.Close(); <-ran })
	names := []string{"critical", "standard", "sheddable"}
	h := flowhttp.Handler(c, ok, flowhttp.Options{
		MaxBodyBytes: 256,
		Classify: func(_ *http.Request, body []byte) (int, bool) {
			var v struct{ Priority int }
			if json.Unmarshal(body, &v) != nil {
				return 0, false
			}
			return v.Priority, true // may be out of range: falls through
		},
	})
	f.Fuzz(func(t *testing.T, method, objective, legacy, body string) {
		req, err := http.NewRequest(method, "http://x/v1/completions", strings.NewReader(body))
		if err != nil {
			return // not a request net/http would parse
		}
		req.Header[http.CanonicalHeaderKey(flowhttp.ObjectiveHeader)] = []string{objective}
		req.Header[http.CanonicalHeaderKey(flowhttp.LegacyObjectiveHeader)] = []string{legacy}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		band := rec.Header().Get(flowhttp.BandHeader)
		switch rec.Code {
		case 200:
			if band == "" && (method == "POST" || method == "PUT") {
				t.Fatalf("gated 200 without a band")
			}
		case 413, 503, 429, 400:
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("refusal body %q: %v", rec.Body, err)
			}
			if e.Error.Code == "" || e.Error.Code != rec.Header().Get(flowhttp.DroppedReasonHeader) || e.Error.Type == "" {
				t.Fatalf("refusal %+v, header %q", e, rec.Header().Get(flowhttp.DroppedReasonHeader))
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if band != "" && band != names[0] && band != names[1] && band != names[2] {
			t.Fatalf("band %q", band)
		}
	})
}
