package main

import (
	"io"
	"strings"
	"testing"
)

// FuzzParseFlags: whatever -qps and -sweep-points strings a user types, parsing returns
// an error or positive finite rates and known workloads; it never panics.
func FuzzParseFlags(f *testing.F) {
	f.Add("4,10,16", "codegen:16,chat:80")
	f.Add("0.2, 0.7", "reasoning:0.7")
	f.Add("1e309", "chat:")
	f.Add(",", "x:1")
	f.Add("NaN", "codegen:-1")
	f.Fuzz(func(t *testing.T, qps, points string) {
		o, err := parseFlags([]string{"-qps", qps}, io.Discard)
		if err == nil {
			for _, q := range o.qps {
				if !(q > 0) || q > 1e308 {
					t.Fatalf("accepted rate %v from %q", q, qps)
				}
			}
			if qps == "" {
				if o.qps != nil {
					t.Fatalf("empty -qps must mean the published points, got %v", o.qps)
				}
			} else if len(o.qps) != strings.Count(qps, ",")+1 {
				t.Fatalf("accepted %d rates from %q", len(o.qps), qps)
			}
		}
		ps, err := parsePoints(points)
		if err == nil {
			for _, p := range ps {
				if !(p.qps > 0) || p.w.Name == "" {
					t.Fatalf("accepted point %+v from %q", p, points)
				}
			}
		}
	})
}
