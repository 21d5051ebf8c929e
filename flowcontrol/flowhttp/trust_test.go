package flowhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
