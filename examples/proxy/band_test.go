package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
		got, ok := bodyPriority([]byte(tc.body))
		require.Equal(t, tc.ok, ok, tc.body)
		require.Equal(t, tc.want, got, tc.body)
	}
}

func TestBandFor(t *testing.T) {
	cfg := DefaultConfig()
	h := func(v string) http.Header {
		hd := http.Header{}
		if v != "" {
			hd.Set(ObjectiveHeader, v)
		}
		return hd
	}
	for _, tc := range []struct {
		header, body string
		band         int
		source       string
	}{
		{"critical", `{"priority":9}`, 0, sourceHeader}, // the header wins
		{"sheddable", ``, 1, sourceHeader},
		{"nope", `{"priority":0}`, 0, sourceBody}, // unknown objective falls through
		{"", `{"priority":-5}`, 0, sourceBody},
		{"", `{"priority":1}`, 1, sourceBody},
		{"", `{"priority":1000}`, 1, sourceBody},
		{"", `{"prompt":"x"}`, 1, sourceDefault},
		{"", `not json`, 1, sourceDefault},
	} {
		band, source := bandFor(&cfg, h(tc.header), []byte(tc.body))
		require.Equal(t, tc.band, band, "%+v", tc)
		require.Equal(t, tc.source, source, "%+v", tc)
	}
	cfg.DefaultBand = 0
	band, _ := bandFor(&cfg, h(""), nil)
	require.Equal(t, 0, band)
}

// FuzzBodyPriority: never panics; a reported priority is the integer that a
// generic JSON decode finds under the exact top-level key "priority".
func FuzzBodyPriority(f *testing.F) {
	for _, s := range []string{`{"priority":3}`, `{"priority":-1,"prompt":"x"}`, `{"priority":1.0}`, `{"PRIORITY":1}`,
		`{"\u0070riority":2}`, `{"priority":9223372036854775807}`, `{"priority":-9223372036854775808}`, `[]`, `{`, ``, `{"a":{"priority":1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, ok := bodyPriority(body)
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

// FuzzBandFor: any header value and body yield a valid band, and the
// header decides exactly when it names a known objective.
func FuzzBandFor(f *testing.F) {
	f.Add("critical", []byte(`{"priority":1}`))
	f.Add("", []byte(`{"priority":-7}`))
	f.Add("batch", []byte(`{"priority":70000}`))
	f.Add("sheddable", []byte(`x`))
	cfg := DefaultConfig()
	cfg.Bands = append(cfg.Bands, Band{Name: "batch", Priority: -10, Capacity: 8})
	cfg.Objectives = defaultObjectives(cfg.Bands)
	cfg.DefaultBand = 1
	f.Fuzz(func(t *testing.T, objective string, body []byte) {
		hd := http.Header{}
		hd.Set(ObjectiveHeader, objective)
		band, source := bandFor(&cfg, hd, body)
		require.GreaterOrEqual(t, band, 0)
		require.Less(t, band, len(cfg.Bands))
		if b, known := cfg.Objectives[hd.Get(ObjectiveHeader)]; known && hd.Get(ObjectiveHeader) != "" {
			require.Equal(t, sourceHeader, source)
			require.Equal(t, b, band)
			return
		}
		if p, ok := bodyPriority(body); ok {
			require.Equal(t, sourceBody, source)
			require.Equal(t, int(min(max(p, 0), int64(len(cfg.Bands)-1))), band)
			return
		}
		require.Equal(t, sourceDefault, source)
		require.Equal(t, cfg.DefaultBand, band)
	})
}

// BenchmarkBandFor is the per-request cost of resolving a band: by header,
// and from a codegen-sized body (4.7 KB prompt) with a priority field.
func BenchmarkBandFor(b *testing.B) {
	cfg := DefaultConfig()
	hdr := http.Header{}
	hdr.Set(ObjectiveHeader, "critical")
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("abcd", 1176) + `","max_tokens":195,"stream":true,"priority":1}`)
	b.Run("header", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bandFor(&cfg, hdr, body)
		}
	})
	b.Run("body-priority", func(b *testing.B) {
		b.ReportAllocs()
		empty := http.Header{}
		for b.Loop() {
			bandFor(&cfg, empty, body)
		}
	})
}

func BenchmarkBodyPriorityAbsent(b *testing.B) {
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("abcd", 1176) + `","max_tokens":195,"stream":true}`)
	b.ReportAllocs()
	for b.Loop() {
		bodyPriority(body)
	}
}
