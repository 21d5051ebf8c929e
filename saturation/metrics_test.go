package saturation

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
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
