package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

// parser decodes one file and resolves it into a Config. The first problem
// ends the parse: check panics with a configError, which ParseConfig recovers.
type parser struct {
	keys     map[string]*yaml.Node // the key (a list's item) at a path such as "flowControl.priorityBands[1].capacity"
	warnings []string
}

type configError struct{ error }

// at names the field at path ("" for the document) with its line (unwritten:
// that of the nearest enclosing entry).
func (p *parser) at(path string) string {
	up := path
	for p.keys[up] == nil && up != "" {
		up = up[:max(0, strings.LastIndexAny(up, ".["))]
	}
	if k := p.keys[up]; k != nil {
		return fmt.Sprintf("%s (line %d)", cmp.Or(path, "the document"), k.Line)
	}
	return cmp.Or(path, "the document")
}

// check ends the parse unless ok, with an error naming the field at path.
func (p *parser) check(ok bool, path, format string, args ...any) {
	if !ok {
		panic(configError{fmt.Errorf("proxy: config: %s: %s", p.at(path), fmt.Sprintf(format, args...))})
	}
}

func (p *parser) warn(format string, args ...any) {
	p.warnings = append(p.warnings, fmt.Sprintf(format, args...))
}

// decode decodes n, the node at path, into v with yaml. yaml names a problem
// by its line only, so walk first checks n beside v's type, recording each
// key's node by path, and fails at the first entry yaml would refuse or read
// other than as written, or whose value is outside its field's range (tag in).
func (p *parser) decode(n *yaml.Node, path string, v any) {
	if n.Kind == 0 {
		return
	}
	p.walk(n, path, reflect.TypeOf(v).Elem(), "")
	err := n.Decode(v)
	p.check(err == nil, path, "%v", err) // not reached: walk refuses what yaml does
}

// walk checks n, to be decoded into a value of type t in the range in (of
// its elements for a map or a list).
func (p *parser) walk(n *yaml.Node, path string, t reflect.Type, in string) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		p.keys[path] = n
		n = n.Content[0]
	}
	p.check(n.Kind != yaml.AliasNode, path, "an alias (*%s): not supported, write the value out", n.Value)
	if t == reflect.TypeFor[yaml.Node]() || n.ShortTag() == "!!null" {
		return // read later; null is the zero value
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		p.check(n.Kind == yaml.MappingNode, path, "must be a mapping (key: value), not %s", describeNode(n))
		fields := map[string]reflect.StructField{}
		if t.Kind() == reflect.Struct {
			yamlFields(t, fields)
		}
		first := map[any]int{} // key → the line it was first written on
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			at := strings.TrimPrefix(path+"."+k.Value, ".")
			p.keys[at] = k
			p.check(k.ShortTag() != "!!merge", at, "a merge key: not supported, write the keys out")
			var key any = k.Value
			ft, fin := fields[k.Value].Type, fields[k.Value].Tag.Get("in")
			if t.Kind() == reflect.Map {
				key, ft, fin = p.scalar(k, at, t.Key(), ""), t.Elem(), in
			}
			p.check(ft != nil, at, "unknown field")
			line, dup := first[key]
			p.check(!dup, at, "written twice (first at line %d): give it once", line)
			first[key] = k.Line
			p.walk(v, at, ft, fin)
		}
	case reflect.Slice:
		p.check(n.Kind == yaml.SequenceNode, path, "must be a list (one \"- \" item per line, or [a, b]), not %s", describeNode(n))
		for i, c := range n.Content {
			at := fmt.Sprintf("%s[%d]", path, i)
			p.keys[at] = c
			p.walk(c, at, t.Elem(), in)
		}
	default:
		p.scalar(n, path, t, in)
	}
}

// scalar checks a leaf by decoding it alone into a value of type t, in the
// range in if given ("(0, 1]", "[1ms, 1h]"), and returns the value.
func (p *parser) scalar(n *yaml.Node, path string, t reflect.Type, in string) any {
	isInt := t.Kind() == reflect.Int
	what := map[reflect.Kind]string{reflect.Int: "a whole number", reflect.Float64: "a number",
		reflect.Bool: "true or false", reflect.String: "a single value (a name or a string)"}[t.Kind()]
	if t == reflect.TypeFor[time.Duration]() {
		what = `a duration (such as "250ms" or "30s")`
	}
	p.check(n.Kind == yaml.ScalarNode, path, "must be %s, not %s", what, describeNode(n))
	v := reflect.New(t).Elem()
	err := n.Decode(v.Addr().Interface())
	_, ierr := strconv.ParseInt(n.Value, 0, 64)
	p.check(!isInt || !errors.Is(ierr, strconv.ErrRange), path, "%s is out of range for %s", quoteValue(n.Value), what)
	// yaml truncates a fraction into a whole number (2.5 reads as 2).
	f, ferr := strconv.ParseFloat(n.Value, 64)
	whole := !isInt || n.ShortTag() != "!!float" || ferr == nil && f == math.Trunc(f)
	p.check(err == nil && whole, path, "%s is not %s", quoteValue(n.Value), what)
	if in != "" {
		x := v.Convert(reflect.TypeFor[float64]()).Float()
		p.check(inRange(x, in), path, "must be in %s, got %v", in, v.Interface())
	}
	return v.Interface()
}

// inRange reports whether x is in the interval r.
func inRange(x float64, r string) bool {
	bound := func(s string) float64 {
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f
		}
		d, _ := time.ParseDuration(s)
		return float64(d)
	}
	lo, hi, _ := strings.Cut(r[1:len(r)-1], ", ")
	return (x > bound(lo) || r[0] == '[' && x == bound(lo)) && (x < bound(hi) || r[len(r)-1] == ']' && x == bound(hi))
}

// yamlFields records the field of each key of struct type t, as yaml names
// them (an ",inline" struct's keys in its place).
func yamlFields(t reflect.Type, fields map[string]reflect.StructField) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			yamlFields(f.Type, fields)
		} else if f.IsExported() {
			fields[name] = f
		}
	}
}

// describeNode says what was written, in YAML's terms.
func describeNode(n *yaml.Node) string {
	return cmp.Or(map[yaml.Kind]string{yaml.MappingNode: "a mapping (key: value)", yaml.SequenceNode: "a list"}[n.Kind], quoteValue(n.Value))
}

// quoteValue quotes a value as written, cut after 40 runes.
func quoteValue(s string) string {
	if r := []rune(s); len(r) > 40 {
		return strconv.Quote(string(r[:40])) + "…"
	}
	return strconv.Quote(s)
}

// syntaxError rewrites yaml's "yaml: line N: ..." for a document that is not
// YAML as "line N: not valid YAML: ...".
func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if line, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(line, "line ") {
		return fmt.Errorf("proxy: config: %s: not valid YAML: %s", line, rest)
	}
	return fmt.Errorf("proxy: config: not valid YAML: %s", msg)
}

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

// quantity reads an optional quantity node at path (a maxRequests, a count
// of requests, or a maxBytes, of bytes); nil if absent.
func (p *parser) quantity(n *yaml.Node, path string) *int64 {
	if n.Kind == 0 {
		return nil
	}
	p.check(n.Kind == yaml.ScalarNode, path, "must be a quantity such as 500, \"1k\" or \"10Gi\", not %s", describeNode(n))
	unit := "requests"
	if strings.HasSuffix(path, "maxBytes") {
		unit = "bytes"
	}
	v, err := parseQuantity(n.Value, unit)
	p.check(err == nil, path, "%v", err)
	return &v
}
