package gateway

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// Kubernetes quantities, as llm-d writes flowControl.maxRequests and
// maxBytes (resource.Quantity in its EndpointPickerConfig). The grammar, as
// k8s.io/apimachinery/pkg/api/resource documents it:
//
//	<quantity>        ::= <signedNumber><suffix>
//	<signedNumber>    ::= <number> | <sign><number>
//	<number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//	<sign>            ::= "+" | "-"
//	<suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//	<binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//	<decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//	<decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//
// (n and u are parsed by the package though its grammar's comment omits
// them.) The exponent is a signed whole number: the grammar's <signedNumber>
// would allow 1e1.5, which resource.ParseQuantity refuses, and so does
// parseQuantity. "1E" is 10^18 (the suffix E), "1E3" is 1000 (an exponent).
// Surrounding spaces are trimmed, as resource.Quantity's JSON decoding does
// for the config llm-d reads; none may stand inside.
//
// What differs from resource.ParseQuantity is what follows parsing:
// Kubernetes rounds a value up to a whole number of nano units and caps it
// at 2^63−1; parseQuantity computes the value exactly and refuses one that
// is not a whole count (a fraction such as 0.5 or 500m), negative, or
// 2^62 or more, saying which.

// maxQuantity bounds a count: 2^62 − 1 (a budget of 4 EiB).
const maxQuantity = 1<<62 - 1

var (
	binarySuffixes  = map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
	decimalSuffixes = map[string]int64{"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
)

// quantityForms is what a syntax error reminds the reader of.
const quantityForms = "quantities are written like 500, 1k, 1e3, 1.5Gi or 512Mi"

// scannedQuantity is a quantity's parts: the value is
// sign × digits × 10^exp10 × 2^shift, digits a decimal string with no
// leading or trailing zeros ("" for 0).
type scannedQuantity struct {
	neg    bool
	digits string
	exp10  int64
	shift  uint
	suffix string
}

// maxExponent bounds a written exponent: larger ones are clamped, which
// changes no outcome (10^±1000000 is out of range either way) and keeps the
// arithmetic small.
const maxExponent = 1_000_000

// scanQuantity parses s by the grammar; the error says what is wrong.
func scanQuantity(s string) (scannedQuantity, error) {
	var q scannedQuantity
	if s == "" {
		return q, errors.New("empty")
	}
	i := 0
	if s[0] == '+' || s[0] == '-' {
		q.neg = s[0] == '-'
		i++
	}
	digitsAt := func(i int) int {
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i
	}
	j := digitsAt(i)
	whole := s[i:j]
	frac := ""
	if j < len(s) && s[j] == '.' {
		k := digitsAt(j + 1)
		frac = s[j+1 : k]
		j = k
	}
	if whole == "" && frac == "" {
		return q, errors.New("it does not start with a number")
	}
	q.suffix = s[j:]
	exp := int64(0)
	if sh, ok := binarySuffixes[q.suffix]; ok {
		q.shift = sh
	} else if e, ok := decimalSuffixes[q.suffix]; ok {
		exp = e
	} else if c := q.suffix[0]; c == 'e' || c == 'E' {
		e, err := scanExponent(q.suffix[1:])
		if err != nil {
			return q, err
		}
		exp = e
	} else {
		return q, unknownSuffix(q.suffix)
	}
	// Significant digits: no leading zeros, and trailing zeros moved
	// into the exponent.
	d := strings.TrimLeft(whole+frac, "0")
	t := strings.TrimRight(d, "0")
	q.digits = t
	q.exp10 = exp - int64(len(frac)) + int64(len(d)-len(t))
	return q, nil
}

// scanExponent reads the whole number after e or E.
func scanExponent(s string) (int64, error) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" {
		return 0, errors.New("the exponent after e has no digits")
	}
	e := int64(0)
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("the exponent after e must be a whole number (1e3, 5e-1), not %q", s)
		}
		e = min(e*10+int64(s[i]-'0'), maxExponent)
	}
	if neg {
		e = -e
	}
	return e, nil
}

// unknownSuffix explains a suffix the grammar does not have, with the fix
// when it is a likely slip.
func unknownSuffix(suf string) error {
	if t := strings.TrimSpace(suf); t != suf {
		return fmt.Errorf("no space may stand between the number and its suffix %q", t)
	}
	if suf[0] == '.' {
		return errors.New("more than one decimal point")
	}
	// Byte units: GB, GiB, kB, KiB.
	if base := strings.TrimRight(suf, "Bb"); base != suf && base != "" && len(suf)-len(base) == 1 {
		if b, ok := strings.CutSuffix(base, "i"); ok {
			if bin := strings.ToUpper(b) + "i"; binarySuffixes[bin] != 0 {
				return fmt.Errorf("unknown suffix %q: a quantity's suffix has no B (%s is 2^%d)", suf, bin, binarySuffixes[bin])
			}
		} else {
			dec := strings.ToUpper(base)
			if dec == "K" {
				dec = "k"
			}
			if e, ok := decimalSuffixes[dec]; ok && e > 0 {
				bin := strings.ToUpper(dec) + "i"
				return fmt.Errorf("unknown suffix %q: a quantity's suffix has no B (%s is 10^%d, %s is 2^%d)", suf, dec, e, bin, binarySuffixes[bin])
			}
		}
	}
	for bin := range binarySuffixes {
		if strings.EqualFold(bin, suf) {
			return fmt.Errorf("unknown suffix %q: suffixes are case-sensitive (did you mean %s?)", suf, bin)
		}
	}
	if suf == "K" {
		return fmt.Errorf("unknown suffix %q: suffixes are case-sensitive (did you mean k, 10^3, or Ki, 2^10?)", suf)
	}
	return fmt.Errorf("unknown suffix %q (a quantity's suffix is one of Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e3)", suf)
}

// parseQuantity reads v, a Kubernetes quantity, as a whole count of unit
// ("requests", "bytes"): "10Gi", "1k", "1e3", "1.5Gi", "+5", 1048576. An error
// says why v is refused: not a quantity, negative, not a whole number (a
// fraction such as 0.5 or 500m), or too large.
func parseQuantity(v, unit string) (int64, error) {
	s := strings.TrimSpace(v)
	q, err := scanQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%s is not a quantity: %v (%s)", quoteValue(v), err, quantityForms)
	}
	if q.digits == "" {
		return 0, nil // 0, -0, 0.000Ki
	}
	if q.neg {
		return 0, fmt.Errorf("%s is negative: a number of %s is 0 or more", quoteValue(v), unit)
	}
	// Whole? digits (no trailing zero, so not a multiple of 10) × 2^shift
	// / 10^k is whole only if 5^k divides digits, which makes digits odd,
	// so only if 2^k divides 2^shift: k ≤ shift ≤ 60. Then it is whole if
	// 10^k divides (digits mod 10^k) × 2^shift: the last k digits decide.
	if k := max(0, -q.exp10); k > 0 {
		if k > int64(q.shift) {
			return 0, notWhole(v, q, unit)
		}
		tail, _ := new(big.Int).SetString(q.digits[max(0, len(q.digits)-int(k)):], 10)
		tail.Lsh(tail, q.shift)
		if tail.Mod(tail, pow10(k)).Sign() != 0 {
			return 0, notWhole(v, q, unit)
		}
	}
	// The value is at least 10^(len(digits)−1+exp10): from 10^19 on it is
	// past 2^62 whatever the suffix. Below, digits has fewer than 80
	// digits and the arithmetic is small.
	tooLarge := fmt.Errorf("%s is too large: at most %d %s (2^62 − 1)", quoteValue(v), int64(maxQuantity), unit)
	if int64(len(q.digits))+q.exp10 > 19 {
		return 0, tooLarge
	}
	n, _ := new(big.Int).SetString(q.digits, 10)
	n.Lsh(n, q.shift)
	if q.exp10 >= 0 {
		n.Mul(n, pow10(q.exp10))
	} else {
		n.Quo(n, pow10(-q.exp10)) // exact: checked above
	}
	if n.Cmp(big.NewInt(maxQuantity)) > 0 {
		return 0, tooLarge
	}
	return n.Int64(), nil
}

func pow10(k int64) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(k), nil) }

// notWhole is the error for a quantity that is a fraction: it gives the
// value (when it is short to write) and, for the suffixes m, u and n, what
// they are.
func notWhole(v string, q scannedQuantity, unit string) error {
	msg := fmt.Sprintf("%s is not a whole number of %s", quoteValue(v), unit)
	if k := -q.exp10; k <= 30 && len(q.digits) <= 30 {
		num, _ := new(big.Int).SetString(q.digits, 10)
		num.Lsh(num, q.shift)
		val := strings.TrimRight(new(big.Rat).SetFrac(num, pow10(k)).FloatString(int(k)), "0")
		if val != strings.TrimSpace(v) {
			msg = fmt.Sprintf("%s is %s %s, not a whole number", quoteValue(v), val, unit)
		}
	}
	switch q.suffix {
	case "m":
		msg += " (m is milli, a thousandth: a million is M, 2^20 is Mi)"
	case "u":
		msg += " (u is micro, a millionth)"
	case "n":
		msg += " (n is nano, a billionth)"
	}
	return errors.New(msg)
}
