package saturation

import (
	"errors"
	"fmt"
	"io"
	"math"

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

// MetricNames maps the three quantities the Scorer needs to metric names.
// Each field lists candidate names in order of preference; the first name
// present in a scrape is used (so a renamed metric can fall back to its old
// name). Waiting and KVUsage are required; Running is optional (missing
// reads as 0, which can only enlarge the in-flight credit: fail safe).
type MetricNames struct {
	Waiting []string
	Running []string
	KVUsage []string
}

// VLLM returns the names vLLM exports (the default). kv_cache_usage_perc
// replaced gpu_cache_usage_perc in vLLM 0.10; both are accepted.
func VLLM() MetricNames {
	return MetricNames{
		Waiting: []string{"vllm:num_requests_waiting"},
		Running: []string{"vllm:num_requests_running"},
		KVUsage: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
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

// ParseMetrics reads a /metrics body in the Prometheus text exposition
// format and returns the pod's Reading with OK true and At zero (the caller
// stamps the time). For each quantity the first candidate name present is
// used; several series of it (label sets: engines, models) are combined:
//
//	Waiting, Running   sum over the series (requests queued on any engine)
//	KVUsage            maximum over the series (the fullest engine)
//
// Only gauge, counter and untyped samples count; a family of another type
// under a candidate name counts as absent. Effects of bad input:
//
//	body not valid text format               -> ErrParse
//	Waiting or KVUsage absent (all names)    -> ErrMissingMetric
//	Running absent                           -> Running = 0 (no error)
//	a used sample NaN, ±Inf or negative      -> ErrBadValue
//
// Any error means the scrape failed; see PollerConfig.FailFast for what a
// failed scrape does to the pod's score.
func ParseMetrics(body io.Reader, names MetricNames) (Reading, error) {
	if err := names.validate(); err != nil {
		return Reading{}, err
	}
	// UTF8Validation accepts every legal name, including the legacy
	// scheme's colon names (vllm:...) and quoted UTF-8 names.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(body)
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
	r.OK = true
	return r, nil
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
