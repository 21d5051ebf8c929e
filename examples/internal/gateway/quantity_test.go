package gateway

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "500": 500, "1k": 1000, "10Gi": 10 << 30, "512Mi": 512 << 20, "1048576Ki": 1 << 30,
		"1.5Gi": 3 << 29, "2M": 2e6, " 7 ": 7, "1Ei": 1 << 60,
	} {
		got, err := parseQuantity(in)
		if err != nil || got != want {
			t.Errorf("parseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "-1", "1.5", "lots", "1e3", "0x10", "4Ei", "1 Gi", "NaN", "Inf", "1_000", "1m"} {
		if v, err := parseQuantity(in); err == nil {
			t.Errorf("parseQuantity(%q) = %d, want an error", in, v)
		}
	}
}

// FuzzParseQuantity: never panics; an accepted quantity is a whole number
// in [0, 2^62), and a plain integer reads as itself.
func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"10Gi", "1k", "500", "1.5Gi", "-1", "1e3", "9223372036854775807", "0.1Ki", "Ki", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseQuantity(s)
		if err != nil {
			if !strings.Contains(err.Error(), "quantity") && !strings.Contains(err.Error(), "whole number") {
				t.Fatalf("error %v does not say what a quantity is", err)
			}
			return
		}
		if v < 0 || v >= 1<<62 {
			t.Fatalf("parseQuantity(%q) = %d, out of range", s, v)
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n != v {
			t.Fatalf("parseQuantity(%q) = %d, want %d", s, v, n)
		}
	})
}
