package gateway

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

// Decoding a config file in the file's own terms. yaml reports a value of the
// wrong type as "line 12: cannot unmarshal !!str `80%` into float64": a Go
// type, a YAML tag and a value cut to 7 bytes. parser.decode first walks the
// node beside the Go type it decodes into and reports, for each entry that
// does not fit, its key path, its line, the value as written and what the
// field takes:
//
//	flowControl.priorityBands[1].priority (line 12): "high" is not a whole number
//
// Each scalar is checked by decoding it alone into its field's type, so the
// walk accepts what yaml accepts; yaml then decodes the node. The walk keeps
// each key's node by path, which is where the checks after decoding take a
// field's line from.

// parser decodes one file and resolves it into a Config. A problem ends the
// parse: fail panics with a configError, which ParseConfig recovers.
type parser struct {
	keys     map[string]*yaml.Node // the key (a list's item) at a path such as "flowControl.priorityBands[1].capacity"
	problems []string
	// seen: anchors walked through an alias, by the type they were walked
	// as, so that an alias bomb (refused by the decoder) is walked once.
	seen     map[aliasUse]bool
	warnings []string
}

type aliasUse struct {
	n *yaml.Node
	t reflect.Type
}

type configError struct{ error }

// maxProblems bounds what one decode error lists.
const maxProblems = 8

var (
	nodeType     = reflect.TypeFor[yaml.Node]()
	durationType = reflect.TypeFor[time.Duration]()
)

// at names the field at path, with its line when it was written.
func (p *parser) at(path string) string {
	if k := p.keys[path]; k != nil {
		return fmt.Sprintf("%s (line %d)", path, k.Line)
	}
	return path
}

// fail ends the parse with an error naming the field at path.
func (p *parser) fail(path, format string, args ...any) {
	panic(configError{fmt.Errorf("proxy: config: %s: %s", p.at(path), fmt.Sprintf(format, args...))})
}

// check fails unless ok.
func (p *parser) check(ok bool, path, format string, args ...any) {
	if !ok {
		p.fail(path, format, args...)
	}
}

func (p *parser) warn(format string, args ...any) {
	p.warnings = append(p.warnings, fmt.Sprintf(format, args...))
}

func (p *parser) add(path string, line int, format string, args ...any) {
	if len(p.problems) < maxProblems {
		p.problems = append(p.problems, fmt.Sprintf("%s (line %d): %s", pathOr(path), line, fmt.Sprintf(format, args...)))
	}
}

// decode decodes n, the node at path ("" for the document), into v; it fails
// listing every entry that does not fit (unknown keys, keys written twice,
// values of the wrong type, a fraction for a whole number), in file order.
func (p *parser) decode(n *yaml.Node, path string, v any) {
	if n.Kind == 0 {
		return
	}
	p.walk(n, path, reflect.TypeOf(v))
	if len(p.problems) > 0 {
		if len(p.problems) == maxProblems {
			p.problems = append(p.problems, "…")
		}
		panic(configError{fmt.Errorf("proxy: config: %s", strings.Join(p.problems, "; "))})
	}
	if err := n.Decode(v); err != nil {
		// The walk did not foresee it (an alias bomb): yaml's words.
		panic(configError{fmt.Errorf("proxy: config: %s: %w", pathOr(path), err)})
	}
}

// walk checks n, to be decoded into a value of type t, and records its keys.
func (p *parser) walk(n *yaml.Node, path string, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case 0:
		return
	case yaml.DocumentNode:
		for _, c := range n.Content {
			p.walk(c, path, t)
		}
		return
	case yaml.AliasNode:
		if n.Alias == nil || p.seen[aliasUse{n.Alias, t}] {
			return
		}
		p.seen[aliasUse{n.Alias, t}] = true
		n = n.Alias
	}
	if t == nodeType || t.Kind() == reflect.Interface || n.ShortTag() == "!!null" {
		return // anything goes; null is the zero value
	}
	switch k := t.Kind(); {
	case k == reflect.Struct || k == reflect.Map:
		if n.Kind != yaml.MappingNode {
			what := "a mapping (key: value)"
			if k == reflect.Struct {
				what = "a mapping of keys (key: value)"
			}
			p.add(path, n.Line, "must be %s, not %s", what, describeNode(n))
			return
		}
		types := map[string]reflect.Type{}
		var names []string
		if k == reflect.Struct {
			names = yamlFields(t, types)
		}
		p.entries(n, path, func(key, v *yaml.Node) {
			at := joinPath(path, key.Value)
			p.keys[at] = key
			if k == reflect.Map {
				p.walk(v, at, t.Elem())
			} else if ft, ok := types[key.Value]; ok {
				p.walk(v, at, ft)
			} else {
				p.add(at, key.Line, "%s", unknownField(key.Value, names))
			}
		})
	case k == reflect.Slice || k == reflect.Array:
		if n.Kind != yaml.SequenceNode {
			p.add(path, n.Line, "must be a list (one \"- \" item per line, or [a, b]), not %s", describeNode(n))
			return
		}
		for i, c := range n.Content {
			at := fmt.Sprintf("%s[%d]", path, i)
			p.keys[at] = c
			p.walk(c, at, t.Elem())
		}
	default:
		p.scalar(n, path, t)
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func pathOr(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}

// entries visits a mapping's entries, then the merged ones ("<<: *base") no
// key of the mapping overrides, and reports keys written twice, which yaml
// refuses.
func (p *parser) entries(n *yaml.Node, path string, visit func(k, v *yaml.Node)) {
	first := map[string]int{} // key → index of its first occurrence; -1 merged
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			p.add(path, k.Line, "a key must be a name, not %s", describeNode(k))
		} else if j, dup := first[k.Value]; dup {
			p.add(joinPath(path, k.Value), k.Line, "written twice (first at line %d): give it once", n.Content[j].Line)
		} else {
			first[k.Value] = i
		}
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if j, ok := first[k.Value]; !ok || j != i || k.Kind != yaml.ScalarNode {
			continue
		}
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
		} else {
			visit(k, v)
		}
	}
	for _, m := range merges {
		m = resolveAlias(m)
		bases := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			bases = m.Content
		}
		for _, b := range bases {
			if b = resolveAlias(b); b.Kind != yaml.MappingNode {
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

func resolveAlias(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// scalar checks a leaf: a string, number, boolean or duration.
func (p *parser) scalar(n *yaml.Node, path string, t reflect.Type) {
	what := scalarWhat(t)
	if n.Kind != yaml.ScalarNode {
		p.add(path, n.Line, "must be %s, not %s", what, describeNode(n))
		return
	}
	v := quoteValue(n.Value)
	isInt := t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 && t != durationType
	f, ferr := strconv.ParseFloat(n.Value, 64)
	if err := n.Decode(reflect.New(t).Interface()); err == nil {
		// yaml truncates a float into an integer field (2.5 reads as 2).
		if isInt && n.ShortTag() == "!!float" && ferr == nil && f != math.Trunc(f) {
			p.add(path, n.Line, "%s is not %s", v, what)
		}
		return
	}
	switch {
	case t == durationType && ferr == nil:
		p.add(path, n.Line, "%s is not a duration: it needs a unit, such as \"%sms\" or \"%ss\"", v, n.Value, n.Value)
	case t == durationType:
		p.add(path, n.Line, "%s is not a duration (durations are written like \"250ms\", \"30s\" or \"1m\")", v)
	case isInt && ferr == nil && finite(f) && f == math.Trunc(f):
		p.add(path, n.Line, "%s is out of range for %s", v, what)
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
	switch k := t.Kind(); {
	case t == durationType:
		return "a duration (such as \"250ms\" or \"30s\")"
	case k >= reflect.Int && k <= reflect.Uint64:
		return "a whole number"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	case k == reflect.Bool:
		return "true or false"
	case k == reflect.String:
		return "a single value (a name or a string)"
	}
	return "a " + t.Kind().String()
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

// yamlFields lists a struct's keys as yaml names them (the tag's name, or the
// field's name lowercased; an ",inline" struct's keys in its place), in
// declaration order, and records each key's type in types.
func yamlFields(t reflect.Type, types map[string]reflect.Type) (names []string) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			names = append(names, yamlFields(f.Type, types)...)
		} else if f.IsExported() && name != "-" {
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			names = append(names, name)
			types[name] = f.Type
		}
	}
	return names
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
		if d := editDistance(strings.ToLower(key), strings.ToLower(v)); v != key && d < bestD {
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
	prev2, prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1), make([]int, len(rb)+1)
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

// syntaxError rewrites yaml's "yaml: line N: ..." for a document that is not
// YAML as "line N: not valid YAML: ...", with the likely cause when the line
// is indented with a tab.
func syntaxError(err error, data []byte) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	rest, ok := strings.CutPrefix(msg, "line ")
	n, tail, ok2 := strings.Cut(rest, ": ")
	line, err := strconv.Atoi(n)
	if !ok || !ok2 || err != nil || line <= 0 {
		return fmt.Errorf("proxy: config: not valid YAML: %s", msg)
	}
	if lines := bytes.Split(data, []byte("\n")); line <= len(lines) {
		l := lines[line-1]
		if bytes.IndexByte(l[:len(l)-len(bytes.TrimLeft(l, " \t"))], '\t') >= 0 {
			tail += " (the line is indented with a tab: YAML indents with spaces)"
		}
	}
	return fmt.Errorf("proxy: config: line %d: not valid YAML: %s", line, tail)
}
