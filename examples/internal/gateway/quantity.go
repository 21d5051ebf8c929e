package gateway

import (
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// Kubernetes quantities (resource.Quantity), as llm-d writes maxRequests and
// maxBytes: a signed decimal number, then an exponent (e3, E-2) or a suffix
// (Ki Mi Gi Ti Pi Ei, n u m k M G T P E: "1E" is 10^18, "1E3" 1000).
var quantitySyntax = regexp.MustCompile(`^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$`)

// quantitySuffixes are the suffixes as exponents big.Rat reads (p: of 2).
var quantitySuffixes = map[string]string{"Ki": "p10", "Mi": "p20", "Gi": "p30", "Ti": "p40", "Pi": "p50", "Ei": "p60",
	"n": "e-9", "u": "e-6", "m": "e-3", "k": "e3", "M": "e6", "G": "e9", "T": "e12", "P": "e15", "E": "e18"}

// maxQuantity bounds a count: 2^62 − 1 (a budget of 4 EiB).
const maxQuantity = 1<<62 - 1

// parseQuantity reads v, a Kubernetes quantity with surrounding spaces, as a
// whole count of unit ("requests", "bytes"). Unlike resource.ParseQuantity,
// which rounds up to a nano unit and caps at 2^63−1, it takes the exact value
// and refuses one that is negative, a fraction (0.5, 500m) or 2^62 or more.
func parseQuantity(v, unit string) (int64, error) {
	m := quantitySyntax.FindStringSubmatch(strings.TrimSpace(v))
	if m == nil {
		return 0, fmt.Errorf("%s is not a quantity: quantities are written like 500, 1k, 1e3, 1.5Gi or 512Mi", quoteValue(v))
	}
	exp := quantitySuffixes[m[3]]
	if m[2] != "" {
		// Past ±(digits + 20), any non-zero value is too large or a fraction.
		e, _ := strconv.ParseInt(m[2], 10, 64) // out of range: ±(2^63−1)
		lim := int64(len(m[1]) + 20)
		exp = fmt.Sprintf("e%d", max(-lim, min(e, lim)))
	}
	r, _ := new(big.Rat).SetString(m[1] + exp)
	switch {
	case r.Sign() < 0:
		return 0, fmt.Errorf("%s is negative: a number of %s is 0 or more", quoteValue(v), unit)
	case !r.IsInt():
		return 0, fmt.Errorf("%s is not a whole number of %s", quoteValue(v), unit)
	case r.Num().Cmp(big.NewInt(maxQuantity)) > 0:
		return 0, fmt.Errorf("%s is too large: at most %d %s (2^62 − 1)", quoteValue(v), int64(maxQuantity), unit)
	}
	return r.Num().Int64(), nil
}
