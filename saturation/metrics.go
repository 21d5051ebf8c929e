package saturation

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Errors of ParseMetrics, wrapped with detail; branch on them with errors.Is.
var (
	// ErrParse: the body is not valid Prometheus text exposition format.
	ErrParse = errors.New("saturation: unparsable metrics body")
	// ErrMissingMetric: none of the candidate names of a required metric
	// has a usable sample.
	ErrMissingMetric = errors.New("saturation: metric missing")
	// ErrBadValue: a metric's value is NaN, infinite or negative.
	ErrBadValue = errors.New("saturation: bad metric value")
)

// MetricNames maps the quantities the Scorer reads to metric names.
// Each field lists candidate names in order of preference; the first name
// present in a scrape is used (so a renamed metric can fall back to its old
// name). Waiting and KVUsage are required; Running is optional (missing
// reads as 0, which can only enlarge the in-flight credit: fail safe).
type MetricNames struct {
	Waiting []string
	Running []string
	KVUsage []string
	// PromptTokens and OutputTokens are the histograms of finished
	// requests' prompt and output lengths, by base name: their _sum and
	// _count series give Reading.PromptMean and OutputMean (for
	// Scorer.Projection and Scorer.PromptTokenThreshold). Optional: absent, empty or with a bad value, the
	// mean reads 0 (unknown) and the scrape does not fail.
	PromptTokens []string
	OutputTokens []string
	// CacheConfig names the info gauge whose labels num_gpu_blocks and
	// block_size give Reading.KVCapacity (tokens; for ProjectSteady).
	// Optional like the histograms: absent or unparsable, it reads 0.
	CacheConfig []string
}

// VLLM returns the names vLLM exports (the default). kv_cache_usage_perc
// replaced gpu_cache_usage_perc in vLLM 0.10; both are accepted.
func VLLM() MetricNames {
	return MetricNames{
		Waiting: []string{"vllm:num_requests_waiting"},
		Running: []string{"vllm:num_requests_running"},
		KVUsage: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},

		PromptTokens: []string{"vllm:request_prompt_tokens"},
		OutputTokens: []string{"vllm:request_generation_tokens"},
		CacheConfig:  []string{"vllm:cache_config_info"},
	}
}

// SGLang returns the names SGLang exports.
func SGLang() MetricNames {
	return MetricNames{
		Waiting: []string{"sglang:num_queue_reqs"},
		Running: []string{"sglang:num_running_reqs"},
		KVUsage: []string{"sglang:token_usage"},
	}
}

// ParseMetrics reads a /metrics body and returns the pod's Reading with OK
// true and At zero (the caller stamps the time). It accepts the Prometheus
// text exposition format and OpenMetrics 1.0 text, leniently: a UTF-8 byte
// order mark, CRLF line ends, "# EOF", exemplars, sample timestamps, and
// families of any type (info, stateset, gaugehistogram, unknown, _created
// series) that are not read. Only the lines of the candidate metrics are
// parsed (by expfmt's text parser); every other line is only checked to
// begin like exposition text (a comment, a metric name or a quoted name), so
// a page that is not exposition text at all (HTML, binary) fails, while one
// malformed or unfamiliar family elsewhere on the page does not hide the
// metrics the scorer needs.
//
// For each quantity the first candidate name present is used; several series
// of it (label sets: engines, models) are combined:
//
//	Waiting, Running   sum over the series (requests queued on any engine)
//	KVUsage            maximum over the series (the fullest engine)
//
// Samples count when their family is typed gauge, counter, untyped or
// unknown (or not typed at all); a family of another type (histogram,
// summary, info, ...) under a candidate name counts as absent. Effects of
// bad input:
//
//	not exposition text, or a bad line of a
//	candidate metric                         -> ErrParse
//	Waiting or KVUsage absent (all names)    -> ErrMissingMetric
//	Running absent                           -> Running = 0 (no error)
//	PromptTokens or OutputTokens absent, or
//	a bad value in their _sum or _count      -> that mean 0 (no error)
//	a used sample NaN, ±Inf or negative      -> ErrBadValue
//
// Any error means the scrape failed; see PollerConfig.FailFast for what a
// failed scrape does to the pod's score.
func ParseMetrics(body io.Reader, names MetricNames) (Reading, error) {
	if err := names.validate(); err != nil {
		return Reading{}, err
	}
	f := filters.Get().(*filter)
	defer f.release()
	text, err := f.run(body, names)
	if err != nil {
		return Reading{}, fmt.Errorf("%w: %w", ErrParse, err)
	}
	// UTF8Validation accepts every legal name, including the legacy
	// scheme's colon names (vllm:...) and quoted UTF-8 names.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Reading{}, fmt.Errorf("%w: %w", ErrParse, err)
	}
	var r Reading
	var found bool
	if r.Waiting, found, err = pick(fams, names.Waiting, false); err != nil {
		return Reading{}, err
	} else if !found {
		return Reading{}, fmt.Errorf("%w: none of %q", ErrMissingMetric, names.Waiting)
	}
	if r.KVUsage, found, err = pick(fams, names.KVUsage, true); err != nil {
		return Reading{}, err
	} else if !found {
		return Reading{}, fmt.Errorf("%w: none of %q", ErrMissingMetric, names.KVUsage)
	}
	if r.Running, _, err = pick(fams, names.Running, false); err != nil {
		return Reading{}, err
	}
	r.PromptMean = histogramMean(fams, names.PromptTokens)
	r.OutputMean = histogramMean(fams, names.OutputTokens)
	r.KVCapacity = cacheCapacity(fams, names.CacheConfig)
	r.OK = true
	return r, nil
}

// A filter turns a /metrics page into a small text-format page holding only
// the samples of the candidate metrics, which expfmt's TextParser then
// parses. Why not hand the whole page to expfmt: its text parser fails the
// whole page on one OpenMetrics construct (an exemplar, an info type, a
// float timestamp), on CRLF and on a BOM, and it builds every family of a
// page that is mostly histograms the scorer never reads (a 4 MiB page took
// longer than a scrape timeout); its OpenMetrics decoder is strict (it
// requires "# EOF", refuses CRLF) and documented as not meant for
// performance. So the filter does only what neither accepts, line by line:
// it drops the BOM, the CR of CRLF, comments, timestamps and exemplars, and
// the lines of other families, and leaves the parsing of names, labels and
// values to expfmt.
type filter struct {
	br      *bufio.Reader
	long    []byte   // a line longer than br's buffer, assembled
	out     []byte   // the filtered page
	samples [][]byte // per wanted name, its sample lines
	wanted  []string
	typ     []string // per wanted name, its TYPE ("" when untyped)
}

var filters = sync.Pool{New: func() any { return &filter{br: bufio.NewReaderSize(nil, 64<<10)} }}

// release returns f to the pool unless it grew large (a one-off huge page
// must not pin its buffers for the process's life).
func (f *filter) release() {
	f.br.Reset(nil)
	if cap(f.long) > 1<<20 || cap(f.out) > 1<<20 {
		return
	}
	filters.Put(f)
}

func (f *filter) run(body io.Reader, names MetricNames) ([]byte, error) {
	f.br.Reset(body)
	f.wanted, f.typ = f.wanted[:0], f.typ[:0]
	want := func(n string) {
		if f.index(n) < 0 {
			f.wanted = append(f.wanted, n)
			f.typ = append(f.typ, "")
		}
	}
	for _, list := range [][]string{names.Waiting, names.Running, names.KVUsage, names.CacheConfig} {
		for _, n := range list {
			want(n)
		}
	}
	// A histogram's _sum and _count lines carry no TYPE of their own, so
	// they reach expfmt as untyped families of those names.
	for _, list := range [][]string{names.PromptTokens, names.OutputTokens} {
		for _, n := range list {
			want(n + "_sum")
			want(n + "_count")
		}
	}
	for len(f.samples) < len(f.wanted) {
		f.samples = append(f.samples, nil)
	}
	for i := range f.samples {
		f.samples[i] = f.samples[i][:0]
	}
	for lineNo := 1; ; lineNo++ {
		line, err := f.readLine()
		if len(line) == 0 && err != nil {
			if err == io.EOF {
				break
			}
			return nil, err
		}
		if lineNo == 1 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf")) // UTF-8 BOM
		}
		if err := f.line(line, lineNo); err != nil {
			return nil, err
		}
		if err != nil {
			if err == io.EOF {
				break
			}
			return nil, err
		}
	}
	f.out = f.out[:0]
	for i := range f.wanted {
		switch f.typ[i] {
		case "", "gauge", "counter", "untyped", "unknown":
			f.out = append(f.out, f.samples[i]...)
		}
		// Any other type: the family counts as absent (see ParseMetrics).
	}
	return f.out, nil
}

// readLine returns the next line without its LF or CRLF; err is io.EOF at
// the end (with the last, unterminated line, if any).
func (f *filter) readLine() ([]byte, error) {
	line, err := f.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		f.long = append(f.long[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = f.br.ReadSlice('\n')
			f.long = append(f.long, line...)
		}
		line = f.long
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	return line, err
}

func (f *filter) index(name string) int {
	for i, w := range f.wanted {
		if w == name {
			return i
		}
	}
	return -1
}

// indexBytes is index without converting name to a string (a comparison
// string(b) == s does not allocate; a call argument string(b) would, once
// per line of the page).
func (f *filter) indexBytes(name []byte) int {
	for i, w := range f.wanted {
		if string(name) == w {
			return i
		}
	}
	return -1
}

// line files one line: a TYPE comment of a wanted name records its type, a
// sample of a wanted name is kept as "name{labels} value", anything else is
// dropped once it is seen to begin like exposition text.
func (f *filter) line(line []byte, lineNo int) error {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 {
		return nil
	}
	if line[0] == '#' {
		// "# TYPE name type"; HELP, UNIT, EOF and other comments are
		// not needed.
		rest, ok := bytes.CutPrefix(bytes.TrimLeft(line[1:], " \t"), []byte("TYPE"))
		if !ok || len(rest) == 0 || rest[0] != ' ' && rest[0] != '\t' {
			return nil
		}
		name, typ := field(rest)
		typ, _ = field(typ)
		if len(name) == 0 || len(typ) == 0 {
			return nil
		}
		i := -1
		if name[0] == '"' {
			if s, err := strconv.Unquote(string(name)); err == nil {
				i = f.index(s)
			}
		} else {
			i = f.indexBytes(name)
		}
		if i >= 0 && f.typ[i] == "" {
			f.typ[i] = string(typ)
		}
		return nil
	}
	name, rest, ok := sampleName(line)
	if !ok {
		return fmt.Errorf("line %d does not begin like a sample: %.40q", lineNo, line)
	}
	i := f.indexBytes(name)
	if i < 0 {
		return nil
	}
	// rest is what follows the name and the label set: the value, then an
	// optional timestamp and an optional exemplar ("# {...} v ts"), none
	// of which the scorer reads. Keep the value only.
	head := line[:len(line)-len(rest)]
	value, _ := field(rest)
	if len(value) == 0 {
		value = rest // nothing there: expfmt reports the missing value
	}
	s := append(f.samples[i], head...)
	s = append(s, ' ')
	s = append(s, value...)
	f.samples[i] = append(s, '\n')
	return nil
}

// sampleName splits a sample line into its metric name and what follows the
// name and its label set. A line that does not begin like a sample (a name
// character, '{' or a quoted name) is not ok. A label set that never closes leaves
// rest empty: expfmt reports the truncated line.
func sampleName(line []byte) (name, rest []byte, ok bool) {
	c := line[0]
	switch {
	case c == '{':
		// A quoted UTF-8 name: {"name", labels...} v
		end := labelSetEnd(line)
		inner := bytes.TrimLeft(line[1:], " \t")
		if len(inner) == 0 || inner[0] != '"' {
			return nil, nil, false
		}
		q := quotedEnd(inner)
		if q < 0 {
			return nil, nil, true // truncated: let expfmt say so
		}
		s, err := strconv.Unquote(string(inner[:q]))
		if err != nil {
			return nil, nil, true
		}
		if end < 0 {
			return []byte(s), nil, true
		}
		return []byte(s), line[end:], true
	case c == '"':
		// A quoted name before the label set: "name"{labels} v
		q := quotedEnd(line)
		if q < 0 {
			return nil, nil, true // truncated: let expfmt say so
		}
		s, err := strconv.Unquote(string(line[:q]))
		if err != nil {
			return nil, nil, true
		}
		j := q
		for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
			j++
		}
		if j == len(line) || line[j] != '{' {
			return []byte(s), line[q:], true
		}
		end := labelSetEnd(line[j:])
		if end < 0 {
			return []byte(s), nil, true
		}
		return []byte(s), line[j+end:], true
	case isNameByte(c) && !('0' <= c && c <= '9'):
		// The name ends at the first byte that cannot continue it, as in
		// expfmt ("name+Inf" is the sample name with the value +Inf).
		n := 1
		for n < len(line) && isNameByte(line[n]) {
			n++
		}
		if n == len(line) {
			return line, nil, true
		}
		name := line[:n]
		// The text format allows blanks between a name and its labels.
		j := n
		for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
			j++
		}
		if j == len(line) || line[j] != '{' {
			return name, line[n:], true
		}
		end := labelSetEnd(line[j:])
		if end < 0 {
			return name, nil, true
		}
		return name, line[j+end:], true
	}
	return nil, nil, false
}

// isNameByte: a byte of a legacy metric name, [a-zA-Z0-9_:].
func isNameByte(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// field returns the first blank-separated field of s and what follows it.
func field(s []byte) (f, rest []byte) {
	s = bytes.TrimLeft(s, " \t")
	n := bytes.IndexAny(s, " \t")
	if n < 0 {
		return s, nil
	}
	return s[:n], s[n:]
}

// labelSetEnd returns the index just past the '}' closing the label set that
// opens at s[0] ('{'), skipping quoted strings; -1 if it never closes.
func labelSetEnd(s []byte) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			q := quotedEnd(s[i:])
			if q < 0 {
				return -1
			}
			i += q - 1
		case '}':
			return i + 1
		}
	}
	return -1
}

// quotedEnd returns the index just past the closing quote of the string
// opening at s[0] ('"'), honouring backslash escapes; -1 if it never closes.
func quotedEnd(s []byte) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// pick combines the samples of the first candidate present: the maximum
// when useMax, else the sum.
func pick(fams map[string]*dto.MetricFamily, candidates []string, useMax bool) (float64, bool, error) {
	for _, name := range candidates {
		fam := fams[name]
		if fam == nil {
			continue
		}
		acc, n := 0.0, 0
		for _, m := range fam.GetMetric() {
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Untyped != nil:
				v = m.Untyped.GetValue()
			default:
				continue
			}
			if v != v || v < 0 || math.IsInf(v, 0) {
				return 0, false, fmt.Errorf("%w: %s = %v", ErrBadValue, name, v)
			}
			if useMax {
				acc = math.Max(acc, v)
			} else {
				acc += v
			}
			n++
		}
		if n == 0 {
			continue
		}
		if math.IsInf(acc, 0) {
			// Finite samples that overflow when summed.
			return 0, false, fmt.Errorf("%w: %s sums to %v", ErrBadValue, name, acc)
		}
		return acc, true, nil
	}
	return 0, false, nil
}

// histogramMean returns Σ _sum / Σ _count over the series of the first
// candidate histogram with a positive count; 0 (unknown) when none has one
// or a value is bad: the mean only refines the score (Scorer.Projection).
func histogramMean(fams map[string]*dto.MetricFamily, candidates []string) float64 {
	for _, name := range candidates {
		n, ok, err := pick(fams, []string{name + "_count"}, false)
		if err != nil || !ok || !(n > 0) {
			continue
		}
		sum, ok, err := pick(fams, []string{name + "_sum"}, false)
		if err != nil || !ok {
			return 0
		}
		return sum / n
	}
	return 0
}

// cacheCapacity returns num_gpu_blocks × block_size from the labels of the
// first series of the first candidate that has both as positive numbers
// (the largest over the series: the biggest engine); 0 when none has.
func cacheCapacity(fams map[string]*dto.MetricFamily, candidates []string) float64 {
	for _, name := range candidates {
		fam := fams[name]
		if fam == nil {
			continue
		}
		best := 0.0
		for _, m := range fam.GetMetric() {
			var blocks, size float64
			for _, l := range m.GetLabel() {
				v, err := strconv.ParseFloat(l.GetValue(), 64)
				if err != nil || !(v > 0) || math.IsInf(v, 0) {
					continue
				}
				switch l.GetName() {
				case "num_gpu_blocks":
					blocks = v
				case "block_size":
					size = v
				}
			}
			if c := blocks * size; c > best && !math.IsInf(c, 0) {
				best = c
			}
		}
		if best > 0 {
			return best
		}
	}
	return 0
}

// validate requires a candidate name for Waiting and KVUsage.
func (m MetricNames) validate() error {
	if len(m.Waiting) == 0 {
		return fmt.Errorf("%w: MetricNames.Waiting is empty", ErrInvalidConfig)
	}
	if len(m.KVUsage) == 0 {
		return fmt.Errorf("%w: MetricNames.KVUsage is empty", ErrInvalidConfig)
	}
	return nil
}
