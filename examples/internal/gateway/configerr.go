package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

// Decode errors in the file's own terms. yaml reports a value of the wrong
// type as "line 12: cannot unmarshal !!str `80%` into float64": a Go type, a
// YAML tag and a value cut to 7 bytes. When decoding fails, explainDecode
// walks the document beside the Go type it was decoded into and says, for
// each entry that does not fit, its key path, its line, the value as written
// and what the field takes:
//
//	flowControl.priorityBands[1].priority (line 12): "high" is not a whole number
//
// Each scalar is checked by decoding it alone into its field's type, so the
// walk accepts exactly what yaml accepts.

var (
	yamlNodeType = reflect.TypeFor[yaml.Node]()
	durationType = reflect.TypeFor[time.Duration]()
)

// decodeProblems collects the messages of a walk.
type decodeProblems struct {
	msgs []string
	// seen: anchors already walked through an alias, with the type they
	// were walked as, so that an alias bomb (refused by the decoder) is not
	// expanded by the walk.
	seen map[aliasUse]bool
}

type aliasUse struct {
	n *yaml.Node
	t reflect.Type
}

// maxDecodeProblems bounds what one error lists.
const maxDecodeProblems = 8

func (p *decodeProblems) add(path string, line int, format string, args ...any) {
	if len(p.msgs) < maxDecodeProblems {
		p.msgs = append(p.msgs, fmt.Sprintf("%s (line %d): %s", path, line, fmt.Sprintf(format, args...)))
	}
}

// explainDecode walks n, decoded into a value of type t, reporting at path
// (the path of n itself; "" for the document).
func explainDecode(n *yaml.Node, path string, t reflect.Type, p *decodeProblems) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == 0 {
		return // an empty document
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			explainDecode(c, path, t, p)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || p.seen[aliasUse{n.Alias, t}] {
			return
		}
		p.seen[aliasUse{n.Alias, t}] = true
		n = n.Alias
	}
	if t == yamlNodeType || t.Kind() == reflect.Interface || isNull(n) {
		return // anything goes; null is the zero value
	}
	at := func(key string) string {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			p.add(pathOr(path), n.Line, "must be a mapping of keys (key: value), not %s", describeNode(n))
			return
		}
		fields := yamlFields(t)
		names := make([]string, len(fields))
		for i, f := range fields {
			names[i] = f.name
		}
		forEachEntry(n, p, path, func(k, v *yaml.Node) {
			f, ok := fieldNamed(fields, k.Value)
			if !ok {
				p.add(at(k.Value), k.Line, "%s", unknownField(k.Value, names))
				return
			}
			explainDecode(v, at(k.Value), f.typ, p)
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			p.add(pathOr(path), n.Line, "must be a mapping (key: value), not %s", describeNode(n))
			return
		}
		forEachEntry(n, p, path, func(k, v *yaml.Node) { explainDecode(v, at(k.Value), t.Elem(), p) })
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			p.add(pathOr(path), n.Line, "must be a list (one \"- \" item per line, or [a, b]), not %s", describeNode(n))
			return
		}
		for i, c := range n.Content {
			explainDecode(c, fmt.Sprintf("%s[%d]", path, i), t.Elem(), p)
		}
	default:
		explainScalar(n, pathOr(path), t, p)
	}
}

func pathOr(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}

// forEachEntry visits a mapping's entries, the merged ones ("<<: *base")
// that no key of the mapping overrides included, and reports duplicate
// keys as yaml refuses them.
func forEachEntry(n *yaml.Node, p *decodeProblems, path string, visit func(k, v *yaml.Node)) {
	first := map[string]int{} // key → index of its first occurrence
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			p.add(pathOr(path), k.Line, "a key must be a name, not %s", describeNode(k))
			continue
		}
		if j, dup := first[k.Value]; dup {
			key := k.Value
			if path != "" {
				key = path + "." + key
			}
			p.add(key, k.Line, "written twice (first at line %d): give it once", n.Content[j].Line)
			continue
		}
		first[k.Value] = i
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if j, ok := first[k.Value]; !ok || j != i || k.Kind != yaml.ScalarNode {
			continue
		}
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		visit(k, v)
	}
	for _, m := range merges {
		if m.Kind == yaml.AliasNode && m.Alias != nil {
			m = m.Alias
		}
		bases := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			bases = m.Content
		}
		for _, b := range bases {
			if b.Kind == yaml.AliasNode && b.Alias != nil {
				b = b.Alias
			}
			if b.Kind != yaml.MappingNode {
				continue // yaml refuses it with its own message
			}
			for i := 0; i+1 < len(b.Content); i += 2 {
				if k := b.Content[i]; k.Kind == yaml.ScalarNode {
					if _, own := first[k.Value]; !own {
						first[k.Value] = -1
						visit(k, b.Content[i+1])
					}
				}
			}
		}
	}
}

// explainScalar checks a leaf: a string, number, boolean or duration.
func explainScalar(n *yaml.Node, path string, t reflect.Type, p *decodeProblems) {
	what := scalarWhat(t)
	if n.Kind != yaml.ScalarNode {
		p.add(path, n.Line, "must be %s, not %s", what, describeNode(n))
		return
	}
	v := quoteValue(n.Value)
	isInt := t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 && t != durationType
	if err := n.Decode(reflect.New(t).Interface()); err == nil {
		// yaml truncates a float into an integer field (2.5 reads
		// as 2): refuse a fraction.
		if f, err := strconv.ParseFloat(n.Value, 64); isInt && n.ShortTag() == "!!float" && err == nil && f != math.Trunc(f) {
			p.add(path, n.Line, "%s is not %s", v, what)
		}
		return
	}
	switch {
	case t == durationType:
		if _, err := strconv.ParseFloat(n.Value, 64); err == nil {
			p.add(path, n.Line, "%s is not a duration: it needs a unit, such as \"%sms\" or \"%ss\"", v, n.Value, n.Value)
		} else {
			p.add(path, n.Line, "%s is not a duration (durations are written like \"250ms\", \"30s\" or \"1m\")", v)
		}
	case isInt:
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil && finite(f) && f == math.Trunc(f) {
			p.add(path, n.Line, "%s is out of range for %s", v, what)
		} else {
			p.add(path, n.Line, "%s is not %s", v, what)
		}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		hint := ""
		if s, ok := strings.CutSuffix(strings.TrimSpace(n.Value), "%"); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil && finite(f) {
				hint = fmt.Sprintf(" (a percentage is written as a fraction: %v for %s%%)", f/100, s)
			}
		}
		p.add(path, n.Line, "%s is not a number%s", v, hint)
	default:
		p.add(path, n.Line, "%s is not %s", v, what)
	}
}

// scalarWhat names what a field of type t takes.
func scalarWhat(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration (such as \"250ms\" or \"30s\")"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.String:
		return "a single value (a name or a string)"
	}
	return "a " + t.Kind().String()
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describeNode says what was written, in YAML's terms.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping (key: value)"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return quoteValue(n.Value)
}

// quoteValue quotes a value as written, cut when long.
func quoteValue(s string) string {
	const max = 40
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "…"
	}
	return strconv.Quote(s)
}

type yamlField struct {
	name string
	typ  reflect.Type
}

// yamlFields lists a struct's keys as yaml names them (the tag's name, or the
// field's name lowercased), in declaration order.
func yamlFields(t reflect.Type) []yamlField {
	var out []yamlField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out = append(out, yamlField{name, f.Type})
	}
	return out
}

func fieldNamed(fields []yamlField, name string) (yamlField, bool) {
	for _, f := range fields {
		if f.name == name {
			return f, true
		}
	}
	return yamlField{}, false
}

// unknownField is the message for a key that is not one of valid.
func unknownField(key string, valid []string) string {
	if s := nearestKey(key, valid); s != "" {
		return fmt.Sprintf("unknown field (did you mean %s?)", s)
	}
	return "unknown field"
}

// nearestKey returns the key of valid closest to key when it is close enough
// to be a misspelling of it, or "": the edit distance between the two,
// ignoring case, is at most a quarter of key's length (and at least 1).
// Ties go to the earlier key of valid.
func nearestKey(key string, valid []string) string {
	limit := max(1, utf8.RuneCountInString(key)/4)
	best, bestD := "", limit+1
	for _, v := range valid {
		if v == key {
			continue
		}
		if d := editDistance(strings.ToLower(key), strings.ToLower(v)); d < bestD {
			best, bestD = v, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the fewest insertions, deletions, substitutions of one rune, or swaps of two
// adjacent runes, that turn a into b ("capasity" → "capacity" is 1, and so is
// "kvCahce" → "kvCache").
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows: the one before last (for swaps), the last, the current.
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// checkDecode walks n (at path) against the type t it is to be decoded
// into, and returns an error naming, for each entry that does not fit, the
// key path, its line and what is wrong in the file's terms; nil if all fit.
// It runs before yaml decodes, so that it also refuses what yaml would take
// silently: a fraction in a whole-number field.
func checkDecode(n *yaml.Node, path string, t reflect.Type) error {
	p := &decodeProblems{seen: map[aliasUse]bool{}}
	explainDecode(n, path, t, p)
	if len(p.msgs) == 0 {
		return nil
	}
	msg := strings.Join(p.msgs, "; ")
	if len(p.msgs) == maxDecodeProblems {
		msg += "; …"
	}
	return fmt.Errorf("proxy: config: %s", msg)
}

// describeDecodeError wraps an error of yaml's decoder that checkDecode did
// not foresee (it says the same as yaml; this is the net below it).
func describeDecodeError(err error, path string) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return fmt.Errorf("proxy: config: %s: %s", pathOr(path), strings.Join(te.Errors, "; "))
	}
	if path == "" {
		return fmt.Errorf("proxy: config: %w", err)
	}
	return fmt.Errorf("proxy: config: %s: %w", path, err)
}

// describeSyntaxError rewrites yaml's "yaml: line N: ..." for a document that
// is not YAML as "line N: not valid YAML: ...", with the likely cause when
// the line is indented with a tab.
func describeSyntaxError(err error, data []byte) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil && l > 0 {
				line, msg = l, tail
			}
		}
	}
	if line == 0 {
		return fmt.Errorf("proxy: config: not valid YAML: %s", msg)
	}
	if lines := bytes.Split(data, []byte("\n")); line <= len(lines) {
		l := lines[line-1]
		indent := l[:len(l)-len(bytes.TrimLeft(l, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 {
			msg += " (the line is indented with a tab: YAML indents with spaces)"
		}
	}
	return fmt.Errorf("proxy: config: line %d: not valid YAML: %s", line, msg)
}
