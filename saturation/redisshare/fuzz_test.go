package redisshare

import (
	"testing"
)

// FuzzParseSnapshot feeds arbitrary hash fields and values, as a buggy or
// hostile peer could store them, to the parser. It must never panic, accept
// only canonical counts in [0, MaxCount], and account every field.
func FuzzParseSnapshot(f *testing.F) {
	for _, s := range [][2]string{
		{"10.0.0.7:8000", "3"}, {"", "1767225600000"}, {"a", "0"}, {"a", "-1"}, {"a", "01"},
		{"a", "4294967296"}, {"a", "4294967297"}, {"a", "9223372036854775807"}, {"a", " 7"},
		{"a", "1e3"}, {"a", "\x00"}, {"ep\xff", "12"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, field, value string) {
		n, err := parseCount(value)
		if err == nil {
			if n < 0 || n > MaxCount {
				t.Fatalf("parseCount(%q) = %d, out of range", value, n)
			}
			if formatCount(n) != value {
				t.Fatalf("parseCount(%q) = %d accepted a non-canonical form", value, n)
			}
		}
		counts, bad := parseSnapshot(map[string]string{field: value})
		switch {
		case field == heartbeatField:
			if len(counts) != 0 || bad != 0 {
				t.Fatalf("heartbeat field counted: %v bad %d", counts, bad)
			}
		case err != nil:
			if len(counts) != 0 || bad != 1 {
				t.Fatalf("bad value %q: %v bad %d", value, counts, bad)
			}
		case n == 0:
			if len(counts) != 0 || bad != 0 {
				t.Fatalf("zero kept: %v bad %d", counts, bad)
			}
		default:
			if counts[field] != n || len(counts) != 1 || bad != 0 {
				t.Fatalf("%q=%q: %v bad %d", field, value, counts, bad)
			}
		}
	})
}
