package saturation

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vllmRegistry is a client_golang registry exporting what a vLLM server
// exports (names, types and labels), plus a histogram and a counter of the
// kind that surround them in a real /metrics page.
type vllmRegistry struct {
	reg                  *prometheus.Registry
	waiting, running, kv *prometheus.GaugeVec
}

func newVLLMRegistry(t testing.TB, engines ...string) *vllmRegistry {
	t.Helper()
	labels := []string{"model_name", "engine"}
	v := &vllmRegistry{
		reg: prometheus.NewRegistry(),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting",
			Help: "Number of requests waiting to be processed."}, labels),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_running",
			Help: "Number of requests in model execution batches."}, labels),
		kv: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc",
			Help: "KV-cache usage. 1 means 100 percent usage."}, labels),
	}
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", Buckets: []float64{0.01, 0.1, 1}}, labels)
	prompt := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
		Help: "Number of prefill tokens processed."}, labels)
	v.reg.MustRegister(v.waiting, v.running, v.kv, ttft, prompt)
	for _, e := range engines {
		ttft.WithLabelValues("qwen", e).Observe(0.05)
		prompt.WithLabelValues("qwen", e).Add(1176)
	}
	return v
}

// set writes one engine's gauges.
func (v *vllmRegistry) set(engine string, waiting, running, kv float64) {
	v.waiting.WithLabelValues("qwen", engine).Set(waiting)
	v.running.WithLabelValues("qwen", engine).Set(running)
	v.kv.WithLabelValues("qwen", engine).Set(kv)
}

// text renders the registry in the text exposition format, as promhttp does.
func (v *vllmRegistry) text(t testing.TB) string {
	t.Helper()
	fams, err := v.reg.Gather()
	require.NoError(t, err)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		require.NoError(t, enc.Encode(f))
	}
	return buf.String()
}

func TestParseClientGolangBody(t *testing.T) {
	v := newVLLMRegistry(t, "0", "1")
	v.set("0", 3, 10, 0.25)
	v.set("1", 4, 12, 0.5)
	body := v.text(t)
	require.Contains(t, body, "vllm:num_requests_waiting{engine=\"0\"")

	r, err := ParseMetrics(strings.NewReader(body), VLLM())
	require.NoError(t, err)
	assert.True(t, r.OK)
	assert.True(t, r.At.IsZero(), "the caller stamps the time")
	assert.Equal(t, 7.0, r.Waiting, "counts are summed over series")
	assert.Equal(t, 22.0, r.Running, "counts are summed over series")
	assert.Equal(t, 0.5, r.KVUsage, "usage is the max over series")
	assert.InDelta(t, 1.4, Scorer{}.Pod(Reading{Waiting: r.Waiting, KVUsage: r.KVUsage, At: t0, OK: true}, t0), 1e-12)
}

func TestParseRules(t *testing.T) {
	const full = "vllm:num_requests_waiting 2\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0.4\n"
	cases := []struct {
		name    string
		body    string
		names   MetricNames
		want    Reading
		wantErr error
	}{
		{"plain", full, VLLM(), Reading{Waiting: 2, Running: 3, KVUsage: 0.4, OK: true}, nil},
		{"old kv name", "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.3\n", VLLM(),
			Reading{Waiting: 1, KVUsage: 0.3, OK: true}, nil},
		{"new kv name preferred", "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.3\n", VLLM(),
			Reading{Waiting: 1, KVUsage: 0.3, OK: true}, nil},
		{"running missing reads 0", "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.3\n", VLLM(),
			Reading{Waiting: 1, KVUsage: 0.3, OK: true}, nil},
		{"untyped and typed gauges", "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{a=\"x\"} 1\nvllm:num_requests_waiting{a=\"y\"} 2\nvllm:kv_cache_usage_perc 0.1\n", VLLM(),
			Reading{Waiting: 3, KVUsage: 0.1, OK: true}, nil},
		{"sglang", "sglang:num_queue_reqs 6\nsglang:num_running_reqs 1\nsglang:token_usage 0.7\n", SGLang(),
			Reading{Waiting: 6, Running: 1, KVUsage: 0.7, OK: true}, nil},
		{"kv above 1 accepted", "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.5\n", VLLM(),
			Reading{KVUsage: 1.5, OK: true}, nil},
		{"empty body", "", VLLM(), Reading{}, ErrMissingMetric},
		{"waiting missing", "vllm:kv_cache_usage_perc 0.3\n", VLLM(), Reading{}, ErrMissingMetric},
		{"kv missing", "vllm:num_requests_waiting 1\n", VLLM(), Reading{}, ErrMissingMetric},
		{"histogram under the name counts as absent", "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_sum 1\nvllm:num_requests_waiting_count 1\nvllm:kv_cache_usage_perc 0.3\n", VLLM(),
			Reading{}, ErrMissingMetric},
		{"garbage", "\x00\x01 this is not { prometheus", VLLM(), Reading{}, ErrParse},
		{"html error page", "<html><body>502 Bad Gateway</body></html>", VLLM(), Reading{}, ErrParse},
		{"truncated", "vllm:num_requests_waiting{a=\"", VLLM(), Reading{}, ErrParse},
		{"NaN", "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.3\n", VLLM(), Reading{}, ErrBadValue},
		{"+Inf", "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc +Inf\n", VLLM(), Reading{}, ErrBadValue},
		{"-Inf", "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.1\nvllm:num_requests_running -Inf\n", VLLM(), Reading{}, ErrBadValue},
		{"negative", "vllm:num_requests_waiting -1\nvllm:kv_cache_usage_perc 0.3\n", VLLM(), Reading{}, ErrBadValue},
		{"one bad series poisons the sum", "vllm:num_requests_waiting{e=\"0\"} 1\nvllm:num_requests_waiting{e=\"1\"} NaN\nvllm:kv_cache_usage_perc 0.3\n", VLLM(), Reading{}, ErrBadValue},
		{"sum overflow", "vllm:num_requests_waiting{e=\"0\"} 1e308\nvllm:num_requests_waiting{e=\"1\"} 1e308\nvllm:kv_cache_usage_perc 0.3\n", VLLM(), Reading{}, ErrBadValue},
		{"no names", full, MetricNames{}, Reading{}, ErrInvalidConfig},
	}
	for _, c := range cases {
		r, err := ParseMetrics(strings.NewReader(c.body), c.names)
		if c.wantErr != nil {
			assert.ErrorIs(t, err, c.wantErr, c.name)
			if err != nil {
				assert.True(t, strings.HasPrefix(err.Error(), "saturation: "), "%s: %q", c.name, err)
			}
			assert.Equal(t, Reading{}, r, c.name)
			continue
		}
		assert.NoError(t, err, c.name)
		assert.Equal(t, c.want, r, c.name)
	}
}

// fuzzSeeds are bodies worth keeping in the corpus; they run in plain go test.
func fuzzSeeds(t testing.TB) []string {
	v := newVLLMRegistry(t, "0", "1")
	v.set("0", 3, 10, 0.25)
	v.set("1", 0, 1, 0.95)
	return []string{
		v.text(t),
		"vllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.4\n",
		"vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.4\n",
		"vllm:num_requests_waiting 1e308\nvllm:kv_cache_usage_perc 1e308\n",
		"vllm:num_requests_waiting 4.9e-324\nvllm:gpu_cache_usage_perc 0\n",
		"vllm:num_requests_waiting{a=\"1\"} 1 1700000000000\nvllm:kv_cache_usage_perc{a=\"1\"} +Inf\n",
		"{\"vllm:num_requests_waiting\"} 3\n{\"vllm:kv_cache_usage_perc\"} 0.5\n",
		"# EOF\n",
		"",
		"\xff\xfe garbage",
		"\xef\xbb\xbfvllm:num_requests_waiting 2\r\nvllm:kv_cache_usage_perc 0.4\r\n",
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1 # {trace_id=\"a\"} 1 1.5\nvllm:kv_cache_usage_perc 0.1 1700000000.25\n# EOF\n",
		"# TYPE vllm:build info\nvllm:build_info{v=\"1\"} 1\n# TYPE vllm:s stateset\nvllm:s{vllm:s=\"a\"} 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n",
		"# TYPE vllm:num_requests_waiting unknown\nvllm:num_requests_waiting{a=\"}#\"} 1\nvllm:kv_cache_usage_perc {b=\"\\\"\"} 0.9\nx_created 1\n",
		"# TYPE vllm:num_requests_waiting summary\nvllm:num_requests_waiting{quantile=\"0.5\"} 1\nvllm:kv_cache_usage_perc 0\n",
		"vllm:num_requests_waiting{a=\"1\"} 1\nvllm:num_requests_waiting{a=\"1\"} 2\nvllm:kv_cache_usage_perc 0\n",
	}
}

// FuzzParse: any body either fails with one of the documented errors or
// yields a reading whose values, and whose score, are finite and in range.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseMetrics(bytes.NewReader(body), VLLM())
		// Wherever the strict text parser accepts the page, the lenient
		// one reads exactly what it reads, or fails the same way.
		if sr, serr, ok := strictReading(body, VLLM()); ok {
			if (err == nil) != (serr == nil) || err != nil && !errors.Is(err, errorClass(serr)) {
				t.Fatalf("lenient %v / %v, strict %v / %v", r, err, sr, serr)
			}
			if r != sr {
				t.Fatalf("lenient reads %+v, strict %+v", r, sr)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrParse) && !errors.Is(err, ErrMissingMetric) && !errors.Is(err, ErrBadValue) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		for _, x := range []float64{r.Waiting, r.Running, r.KVUsage} {
			if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
				t.Fatalf("reading holds %v: %+v", x, r)
			}
		}
		r.At = t0
		r.InFlight = 1 << 40
		for _, s := range []Scorer{{}, {InFlightCredit: true}} {
			if got := s.Pod(r, t0.Add(time.Millisecond)); !inRange(got) {
				t.Fatalf("score %v for %+v", got, r)
			}
		}
	})
}

// TestParseLenient: what real exporters send beside the plain text format —
// OpenMetrics pages, CRLF line ends, a byte order mark, unfamiliar types —
// reads the same values as the plain page.
func TestParseLenient(t *testing.T) {
	want := Reading{Waiting: 3, Running: 4, KVUsage: 0.5, OK: true}
	const plain = "vllm:num_requests_waiting 3\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.5\n"
	const openMetrics = `# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
# UNIT vllm:num_requests_waiting requests
vllm:num_requests_waiting{engine="0"} 1 1700000000.123
vllm:num_requests_waiting{engine="1"} 2 # {trace_id="abc"} 2.0 1700000000.5
# TYPE vllm:num_requests_running unknown
vllm:num_requests_running 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.5 # {span="}#{"} 1
# TYPE vllm:build info
vllm:build_info{version="0.11.0"} 1
# TYPE vllm:state stateset
vllm:state{vllm:state="a"} 1
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total 1176
vllm:prompt_tokens_created 1.7e9
# TYPE vllm:ttft gaugehistogram
vllm:ttft_gcount 1
# EOF
`
	cases := []struct{ name, body string }{
		{"plain", plain},
		{"CRLF", strings.ReplaceAll(plain, "\n", "\r\n")},
		{"BOM", "\xef\xbb\xbf" + plain},
		{"BOM and CRLF, no final newline", "\xef\xbb\xbf" + strings.TrimSuffix(strings.ReplaceAll(plain, "\n", "\r\n"), "\r\n")},
		{"OpenMetrics", openMetrics},
		{"OpenMetrics CRLF", strings.ReplaceAll(openMetrics, "\n", "\r\n")},
		{"blank lines and indentation", "\n  \t\n  " + strings.ReplaceAll(plain, "\n", "\n\t ")},
		{"blank before labels", "vllm:num_requests_waiting {a=\"x\"} 3\nvllm:num_requests_running\t4\nvllm:kv_cache_usage_perc 0.5\n"},
		{"quoted names", "{\"vllm:num_requests_waiting\"} 3\n{\"vllm:num_requests_running\", a=\"}\"} 4\n{\"vllm:kv_cache_usage_perc\"} 0.5\n"},
		{"TYPE after samples is ignored", plain + "# TYPE vllm:num_requests_waiting gauge\n"},
		{"a broken family elsewhere", "other_metric{a=\"unterminated\n" + "histo_bucket{le=\"1\"} x y z\n" + plain},
		{"long line", "pad{p=\"" + strings.Repeat("x", 200_000) + "\"} 1\n" + plain},
	}
	for _, c := range cases {
		r, err := ParseMetrics(strings.NewReader(c.body), VLLM())
		if assert.NoError(t, err, c.name) {
			assert.Equal(t, want, r, c.name)
		}
	}

	// Types that are not a single number count as absent, whatever the
	// page's dialect.
	for _, typ := range []string{"summary", "histogram", "info", "stateset", "gaugehistogram"} {
		body := "# TYPE vllm:num_requests_waiting " + typ + "\nvllm:num_requests_waiting{quantile=\"0.5\"} 1\nvllm:kv_cache_usage_perc 0.1\n"
		_, err := ParseMetrics(strings.NewReader(body), VLLM())
		assert.ErrorIs(t, err, ErrMissingMetric, typ)
	}
}

// page4MiB is a valid text-format page of exactly 4 MiB (the default
// MaxBodyBytes): a large histogram family (what dominates a real vLLM page
// with many models and LoRAs) with the three gauges the scorer needs last.
func page4MiB() []byte {
	const tail = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 2\n" +
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 7\n" +
		"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.4\n"
	const size = 4 << 20
	var b bytes.Buffer
	b.WriteString("# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency.\n")
	b.WriteString("# TYPE vllm:e2e_request_latency_seconds histogram\n")
	for i := 0; ; i++ {
		line := fmt.Sprintf("vllm:e2e_request_latency_seconds_bucket{engine=\"%d\",le=\"%d\",model_name=\"qwen3-14b-lora-%d\"} %d\n", i%8, i%20, i, i)
		if b.Len()+len(line)+len(tail)+3 > size {
			break
		}
		b.WriteString(line)
	}
	// Pad with a comment to the exact size.
	b.WriteString("#" + strings.Repeat(" ", size-b.Len()-len(tail)-2) + "\n")
	b.WriteString(tail)
	return b.Bytes()
}

func TestParse4MiBPage(t *testing.T) {
	page := page4MiB()
	require.Len(t, page, 4<<20)
	r, err := ParseMetrics(bytes.NewReader(page), VLLM())
	require.NoError(t, err)
	assert.Equal(t, Reading{Waiting: 2, Running: 7, KVUsage: 0.4, OK: true}, r)
}

// BenchmarkParseMetrics4MiB: one 4 MiB page, the default MaxBodyBytes.
func BenchmarkParseMetrics4MiB(b *testing.B) {
	page := page4MiB()
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMetrics(bytes.NewReader(page), VLLM()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExpfmtTextParser4MiB is the baseline ParseMetrics replaced:
// expfmt's text parser building every family of the same page.
func BenchmarkExpfmtTextParser4MiB(b *testing.B) {
	page := page4MiB()
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := parser.TextToMetricFamilies(bytes.NewReader(page)); err != nil {
			b.Fatal(err)
		}
	}
}

// strictReading is what the plain expfmt text parser makes of body, read by
// the same rules; ok false when that parser refuses the page.
func strictReading(body []byte, names MetricNames) (Reading, error, bool) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return Reading{}, nil, false
	}
	var r Reading
	var found bool
	if r.Waiting, found, err = pick(fams, names.Waiting, false); err != nil {
		return Reading{}, err, true
	} else if !found {
		return Reading{}, ErrMissingMetric, true
	}
	if r.KVUsage, found, err = pick(fams, names.KVUsage, true); err != nil {
		return Reading{}, err, true
	} else if !found {
		return Reading{}, ErrMissingMetric, true
	}
	if r.Running, _, err = pick(fams, names.Running, false); err != nil {
		return Reading{}, err, true
	}
	r.OK = true
	return r, nil, true
}

// errorClass is the sentinel err wraps.
func errorClass(err error) error {
	for _, e := range []error{ErrParse, ErrMissingMetric, ErrBadValue} {
		if errors.Is(err, e) {
			return e
		}
	}
	return err
}
