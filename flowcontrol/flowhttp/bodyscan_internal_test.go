package flowhttp

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodedPriority is BodyPriority as it was: the whole body decoded into a
// map. scanPriority must answer as it does.
func decodedPriority(body []byte) (int64, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return 0, false
	}
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

var scanSeeds = []string{
	``, `{}`, `[]`, `{"priority":0}`, `{"priority":-1}`, `{"priority":-0}`, ` {"priority" : 7 } `,
	`{"priority":9223372036854775807}`, `{"priority":-9223372036854775808}`, `{"priority":9223372036854775808}`,
	`{"priority":1.5}`, `{"priority":"1"}`, `{"priority":1e3}`, `{"priority":null}`, `{"priority":true}`,
	`{"priority":1,"priority":2}`, `{"priority":1,"priority":"x"}`, `{"\u0070riority":3}`, `{"\u0070RIORITY":3}`,
	`{"PRIORITY":3}`, `{"pri\/ority":3}`, `{"priority\u0000":3}`, `{"a":{"priority":1},"b":[{"priority":2}]}`,
	`{"a":"\"priority\":1","priority":4}`, `{"a":"x\\","priority":5}`, `{"priority":1`, `{"priority":01}`,
	"{\"priority\":1}\xff", "{\"p\xffriority\":1}", `{"messages":[{"role":"user","content":"hi"}],"priority":2}`,
	`{"priority":[1]}`, `{"priority":{}}`, `{"a":[],"priority":-3,"b":{}}`, `{"\ud800riority":1}`, "{\"priority\":2}\u00a0",
	`{"priority":1} {"priority":2}`, `{"pr\u0069ority":6}`, `{"pr\u0049ority":6}`,
}

func TestScanPriorityMatchesDecoding(t *testing.T) {
	for _, s := range scanSeeds {
		p, ok := scanPriority([]byte(s))
		wp, wok := decodedPriority([]byte(s))
		require.Equal(t, wok, ok, "%q", s)
		require.Equal(t, wp, p, "%q", s)
	}
	require.Zero(t, testing.AllocsPerRun(10, func() { scanPriority(duplicateKeysBody()) }) /* the body is built once below */)
}

func FuzzScanPriority(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, ok := scanPriority(body)
		wp, wok := decodedPriority(body)
		if ok != wok || p != wp {
			t.Fatalf("%q: scan (%d, %v), decode (%d, %v)", body, p, ok, wp, wok)
		}
	})
}

var dupBody []byte

// duplicateKeysBody is 7.8 MB of duplicate "priority" keys.
func duplicateKeysBody() []byte {
	if dupBody == nil {
		n := 7_800_000 / len(`"priority":1,`)
		dupBody = []byte("{" + strings.Repeat(`"priority":1,`, n) + `"priority":0}`)
	}
	return dupBody
}

// BenchmarkBodyPriorityDuplicateKeys: the whole-body decoding against the
// scan, on 7.8 MB of duplicate keys.
func BenchmarkBodyPriorityDuplicateKeys(b *testing.B) {
	body := duplicateKeysBody()
	for _, c := range []struct {
		name string
		f    func([]byte) (int64, bool)
	}{{"decode", decodedPriority}, {"scan", scanPriority}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if p, ok := c.f(body); !ok || p != 0 {
					b.Fatal(p, ok)
				}
			}
		})
	}
}
