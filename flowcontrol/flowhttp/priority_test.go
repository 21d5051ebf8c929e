package flowhttp_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

func TestBodyPriority(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int64
		ok   bool
	}{
		{`{"priority": 3}`, 3, true},
		{` {"prompt":"x","priority":-2} `, -2, true},
		{`{"priority":0,"priority":5}`, 5, true}, // last wins, as in vLLM's parser
		{`{"\u0070riority":4}`, 4, true},         // an escaped key is still the key
		{`{"PRIORITY":4}`, 0, false},             // keys are case-sensitive
		{`{"priority":1.5}`, 0, false},
		{`{"priority":1e2}`, 0, false},
		{`{"priority":"1"}`, 0, false},
		{`{"priority":null}`, 0, false},
		{`{"priority":99999999999999999999}`, 0, false},
		{`{"nested":{"priority":1}}`, 0, false},
		{`[{"priority":1}]`, 0, false},
		{`{"priority":1`, 0, false},
		{``, 0, false},
		{`garbage`, 0, false},
	} {
		got, ok := flowhttp.BodyPriority([]byte(tc.body))
		require.Equal(t, tc.ok, ok, tc.body)
		require.Equal(t, tc.want, got, tc.body)
	}
}

// FuzzBodyPriority: never panics; a reported priority is the integer that a
// generic JSON decode finds under the exact top-level key "priority".
func FuzzBodyPriority(f *testing.F) {
	for _, s := range []string{`{"priority":3}`, `{"priority":-1,"prompt":"x"}`, `{"priority":1.0}`, `{"PRIORITY":1}`,
		`{"\u0070riority":2}`, `{"priority":9223372036854775807}`, `{"priority":-9223372036854775808}`, `[]`, `{`, ``, `{"a":{"priority":1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, ok := flowhttp.BodyPriority(body)
		var generic map[string]any
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.UseNumber()
		isObject := json.Valid(body) && dec.Decode(&generic) == nil && generic != nil
		if !ok {
			if isObject {
				if n, has := generic["priority"].(json.Number); has {
					if _, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
						t.Fatalf("missed integer priority %v in %q", n, body)
					}
				}
			}
			return
		}
		require.True(t, isObject, "priority from a non-object %q", body)
		n, has := generic["priority"].(json.Number)
		require.True(t, has, "no top-level priority in %q", body)
		require.Equal(t, n.String(), strconv.FormatInt(p, 10))
	})
}

func BenchmarkBodyPriorityAbsent(b *testing.B) {
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("abcd", 1176) + `","max_tokens":195,"stream":true}`)
	b.ReportAllocs()
	for b.Loop() {
		flowhttp.BodyPriority(body)
	}
}

// echoPriority answers with the "priority" the forwarded body carries
// ("none" without one).
var echoPriority = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil {
		_, _ = io.WriteString(w, "not an object")
		return
	}
	if p, ok := fields["priority"]; ok {
		_, _ = w.Write(p)
		return
	}
	_, _ = io.WriteString(w, "none")
})

// The body's priority places a request no header places, in the server's
// convention, below its ceiling (here DefaultObjective critical grants band
// 0 to every caller, or the trusted header does), and the band is what is
// forwarded: written where the client wrote a priority (Keep), always (Set),
// or removed (Strip).
func TestBodyPriorityClassifiesAndForwards(t *testing.T) {
	three := []flowcontrol.BandConfig{band("critical", 0, 0, 0), band("standard", 0, 0, 0), band("sheddable", 0, 0, 0)}
	crit := func(o flowhttp.Options) flowhttp.Options { o.DefaultObjective = "critical"; return o }
	trust := func(o flowhttp.Options) flowhttp.Options { o.TrustObjectiveHeader = true; return o }
	for _, tc := range []struct {
		name      string
		opts      flowhttp.Options
		objective string
		body      string
		band      string
		forwarded string
	}{
		{"vllm keep", crit(flowhttp.Options{}), "", `{"priority":0}`, "critical", "0"},
		{"vllm keep clamps", crit(flowhttp.Options{}), "", `{"priority":7}`, "sheddable", "2"},
		{"vllm keep negative", crit(flowhttp.Options{}), "", `{"priority":-3}`, "critical", "0"},
		{"no priority: the last band", flowhttp.Options{}, "", `{"prompt":"x"}`, "sheddable", "none"},
		{"a body priority never raises", flowhttp.Options{}, "", `{"priority":0}`, "sheddable", "2"},
		{"header wins", trust(flowhttp.Options{}), "critical", `{"priority":2}`, "critical", "0"},
		{"vllm set", crit(flowhttp.Options{ForwardPriority: flowhttp.PrioritySet}), "", `{"priority":1,"prompt":"x"}`, "standard", "1"},
		{"vllm set from header", trust(flowhttp.Options{ForwardPriority: flowhttp.PrioritySet}), "sheddable", `{"prompt":"x"}`, "sheddable", "2"},
		{"vllm set clamps", flowhttp.Options{ForwardPriority: flowhttp.PrioritySet}, "", `{"priority":99}`, "sheddable", "2"},
		{"sglang reads higher first", crit(flowhttp.Options{Priority: flowhttp.ConventionSGLang}), "", `{"priority":2}`, "critical", "2"},
		{"sglang low", crit(flowhttp.Options{Priority: flowhttp.ConventionSGLang}), "", `{"priority":0}`, "sheddable", "0"},
		{"sglang set", trust(flowhttp.Options{Priority: flowhttp.ConventionSGLang, ForwardPriority: flowhttp.PrioritySet}), "critical", `{"prompt":"x"}`, "critical", "2"},
		{"sglang set sheddable", trust(flowhttp.Options{Priority: flowhttp.ConventionSGLang, ForwardPriority: flowhttp.PrioritySet}), "sheddable", `{"priority":9}`, "sheddable", "0"},
		{"strip", crit(flowhttp.Options{ForwardPriority: flowhttp.PriorityStrip}), "", `{"priority":1,"prompt":"x"}`, "standard", "none"},
		{"ignore", crit(flowhttp.Options{IgnoreBodyPriority: true}), "", `{"priority":2}`, "critical", "0"},
		{"not json is forwarded as is", flowhttp.Options{ForwardPriority: flowhttp.PrioritySet}, "", `not json`, "sheddable", "not an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, three, echoPriority, tc.opts)
			resp, body, err := post(t, t.Context(), e.srv.URL+"/v1/completions", tc.objective, tc.body)
			require.NoError(t, err)
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, tc.band, resp.Header.Get(flowhttp.BandHeader))
			require.Equal(t, tc.forwarded, body)
			e.result(t)
		})
	}
}

// Written and read back in the same convention, every band is itself; the
// written value of band 0 is the convention's most urgent.
func TestPropertyConventionRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "bands")
		conv := rapid.SampledFrom([]flowhttp.Convention{flowhttp.ConventionVLLM, flowhttp.ConventionSGLang}).Draw(t, "conv")
		b := rapid.IntRange(0, n-1).Draw(t, "band")
		bands := make([]flowcontrol.BandConfig, n)
		for i := range bands {
			bands[i] = flowcontrol.BandConfig{Capacity: 4}
		}
		c, _, stop := runCtrl(t, bands)
		defer stop()
		// Written by one Handler, read by another: the band survives.
		var written string
		writer := flowhttp.Handler(c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			raw, _ := io.ReadAll(r.Body)
			p, _ := flowhttp.BodyPriority(raw)
			written = strconv.FormatInt(p, 10)
		}), flowhttp.Options{Priority: conv, ForwardPriority: flowhttp.PrioritySet,
			Objectives: map[string]int{"b": b}, TrustObjectiveHeader: true})
		req, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(`{"x":1}`))
		req.Header.Set(flowhttp.ObjectiveHeader, "b")
		writer.ServeHTTP(discardWriter{}, req)
		reader := flowhttp.Handler(c, ok, flowhttp.Options{Priority: conv, DefaultObjective: "band0"})
		rec := newRec()
		req, _ = http.NewRequest(http.MethodPost, "/", strings.NewReader(`{"priority":`+written+`}`))
		reader.ServeHTTP(rec, req)
		if got := rec.Header().Get(flowhttp.BandHeader); got != "band"+strconv.Itoa(b) {
			t.Fatalf("%d bands, convention %d: band %d written as %s read back as %s", n, conv, b, written, got)
		}
		if b == 0 && n > 1 {
			p, _ := strconv.Atoi(written)
			if conv == flowhttp.ConventionVLLM && p != 0 || conv == flowhttp.ConventionSGLang && p != n-1 {
				t.Fatalf("band 0 written as %d", p)
			}
		}
	})
}

// FuzzRewritePriority: a JSON object body forwarded with PrioritySet carries
// exactly the band's priority and every other top-level field unchanged;
// anything else is forwarded byte for byte.
func FuzzRewritePriority(f *testing.F) {
	for _, s := range []string{`{"priority":3,"prompt":"x"}`, `{"prompt":"x"}`, `{}`, `[]`, `null`, `{"a":{"priority":1}}`,
		`{"\u0070riority":2,"b":[1,2]}`, `{"priority":1,"priority":2}`, `not json`, ``, `{"x":1e400}`} {
		f.Add([]byte(s))
	}
	bands := []flowcontrol.BandConfig{{Name: "critical", Capacity: 8}, {Name: "sheddable", Capacity: 8}}
	c, _, stop := runCtrl(f, bands)
	f.Cleanup(stop)
	var got []byte
	h := flowhttp.Handler(c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got, _ = io.ReadAll(r.Body) }),
		flowhttp.Options{ForwardPriority: flowhttp.PrioritySet, TrustObjectiveHeader: true})
	f.Fuzz(func(t *testing.T, body []byte) {
		got = nil
		req, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		req.Header.Set(flowhttp.ObjectiveHeader, "critical")
		h.ServeHTTP(discardWriter{}, req)
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			if got == nil {
				return // refused 400: a body the server might read a priority from that the gateway cannot rewrite
			}
			require.Equal(t, string(body), string(got), "a body that is not a JSON object is forwarded as it is")
			return
		}
		var out map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(got, &out), "forwarded %q", got)
		require.Equal(t, "0", string(out["priority"]))
		delete(in, "priority")
		delete(out, "priority")
		require.Equal(t, len(in), len(out))
		for k, v := range in {
			var a, b bytes.Buffer
			require.NoError(t, json.Compact(&a, v))
			require.NoError(t, json.Compact(&b, out[k]))
			require.Equal(t, a.String(), b.String(), "field %q", k)
		}
	})
}
