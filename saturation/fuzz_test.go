package saturation

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fuzzPods answers every scrape with one status and body, without I/O.
type fuzzPods struct {
	status int
	body   string
}

func (f fuzzPods) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: f.status, Body: io.NopCloser(strings.NewReader(f.body)),
		Header: http.Header{}, Request: r}, nil
}

// inRangeSat: a reported saturation is never NaN nor negative (raw: +Inf is
// allowed; the dispatcher caps it).
func inRangeSat(x float64) bool { return validSat(x) }

// scorerValid is the model of Scorer.Validate: zero or a finite threshold
// > 0, a KV threshold in (0, 1], a staleness of 0 or 1 ms .. 1 h.
func scorerValid(s Scorer) bool {
	return s.QueueDepthThreshold >= 0 && !math.IsInf(s.QueueDepthThreshold, 1) &&
		s.KVUtilThreshold >= 0 && s.KVUtilThreshold <= 1 &&
		(s.Staleness == 0 || s.Staleness >= time.Millisecond && s.Staleness <= time.Hour)
}

// durValid: 0 (default) or lo..hi.
func durValid(d, lo, hi time.Duration) bool { return d == 0 || d >= lo && d <= hi }

// checkErr: an invalid configuration is an ErrInvalidConfig error prefixed
// with the package name.
func checkErr(t *testing.T, what string, err error, valid bool) {
	t.Helper()
	if valid != (err == nil) {
		t.Fatalf("%s: err %v, model says valid=%v", what, err, valid)
	}
	if err != nil && (!errors.Is(err, ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "saturation: ")) {
		t.Fatalf("%s: %q is not a saturation ErrInvalidConfig", what, err)
	}
}

// FuzzNewPoller fuzzes NewPoller's validation (intervals, body cap, Scorer,
// in-flight credit, metric names, endpoint URLs) against a model of the
// documented rules; a poller it accepts is then polled once against a fake
// pod serving the fuzzed status and body: the saturation stays in range,
// a failed scrape carries its typed error, and with FailFast a failed pod
// scores 1.
func FuzzNewPoller(f *testing.F) {
	good := "vllm:num_requests_waiting 2\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0.4\n"
	f.Add(int64(0), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a:1/metrics", "", "", "", good, 200)
	f.Add(int64(time.Millisecond), int64(time.Millisecond), int64(10), 5.0, 0.8, int64(time.Second), uint8(8), "http://a/metrics", "https://b/m", "", "", good, 200)
	f.Add(int64(-1), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a/metrics", "", "", "", good, 200)
	f.Add(int64(0), int64(-1), int64(-1), math.NaN(), math.Inf(1), int64(-1), uint8(1), "ftp://a/metrics", "", "", "", good, 200)
	f.Add(int64(0), int64(0), int64(0), -1.0, 0.0, int64(0), uint8(3), "http://a/metrics", "/relative", "w", "", "w 1\n", 200)
	f.Add(int64(0), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(12), "http://a/metrics", "", "w", "kv", "w NaN\nkv 0.5\n", 200)
	f.Add(int64(0), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a/metrics", "", "", "", "garbage {{", 500)
	f.Add(int64(1), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a/metrics", "", "", "", good, 200)                                     // scrapeInterval: 1ns
	f.Add(int64(0), int64(0), int64(0), 0.0, 0.0, int64(87600*time.Hour), uint8(0), "http://a/metrics", "", "", "", good, 200)                       // staleness 10 years
	f.Add(int64(0), int64(time.Second), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a/metrics", "", "", "", good, 200)                           // timeout > staleness
	f.Add(int64(0), int64(50*time.Millisecond), int64(0), 0.0, 0.0, int64(40*time.Millisecond), uint8(0), "http://a/metrics", "", "", "", good, 200) // timeout > staleness
	f.Add(int64(0), int64(0), int64(0), 0.0, 5.0, int64(0), uint8(0), "http://a/metrics", "", "", "", good, 200)                                     // KV threshold 5
	f.Add(int64(0), int64(0), int64(0), 0.0, 0.0, int64(0), uint8(0), "http://a/metrics", "", "", "", "\xef\xbb\xbf# TYPE vllm:num_requests_waiting gauge\r\nvllm:num_requests_waiting 1 # {a=\"b\"} 1\r\nvllm:kv_cache_usage_perc 0.5\r\n# EOF\r\n", 200)
	f.Add(int64(0), int64(0), int64(0), 1e-300, 1e300, int64(1), uint8(6), "http://[::1]:80/metrics", "http://a/metrics", "", "kv", "kv +Inf\n", 200)
	f.Fuzz(func(t *testing.T, interval, timeout, maxBody int64, qd, kv float64, staleness int64, flags uint8,
		ep1, ep2, waitingName, kvName, body string, status int) {
		sc := Scorer{QueueDepthThreshold: qd, KVUtilThreshold: kv, Staleness: time.Duration(staleness),
			InFlightCredit: flags&1 != 0, IgnoreStale: flags&4 != 0}
		cfg := PollerConfig{
			Interval: time.Duration(interval), Timeout: time.Duration(timeout), MaxBodyBytes: maxBody,
			Scorer: sc, FailFast: flags&8 != 0,
		}
		if waitingName != "" || kvName != "" {
			cfg.Metrics = MetricNames{Waiting: nonEmpty(waitingName), KVUsage: nonEmpty(kvName)}
		}
		for _, ep := range []string{ep1, ep2} {
			if ep != "" {
				cfg.Endpoints = append(cfg.Endpoints, ep)
			}
		}
		if status < 100 || status > 599 {
			status = 200
		}
		cfg.Client = &http.Client{Transport: fuzzPods{status: status, body: body}}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		cfg.Now = func() time.Time { return now }

		stale := DefaultStaleness
		if sc.Staleness != 0 {
			stale = sc.Staleness
		}
		valid := durValid(time.Duration(interval), time.Millisecond, time.Hour) &&
			durValid(time.Duration(timeout), time.Millisecond, stale) && maxBody >= 0 && scorerValid(sc) &&
			(cfg.Metrics.Waiting == nil && cfg.Metrics.KVUsage == nil ||
				len(cfg.Metrics.Waiting) > 0 && len(cfg.Metrics.KVUsage) > 0)
		for _, ep := range cfg.Endpoints {
			u, err := url.Parse(ep)
			valid = valid && err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
		}
		p, err := NewPoller(cfg)
		checkErr(t, "NewPoller", err, valid)
		if err != nil {
			return
		}
		if s := p.Saturation(); s != 1 {
			t.Fatalf("saturation before the first round = %v, want 1 (fail safe)", s)
		}
		scrapeErr := p.Scrape(context.Background())
		failed := false
		if s := p.Saturation(); !inRangeSat(s) {
			t.Fatalf("saturation %v out of range", s)
		}
		for _, r := range p.Readings() {
			if !inRangeSat(r.Score) {
				t.Fatalf("pod %s score %v out of range", r.Endpoint, r.Score)
			}
			if r.Err == nil {
				continue
			}
			failed = true
			if scrapeErr == nil || !strings.Contains(scrapeErr.Error(), r.Err.Error()) {
				t.Fatalf("Scrape = %v, but pod %s failed: %v", scrapeErr, r.Endpoint, r.Err)
			}
			if !strings.HasPrefix(r.Err.Error(), "saturation: ") {
				t.Fatalf("scrape error %q lacks the package prefix", r.Err)
			}
			if status != 200 && !errors.Is(r.Err, ErrHTTPStatus) {
				t.Fatalf("status %d: error %v, want ErrHTTPStatus", status, r.Err)
			}
			if cfg.FailFast && (r.Usable || r.Score != 1) {
				t.Fatalf("FailFast: failed pod %+v not scored 1", r)
			}
		}
		if !failed && scrapeErr != nil {
			t.Fatalf("Scrape = %v with no failed pod", scrapeErr)
		}
		// The live credit agrees with Scorer.Pool over the readings with
		// the same counts, within its documented bound.
		{
			counts := map[string]int64{}
			for _, ep := range p.Endpoints() {
				for range 3 {
					if !p.Dispatched(ep) {
						t.Fatalf("Dispatched(%s) refused", ep)
					}
				}
				counts[ep] = 3
			}
			if !sc.InFlightCredit {
				counts = nil
			}
			requireExact(t, p, counts, "3 in flight per pod")
		}
	})
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// FuzzScorer fuzzes Scorer.Validate against its model and Pod, Usable and
// Pool over any reading: scores are in range and never NaN, an unusable
// reading scores 1, and Pool of one reading (or of it twice) is its Pod
// score, or 1 when IgnoreStale leaves it out.
func FuzzScorer(f *testing.F) {
	f.Add(0.0, 0.0, int64(0), uint8(0), 2.0, 3.0, 0.4, int64(0), int64(0), true)
	f.Add(5.0, 0.8, int64(time.Second), uint8(3), 1e9, 0.0, 0.0, int64(7), int64(time.Hour), true)
	f.Add(math.NaN(), -1.0, int64(-1), uint8(1), math.NaN(), math.Inf(1), -1.0, int64(-5), int64(-time.Hour), true)
	f.Add(1e-300, 1e300, int64(1), uint8(2), math.Inf(1), math.Inf(1), math.Inf(1), int64(math.MaxInt64), int64(2), false)
	f.Fuzz(func(t *testing.T, qd, kv float64, staleness int64, flags uint8, waiting, running, kvUsage float64, inflight, age int64, ok bool) {
		s := Scorer{QueueDepthThreshold: qd, KVUtilThreshold: kv, Staleness: time.Duration(staleness),
			InFlightCredit: flags&1 != 0, IgnoreStale: flags&2 != 0}
		checkErr(t, "Validate", s.Validate(), scorerValid(s))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		r := Reading{Waiting: waiting, Running: running, KVUsage: kvUsage, InFlight: inflight,
			At: now.Add(-time.Duration(age)), OK: ok}
		pod := s.Pod(r, now)
		if !inRangeSat(pod) {
			t.Fatalf("Pod(%+v) = %v", r, pod)
		}
		usable := s.Usable(r, now)
		if !usable && pod != 1 {
			t.Fatalf("unusable %+v scored %v, want 1", r, pod)
		}
		want := pod
		if !usable && s.IgnoreStale {
			want = 1 // an empty pool
		}
		if got := s.Pool([]Reading{r}, now); got != want {
			t.Fatalf("Pool([r]) = %v, want %v", got, want)
		}
		if got := s.Pool([]Reading{r, r}, now); got != want {
			t.Fatalf("Pool([r, r]) = %v, want %v", got, want)
		}
	})
}

// FuzzSources fuzzes the small constructors and sources: NewEWMA refuses a
// non-positive half-life, NewInFlight a capacity below 1; Value reads back
// exactly what was set (raw); EWMA, InFlight and Mean are never NaN nor
// negative (EWMA finite but for a +Inf sample, InFlight finite), Max is
// never NaN.
func FuzzSources(f *testing.F) {
	f.Add(int64(time.Second), 4, 0.5, int64(time.Millisecond), uint8(3))
	f.Add(int64(0), 0, math.NaN(), int64(0), uint8(0))
	f.Add(int64(-1), -1, math.Inf(1), int64(-time.Second), uint8(9))
	f.Add(int64(1), 1, math.Inf(-1), int64(math.MaxInt64), uint8(200))
	f.Fuzz(func(t *testing.T, halfLife int64, capacity int, x float64, dt int64, incs uint8) {
		var v Value
		v.Set(x)
		if got := v.Saturation(); math.Float64bits(got) != math.Float64bits(x) {
			t.Fatalf("Value.Set(%v) reads %v", x, got)
		}
		clk := newFakeClock()
		e, err := NewEWMA(&v, time.Duration(halfLife), clk.Now)
		checkErr(t, "NewEWMA", err, halfLife > 0)
		if err == nil {
			for _, y := range []float64{x, 0, x, 1} {
				v.Set(y)
				got := e.Saturation()
				if !inRangeSat(got) || math.IsInf(got, 1) != math.IsInf(y, 1) {
					t.Fatalf("EWMA = %v after %v", got, y)
				}
				clk.Advance(time.Duration(dt))
			}
		}
		in, err := NewInFlight(capacity)
		checkErr(t, "NewInFlight", err, capacity >= 1)
		if err == nil {
			for range incs {
				in.Inc()
			}
			for range int(incs) + 2 { // two too many: underflow is counted, not negative
				in.Dec()
			}
			if in.Count() != 0 || in.Underflows() != 2 || !inRange(in.Saturation()) {
				t.Fatalf("InFlight after %d Inc, %d Dec: count %d, underflows %d, saturation %v",
					incs, int(incs)+2, in.Count(), in.Underflows(), in.Saturation())
			}
		}
		if got := Max(&v, Func(func() float64 { return x })).Saturation(); math.IsNaN(got) {
			t.Fatalf("Max = %v for %v", got, x)
		}
		if got := Mean(&v, Func(func() float64 { return -x })).Saturation(); !inRangeSat(got) {
			t.Fatalf("Mean = %v for %v", got, x)
		}
	})
}
