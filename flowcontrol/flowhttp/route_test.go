package flowhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// fakePods answers the poller's scrapes without a network: each endpoint's
// vllm:kv_cache_usage_perc is what the test last set, or the scrape fails.
type fakePods struct {
	mu   sync.Mutex
	kv   map[string]float64 // by host
	fail map[string]bool
}

func newFakePods() *fakePods {
	return &fakePods{kv: map[string]float64{}, fail: map[string]bool{}}
}

func (f *fakePods) set(host string, kv float64, fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kv[host], f.fail[host] = kv, fail
}

func (f *fakePods) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	kv, fail := f.kv[r.URL.Host], f.fail[r.URL.Host]
	f.mu.Unlock()
	if fail {
		return nil, errors.New("fake pod down")
	}
	body := "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc " + strconv.FormatFloat(kv, 'g', -1, 64) + "\n"
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// routeModel is the critical routing as the documentation states it, kept
// apart from the code: the endpoints whose last scrape succeeded with KV
// usage ≤ 1 − headroom or, when none is, those (with a successful scrape)
// with the lowest usage; all of them when that keeps all; among those the
// fewest in flight, ties to the first met from the round-robin start (the
// counter advances on every pick). The gateway is never started, so no
// endpoint reads usable to LeastLoaded's first rule: it ranks none first.
type routeModel struct {
	headroom float64
	kv       []float64
	ok       []bool
	inflight []int
	rr       uint64
}

func (m *routeModel) keep() []bool {
	n, k := len(m.kv), 0
	keep := make([]bool, n)
	for i := range n {
		if m.ok[i] && m.kv[i] <= 1-m.headroom {
			keep[i] = true
			k++
		}
	}
	if k == 0 {
		lowest := math.Inf(1)
		for i := range n {
			if m.ok[i] {
				lowest = min(lowest, m.kv[i])
			}
		}
		for i := range n {
			if m.ok[i] && m.kv[i] == lowest {
				keep[i] = true
				k++
			}
		}
	}
	if m.headroom == 0 || k == 0 || k == n {
		return nil
	}
	return keep
}

func (m *routeModel) pick(band int) int {
	n := len(m.kv)
	m.rr++
	var keep []bool
	if band == 0 {
		keep = m.keep()
	}
	best := -1
	for k := range n {
		i := (int(m.rr%uint64(n)) + k) % n
		if keep != nil && !keep[i] {
			continue
		}
		if best < 0 || m.inflight[i] < m.inflight[best] {
			best = i
		}
	}
	return best
}

// TestLeastLoadedForMatchesModel drives a Gateway's Router through random sequences of
// scrapes (KV readings, failed scrapes), picks in random bands, forwards and
// finishes, and requires LeastLoadedFor, Eligible and Eligibility to agree
// with routeModel at every step, and an Eligibility to keep the verdict of
// the reading it was taken from.
func TestLeastLoadedForMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "endpoints")
		headroom := rapid.SampledFrom([]float64{0, 0.05, 0.1, 0.5, 1}).Draw(t, "headroom")
		pods := newFakePods()
		eps := make([]string, n)
		idx := map[string]int{}
		for i := range eps {
			eps[i] = fmt.Sprintf("http://10.0.0.%d:8000", i+1)
			idx[eps[i]] = i
		}
		cfg := flowhttp.GatewayConfig{Endpoints: eps, CriticalKVHeadroom: headroom, NoCriticalKVRouting: headroom == 0}
		cfg.Poller.Client = &http.Client{Transport: pods}
		cfg.Poller.FailFast = true
		cfg.Poller.Scorer.Staleness = time.Hour // readings age only with Run, never started here
		gw, err := flowhttp.NewGateway(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		rt := gw.Router()
		m := &routeModel{headroom: headroom, kv: make([]float64, n), ok: make([]bool, n), inflight: make([]int, n)}
		type open struct {
			i    int
			done func() bool
		}
		var live []open
		kvs := []float64{0, 0.3, 0.85, 0.9, 0.95, 0.99, 1}
		held, heldKeep, heldAt := rt.Eligibility(0), m.keep(), -1 // before any scrape
		for step := range rapid.IntRange(1, 100).Draw(t, "steps") {
			switch rapid.IntRange(0, 3).Draw(t, "action") {
			case 0: // a scrape of every endpoint
				for i, ep := range eps {
					kv := rapid.SampledFrom(append(kvs, 1-headroom)).Draw(t, "kv")
					fail := rapid.IntRange(0, 9).Draw(t, "fail") == 0
					pods.set(strings.TrimPrefix(ep, "http://"), kv, fail)
					m.kv[i], m.ok[i] = kv, !fail
				}
				_ = gw.Poller().Scrape(context.Background()) // the failed scrapes are the point
			case 1:
				band := rapid.IntRange(0, 2).Draw(t, "band")
				got, want := idx[rt.LeastLoadedFor(band)], m.pick(band)
				if got != want {
					t.Fatalf("step %d: band %d went to %d, the model says %d (kv %v ok %v in flight %v, headroom %v)",
						step, band, got, want, m.kv, m.ok, m.inflight, headroom)
				}
				live = append(live, open{got, gw.Forward(discardWriter{}, eps[got])})
				m.inflight[got]++
			case 2:
				if len(live) == 0 {
					continue
				}
				k := rapid.IntRange(0, len(live)-1).Draw(t, "which")
				live[k].done()
				m.inflight[live[k].i]--
				live = append(live[:k], live[k+1:]...)
			case 3:
				keep := m.keep()
				for i, ep := range eps {
					for band := range 2 {
						want := band != 0 || keep == nil || keep[i]
						if got := rt.Eligible(band, ep); got != want {
							t.Fatalf("step %d: Eligible(%d, %d) = %v, the model says %v (kv %v ok %v)", step, band, i, got, want, m.kv, m.ok)
						}
						if got := rt.Eligibility(band).Keeps(ep); got != want {
							t.Fatalf("step %d: Eligibility(%d).Keeps(%d) = %v, the model says %v (kv %v ok %v)", step, band, i, got, want, m.kv, m.ok)
						}
					}
				}
				// A verdict taken earlier keeps its reading, whatever
				// scrapes came since.
				for i, ep := range eps {
					if got, want := held.Keeps(ep), heldKeep == nil || heldKeep[i]; got != want {
						t.Fatalf("step %d: an Eligibility(0) held since step %d keeps %d: %v, its reading said %v", step, heldAt, i, got, want)
					}
				}
				held, heldKeep, heldAt = rt.Eligibility(0), keep, step
			}
		}
		for _, o := range live {
			o.done()
		}
	})
}

// The critical routing's configuration: the default follows
// ForwardPriority, NoCriticalKVRouting turns it off, bad values are refused
// with the field named.
func TestCriticalKVHeadroomConfig(t *testing.T) {
	set := flowhttp.Options{ForwardPriority: flowhttp.PrioritySet}
	for name, tc := range map[string]struct {
		cfg  flowhttp.GatewayConfig
		want float64
	}{
		"zero, priority kept: off":        {flowhttp.GatewayConfig{}, 0},
		"zero, priority stripped: off":    {flowhttp.GatewayConfig{HTTP: flowhttp.Options{ForwardPriority: flowhttp.PriorityStrip}}, 0},
		"zero, priority set: the default": {flowhttp.GatewayConfig{HTTP: set}, flowhttp.DefaultCriticalKVHeadroom},
		"set: on without priority":        {flowhttp.GatewayConfig{CriticalKVHeadroom: 0.15}, 0.15},
		"set, priority set":               {flowhttp.GatewayConfig{CriticalKVHeadroom: 0.05, HTTP: set}, 0.05},
		"one: on":                         {flowhttp.GatewayConfig{CriticalKVHeadroom: 1}, 1},
		"off, priority set":               {flowhttp.GatewayConfig{NoCriticalKVRouting: true, HTTP: set}, 0},
	} {
		gw, err := flowhttp.NewGateway(tc.cfg)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, gw.Router().CriticalKVHeadroom(), name)
		gw.Close()
	}
	for name, cfg := range map[string]flowhttp.GatewayConfig{
		"negative":   {CriticalKVHeadroom: -0.1},
		"above one":  {CriticalKVHeadroom: 1.5},
		"NaN":        {CriticalKVHeadroom: math.NaN()},
		"infinite":   {CriticalKVHeadroom: math.Inf(1)},
		"off and on": {CriticalKVHeadroom: 0.1, NoCriticalKVRouting: true},
	} {
		_, err := flowhttp.NewGateway(cfg)
		require.ErrorIs(t, err, flowhttp.ErrInvalidConfig, name)
		require.Contains(t, err.Error(), "CriticalKVHeadroom", name)
		require.True(t, strings.HasPrefix(err.Error(), "flowhttp: "), err.Error())
	}
}

// unwrapper is a host's own ResponseWriter wrapper, as middleware adds.
type unwrapper struct{ http.ResponseWriter }

func (u unwrapper) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// BandOf tells the wrapped handler the band Handler placed its request in,
// whichever rule placed it, through a host's wrapper too; an ungated
// request has none.
func TestBandOf(t *testing.T) {
	type seen struct {
		band    int
		ok      bool
		wrapped int
	}
	got := make(chan seen, 1)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := flowhttp.BandOf(w)
		wb, wok := flowhttp.BandOf(unwrapper{w})
		if wok != ok || wb != b {
			wb = -1
		}
		got <- seen{b, ok, wb}
	})
	e := start(t, critShed(4, 0, 0), next, flowhttp.Options{TrustObjectiveHeader: true})
	for _, tc := range []struct {
		method, objective, body string
		want                    seen
	}{
		{http.MethodPost, "critical", `{}`, seen{0, true, 0}},
		{http.MethodPost, "sheddable", `{}`, seen{1, true, 1}},
		{http.MethodPost, "", `{}`, seen{1, true, 1}},                      // DefaultObjective: the last band
		{http.MethodPost, "", `{"priority":0}`, seen{1, true, 1}},          // a body priority never raises
		{http.MethodGet, "critical", "", seen{0, false, 0}},                // not gated
		{http.MethodPost, "sheddable", `{"priority":0}`, seen{1, true, 1}}, // the header first
	} {
		req, err := http.NewRequest(tc.method, e.srv.URL+"/v1/completions", strings.NewReader(tc.body))
		require.NoError(t, err)
		if tc.objective != "" {
			req.Header.Set(flowhttp.ObjectiveHeader, tc.objective)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, tc.want, <-got, "%s %q %s", tc.method, tc.objective, tc.body)
	}
	b, ok := flowhttp.BandOf(discardWriter{})
	require.Equal(t, 0, b)
	require.False(t, ok)
}

// Route routes a writer Handler did not produce as LeastLoaded does.
func TestRouteUngated(t *testing.T) {
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}})
	require.NoError(t, err)
	defer gw.Close()
	a, b := gw.Router().Route(discardWriter{}), gw.Router().Route(discardWriter{})
	require.NotEqual(t, a, b, "round-robin between two idle endpoints")
	empty, err := flowhttp.NewGateway(flowhttp.GatewayConfig{})
	require.NoError(t, err)
	require.Equal(t, "", empty.Router().Route(discardWriter{}))
	require.Equal(t, "", empty.Router().LeastLoadedFor(0))
}
