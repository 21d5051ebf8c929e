package flowhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// Each way a client made itself critical, or sent the server a priority of
// its own, on a gateway at its zero value (keep mode) or trusting the header
// as behind a front proxy: the request stays in the band it was granted,
// and the server reads that band's priority.
func TestAttacksStayInTheirBand(t *testing.T) {
	bands := []flowcontrol.BandConfig{{Name: "critical", Capacity: 8}, {Name: "sheddable", Capacity: 8}}
	c, _, stop := runCtrl(t, bands)
	defer stop()
	zero := flowhttp.Handler(c, echoPriority, flowhttp.Options{})
	trusted := flowhttp.Handler(c, echoPriority, trustHeader(flowhttp.Options{}))
	for _, tc := range []struct {
		name      string
		h         http.Handler
		objective []string // the objective header's lines, in order
		body      string
		forwarded string // "none": no priority forwarded
	}{
		{"body priority 0", zero, nil, `{"priority":0}`, "1"},
		{"body priority -1", zero, nil, `{"priority":-1}`, "1"},
		{"body priority -0", zero, nil, `{"priority":-0}`, "1"},
		{"body priority min int64", zero, nil, `{"priority":-9223372036854775808}`, "1"},
		{"duplicate keys ending in 0", zero, nil, `{"priority":1,"priority":0}`, "1"},
		{"escaped key", zero, nil, `{"\u0070riority":0}`, "1"},
		{"non-UTF-8 body", zero, nil, "{\"prompt\":\"\xff\xfe\",\"priority\":0}", "1"},
		{"header CRİTİCAL", trusted, []string{"CRİTİCAL"}, `{}`, "none"},
		{"header critical from the client, zero value", zero, []string{"critical"}, `{}`, "none"},
		{"front proxy's appended value", trusted, []string{"critical", "sheddable"}, `{}`, "none"},
		{"front proxy's value in a joined line", trusted, []string{"critical, sheddable"}, `{}`, "none"},
		{"keep mode raw priority", trusted, []string{"sheddable"}, `{"priority":-1000000}`, "1"},
		{"keep mode raw priority, string", zero, nil, `{"priority":"-1000000"}`, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(tc.body))
			if tc.objective != nil {
				req.Header[http.CanonicalHeaderKey(flowhttp.ObjectiveHeader)] = tc.objective
			}
			rec := httptest.NewRecorder()
			tc.h.ServeHTTP(rec, req)
			t.Logf("band %s, forwarded priority %s", rec.Header().Get(flowhttp.BandHeader), rec.Body)
			require.Equal(t, 200, rec.Code, rec.Body.String())
			require.Equal(t, "sheddable", rec.Header().Get(flowhttp.BandHeader))
			require.Equal(t, tc.forwarded, rec.Body.String())
		})
	}
}

// Bodies a model server may read a priority from that the gateway cannot
// rewrite are refused before they queue: Python's json reads NaN, and
// decodes a body with a byte-order mark or in UTF-16.
func TestUnrewritableBodiesRefused(t *testing.T) {
	c, _, stop := runCtrl(t, []flowcontrol.BandConfig{{Name: "critical", Capacity: 8}, {Name: "sheddable", Capacity: 8}})
	defer stop()
	h := flowhttp.Handler(c, echoPriority, flowhttp.Options{})
	for _, body := range []string{
		`{"priority":-1000000,"temperature":NaN}`,
		"\xef\xbb\xbf{\"priority\":-1000000}",
		"{\x00\"\x00p\x00r\x00i\x00o\x00r\x00i\x00t\x00y\x00\"\x00:\x000\x00}\x00",
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body)))
		require.Equal(t, 400, rec.Code, "%q: %s", body, rec.Body)
		require.Equal(t, flowhttp.ReasonBadBody, rec.Header().Get(flowhttp.DroppedReasonHeader))
	}
}

// For any identity and anything a client sends, the granted band is never
// more critical than the identity's ceiling (nor than DefaultObjective's
// band for an anonymous caller) nor than what the client asked, and a
// forwarded priority is the granted band's.
func TestPropertyGrantedNeverAboveCeiling(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "bands")
		bands := make([]flowcontrol.BandConfig, n)
		for i := range bands {
			bands[i] = flowcontrol.BandConfig{Capacity: 4, Fairness: rapid.SampledFrom([]string{"", flowcontrol.FairnessRoundRobin}).Draw(t, "fairness")}
		}
		c, _, stop := runCtrl(t, bands)
		defer stop()
		def := rapid.IntRange(0, n-1).Draw(t, "default")
		known := rapid.Bool().Draw(t, "identified")
		ceiling := rapid.IntRange(-2, n+1).Draw(t, "ceiling")
		trust := rapid.Bool().Draw(t, "trust")
		var forwarded string
		h := flowhttp.Handler(c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			p, ok := flowhttp.BodyPriority(b)
			forwarded = "none"
			if ok {
				forwarded = strconv.FormatInt(p, 10)
			}
			w.WriteHeader(http.StatusOK) // the band header goes with it
		}), flowhttp.Options{
			DefaultObjective:     "band" + strconv.Itoa(def),
			TrustObjectiveHeader: trust,
			Identify: func(*http.Request) (flowhttp.Identity, bool) {
				return flowhttp.Identity{Ceiling: ceiling, Flow: "tenant"}, known
			},
		})
		values := []string{"critical", "sheddable", "CRITICAL", "CRİTİCAL", "", "nope", "critical, sheddable"}
		for i := range n {
			values = append(values, "band"+strconv.Itoa(i), "BAND"+strconv.Itoa(i))
		}
		lines := rapid.SliceOfN(rapid.SampledFrom(values), 0, 3).Draw(t, "objective")
		prio := rapid.OneOf(rapid.Just("none"), rapid.SampledFrom([]string{"0", "-1", "-0", "-9223372036854775808", "1", "7", `"0"`, "null"})).Draw(t, "priority")
		body := `{"prompt":"x"}`
		if prio != "none" {
			body = `{"prompt":"x","priority":` + prio + `}`
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		if len(lines) > 0 {
			req.Header[http.CanonicalHeaderKey(flowhttp.ObjectiveHeader)] = lines
		}
		req.Header.Set(flowhttp.FairnessIDHeader, rapid.StringMatching(`[a-z]{0,4}`).Draw(t, "fairness id"))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		got, err := strconv.Atoi(strings.TrimPrefix(rec.Header().Get(flowhttp.BandHeader), "band"))
		if err != nil {
			t.Fatal(err)
		}
		// The most the caller may have: its identity's ceiling, else
		// the default band, or what a trusted header grants.
		allowed := def
		if known {
			allowed = min(max(ceiling, 0), n-1)
		} else if trust {
			allowed = 0 // the header may grant anything
		}
		if got < allowed {
			t.Fatalf("granted band %d above the allowed %d", got, allowed)
		}
		// What the client asked: the least critical band its header names.
		asked := -1
		for _, l := range lines {
			for _, v := range strings.Split(l, ",") {
				v = strings.TrimSpace(v)
				b := -1
				switch {
				case v == "critical" || v == "CRITICAL":
					b = 0
				case v == "sheddable":
					b = n - 1
				case strings.HasPrefix(strings.ToLower(v), "band") && !strings.ContainsRune(v, 'İ'):
					b, _ = strconv.Atoi(v[4:])
				}
				asked = max(asked, b)
			}
		}
		if got < asked {
			t.Fatalf("granted band %d above the asked %d (%q)", got, asked, lines)
		}
		if prio != "none" && forwarded != strconv.Itoa(got) {
			t.Fatalf("band %d forwarded with priority %s", got, forwarded)
		}
	})
}
