package gateway

import (
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "500": 500, "1k": 1000, "10Gi": 10 << 30, "512Mi": 512 << 20, "1048576Ki": 1 << 30,
		"1.5Gi": 3 << 29, "2M": 2e6, " 7 ": 7, "1Ei": 1 << 60,
		// Valid quantities the hand-written parser before this one refused.
		"1e3": 1000, "1E3": 1000, "+5": 5, "1E": 1e18, "2.5e1": 25, "1.e3": 1000, ".5e1": 5,
		// The largest count: 2^62 − 1.
		"4611686018427387903": 1<<62 - 1, "3.999999999999999999132638262011596452794037759304046630859375Ei": 1<<62 - 1,
	} {
		got, err := parseQuantity(in, "bytes")
		if err != nil || got != want {
			t.Errorf("parseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "-1", "1.5", "lots", "0x10", "4Ei", "1 Gi", "NaN", "Inf", "1_000", "1m",
		"500m", "0.5", "1e-3", "9Ei", "1e19", "4611686018427387904", "1ki", "1K", "1GB", "1e", "1e1.5", "1e3Ki", "+", "-", ".", "e3"} {
		if v, err := parseQuantity(in, "bytes"); err == nil {
			t.Errorf("parseQuantity(%q) = %d, want an error", in, v)
		}
	}
}

// TestParseQuantityKubernetesExamples: the examples Kubernetes documents,
// each with what resource.ParseQuantity makes of it, read here as a count.
func TestParseQuantityKubernetesExamples(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64 // -1: refused, a fraction
		doc  string
	}{
		// k8s.io/apimachinery/pkg/api/resource, the Quantity doc comment.
		{"1.5", -1, `"1.5 will be serialized as "1500m""`},
		{"1.5Gi", 1536 << 20, `"1.5Gi will be serialized as "1536Mi""`},
		// The package's ExampleMustParse and ExampleFormat.
		{"5Gi", 5368709120, "memorySize = 5368709120 (BinarySI)"},
		{"5G", 5000000000, "diskSize = 5000000000 (DecimalSI)"},
		{"5300m", -1, "milliCores = 5300"},
		{"5.4", -1, "milliCores = 5400"},
		// kubernetes.io, "Resource Management for Pods and Containers":
		// "the following represent roughly the same value".
		{"128974848", 128974848, "memory"},
		{"129e6", 129000000, "memory"},
		{"129M", 129000000, "memory"},
		{"128974848000m", 128974848, "memory"},
		{"123Mi", 128974848, "memory"},
		// ... "If you request 400m of memory, this is a request for 0.4
		// bytes" — refused here: a count of bytes is whole.
		{"400m", -1, "0.4 bytes"},
		// ... CPU: "0.1 is equivalent to the expression 100m".
		{"0.1", -1, "CPU"},
		{"100m", -1, "CPU"},
	} {
		got, err := parseQuantity(tc.in, "bytes")
		switch {
		case tc.want < 0 && (err == nil || !strings.Contains(err.Error(), "not a whole number")):
			t.Errorf("parseQuantity(%q) = %d, %v; want refused as a fraction (%s)", tc.in, got, err, tc.doc)
		case tc.want >= 0 && (err != nil || got != tc.want):
			t.Errorf("parseQuantity(%q) = %d, %v; want %d (%s)", tc.in, got, err, tc.want, tc.doc)
		}
	}
}

// TestParseQuantityGrammar: every production of the grammar, accepted and
// refused, with the value.
func TestParseQuantityGrammar(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64 // -1: refused
	}{
		// <number>: digits, digits.digits, digits., .digits.
		{"12", 12}, {"12.0", 12}, {"12.", 12}, {".5", -1}, {"0.5Ki", 512}, {".25Ki", 256}, {"007", 7}, {"00.100k", 100},
		{".", -1}, {"1.2.3", -1}, {"1..2", -1},
		// <sign>.
		{"+12", 12}, {"-0", 0}, {"-0.0Ki", 0}, {"-12", -1}, {"--1", -1}, {"+-1", -1}, {"+", -1}, {"-", -1}, {"+.", -1},
		// <binarySI>.
		{"1Ki", 1 << 10}, {"1Mi", 1 << 20}, {"1Gi", 1 << 30}, {"1Ti", 1 << 40}, {"1Pi", 1 << 50}, {"1Ei", 1 << 60},
		{"3Ei", 3 << 60}, {"4Ei", -1}, {"1.5Ki", 1536}, {"1.1Ki", -1}, {"0.0009765625Ki", 1}, {"0.00048828125Ki", -1},
		{"1ki", -1}, {"1KI", -1}, {"1KiB", -1}, {"1Ki ", 1024}, {"1 Ki", -1},
		// <decimalSI>: n u m "" k M G T P E.
		{"1000000000n", 1}, {"1n", -1}, {"1000000u", 1}, {"1u", -1}, {"1000m", 1}, {"1m", -1}, {"1", 1},
		{"1k", 1e3}, {"1M", 1e6}, {"1G", 1e9}, {"1T", 1e12}, {"1P", 1e15}, {"1E", 1e18}, {"4.6E", 46e17}, {"5E", -1},
		{"1K", -1}, {"1g", -1}, {"1Mb", -1},
		// <decimalExponent>: e or E, a signed whole number.
		{"1e3", 1000}, {"1E3", 1000}, {"1e+3", 1000}, {"1E+3", 1000}, {"1e03", 1000}, {"1e0", 1}, {"1e-0", 1},
		{"1000e-3", 1}, {"1500e-3", -1}, {"1e-3", -1}, {"25e-1", -1}, {"1e18", 1e18}, {"1e19", -1}, {"0e999999999999", 0},
		{"1e", -1}, {"1e+", -1}, {"1e1.5", -1}, {"1e+-3", -1}, {"e3", -1}, {"1e3k", -1}, {"1e3Ki", -1}, {"1ke3", -1},
		// Out of the grammar.
		{"", -1}, {" ", -1}, {"0x10", -1}, {"1_000", -1}, {"NaN", -1}, {"Inf", -1}, {"1/2", -1}, {"١", -1},
		// Range: 2^62 − 1 at most, however it is written.
		{"4611686018427387903", 1<<62 - 1}, {"4611686018427387904", -1}, {"4611686018427387903000m", 1<<62 - 1},
		{"99999999999999999999999999999", -1}, {"1e1000000000000", -1}, {"1e-1000000000000", -1},
	} {
		got, err := parseQuantity(tc.in, "bytes")
		switch {
		case tc.want < 0 && err == nil:
			t.Errorf("parseQuantity(%q) = %d, want an error", tc.in, got)
		case tc.want >= 0 && (err != nil || got != tc.want):
			t.Errorf("parseQuantity(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// TestParseQuantityMessages: a refusal says why, in the field's unit.
func TestParseQuantityMessages(t *testing.T) {
	const forms = ": quantities are written like 500, 1k, 1e3, 1.5Gi or 512Mi"
	for _, tc := range []struct{ in, unit, want string }{
		{"500m", "bytes", `"500m" is not a whole number of bytes`},
		{"0.5", "requests", `"0.5" is not a whole number of requests`},
		{"1.1Ki", "bytes", `"1.1Ki" is not a whole number of bytes`},
		{"5u", "requests", `"5u" is not a whole number of requests`},
		{"1e-40", "requests", `"1e-40" is not a whole number of requests`},
		{"-1Gi", "bytes", `"-1Gi" is negative: a number of bytes is 0 or more`},
		{"8Ei", "bytes", `"8Ei" is too large: at most 4611686018427387903 bytes (2^62 − 1)`},
		{"lots", "requests", `"lots" is not a quantity` + forms},
		{"", "requests", `"" is not a quantity` + forms},
		{"1GB", "bytes", `"1GB" is not a quantity` + forms},
		{"1GiB", "bytes", `"1GiB" is not a quantity` + forms},
		{"1KB", "bytes", `"1KB" is not a quantity` + forms},
		{"1gi", "bytes", `"1gi" is not a quantity` + forms},
		{"2K", "requests", `"2K" is not a quantity` + forms},
		{"1 Gi", "bytes", `"1 Gi" is not a quantity` + forms},
		{"1e1.5", "requests", `"1e1.5" is not a quantity` + forms},
		{"1x", "requests", `"1x" is not a quantity` + forms},
	} {
		_, err := parseQuantity(tc.in, tc.unit)
		if err == nil || err.Error() != tc.want {
			t.Errorf("parseQuantity(%q):\n got %v\nwant %s", tc.in, err, tc.want)
		}
	}
}

// quantityGrammar is the grammar as a regular expression, written apart from
// the parser to check it.
var quantityGrammar = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?$`)

// quantityOracle computes a quantity's value exactly another way (math/big's
// decimal reading, times the suffix); ok false when s is outside the grammar
// or its exponent too long to expand here.
func quantityOracle(s string) (r *big.Rat, ok bool) {
	s = strings.TrimSpace(s)
	if !quantityGrammar.MatchString(s) {
		return nil, false
	}
	mult := new(big.Rat).SetInt64(1)
	for suf, bits := range map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60} {
		if strings.HasSuffix(s, suf) {
			s = strings.TrimSuffix(s, suf)
			mult.SetInt(new(big.Int).Lsh(big.NewInt(1), bits))
		}
	}
	for suf, e := range map[string]string{"n": "1e-9", "u": "1e-6", "m": "1e-3", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12", "P": "1e15", "E": "1e18"} {
		if strings.HasSuffix(s, suf) {
			s = strings.TrimSuffix(s, suf)
			mult.SetString(e)
		}
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 && len(s)-i > 6 {
		return nil, false
	}
	v, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, false
	}
	return v.Mul(v, mult), true
}

// FuzzParseQuantity: parseQuantity accepts exactly the strings of the grammar
// whose value is a whole number in [0, 2^62), returns that value, and says
// why it refuses any other: not a quantity, negative, not whole, too large.
func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{
		// Numbers, signs.
		"0", "500", "007", "12.", ".5", "12.50", "+5", "-5", "-0", "+.5", "-.5", "1.2.3", ".", "+", "",
		// Each suffix.
		"1Ki", "1Mi", "1.5Gi", "10Gi", "1Ti", "1Pi", "1Ei", "4Ei", "0.5Ki", "1n", "1000000000n", "1u", "500m", "1000m",
		"1k", "2M", "1G", "1T", "1P", "1E", "5E",
		// Exponents.
		"1e3", "1E3", "1e+3", "1e-3", "1500e-3", "1e0", "1e", "1e+", "1e1.5", "1e+-3", "e3", "0e99999999", "1e-99999999",
		// Slips.
		"1ki", "1K", "1GB", "1GiB", "1 Gi", " 7 ", "1e3Ki", "0x10", "1_000", "NaN", "lots", "9223372036854775807",
		"4611686018427387903", "4611686018427387904", "\x00", "1\u00a0Gi",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseQuantity(s, "bytes")
		r, ok := quantityOracle(s)
		if err == nil {
			if v < 0 || v > 1<<62-1 {
				t.Fatalf("parseQuantity(%q) = %d, out of range", s, v)
			}
			if !quantityGrammar.MatchString(strings.TrimSpace(s)) {
				t.Fatalf("parseQuantity(%q) = %d, outside the grammar", s, v)
			}
			if ok && (!r.IsInt() || r.Num().Int64() != v) {
				t.Fatalf("parseQuantity(%q) = %d, want %s", s, v, r.RatString())
			}
			if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n != v {
				t.Fatalf("parseQuantity(%q) = %d, want %d", s, v, n)
			}
			return
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, quoteValue(s)+" ") {
			t.Fatalf("error %q does not name the value %q", msg, s)
		}
		if !quantityGrammar.MatchString(strings.TrimSpace(s)) {
			if !strings.Contains(msg, " is not a quantity: ") {
				t.Fatalf("parseQuantity(%q): %v, want 'not a quantity'", s, err)
			}
			return
		}
		if !ok {
			return // a long exponent: refused as too large or a fraction
		}
		var want string
		switch {
		case r.Sign() < 0:
			want = "is negative"
		case !r.IsInt():
			want = "not a whole number"
		case r.Cmp(new(big.Rat).SetInt64(1<<62-1)) > 0:
			want = "is too large"
		default:
			t.Fatalf("parseQuantity(%q) refused %s: %v", s, r.RatString(), err)
		}
		if !strings.Contains(msg, want) {
			t.Fatalf("parseQuantity(%q) = %v, want %q (the value is %s)", s, err, want, r.RatString())
		}
	})
}
