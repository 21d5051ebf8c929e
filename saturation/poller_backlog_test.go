package saturation

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// podBehaviour is how a pod of backlogTransport answers.
type podBehaviour int

const (
	podOK     podBehaviour = iota // 200 with a page scoring 0.5, after the delay
	podStatus                     // 500 at once
	podHang                       // never answers
)

// backlogTransport is an in-memory RoundTripper: each host answers as its
// behaviour says, a healthy one after delay (on the bubble's clock).
type backlogTransport struct {
	delay time.Duration
	mu    sync.Mutex
	how   map[string]podBehaviour
}

func (b *backlogTransport) set(host string, h podBehaviour) {
	b.mu.Lock()
	b.how[host] = h
	b.mu.Unlock()
}

func (b *backlogTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	how := b.how[r.URL.Host]
	b.mu.Unlock()
	wait := b.delay
	switch how {
	case podStatus:
		return &http.Response{StatusCode: 500, Body: io.NopCloser(strings.NewReader("dead")),
			Header: http.Header{}, Request: r}, nil
	case podHang:
		wait = time.Hour
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	body := "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.4\n"
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(body)),
		Header: http.Header{}, Request: r}, nil
}

// TestPollerBacklogIsNotStaleness: 20 pods through one concurrency slot at
// 20 ms a scrape: the poller reaches each pod every 400 ms, twice the
// 200 ms Staleness. Every healthy pod stays usable and the pool at its true
// value at every look after warm-up (before, each pod went stale for half
// of every sweep); the achieved per-pod interval is exported. A pod that
// answers 500 scores 1 throughout, and a pod that starts hanging scores 1
// once it has missed ceil(Staleness/Interval) = 4 scrapes, the healthy ones
// unaffected. Virtual time makes every instant exact.
func TestPollerBacklogIsNotStaleness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		tr := &backlogTransport{delay: 20 * time.Millisecond, how: map[string]podBehaviour{"pod-0": podStatus}}
		eps := make([]string, n)
		for i := range eps {
			eps[i] = fmt.Sprintf("http://pod-%d/metrics", i)
		}
		p, err := NewPoller(PollerConfig{Endpoints: eps, MaxConcurrency: 1,
			Client: &http.Client{Transport: tr}})
		require.NoError(t, err)
		require.NoError(t, p.Start())
		look := func(what string, hungAt1 bool) {
			t.Helper()
			rs := p.Readings()
			usable := 0
			for _, r := range rs[1:] {
				if r.Usable {
					usable++
				}
			}
			assert.False(t, rs[0].Usable, "%s: the 500 pod", what)
			assert.Equal(t, 1.0, rs[0].Score, "%s: the 500 pod", what)
			want := (1 + 0.5*(n-1)) / n
			if hungAt1 {
				usable++ // pod-1 counted below
				want = (2 + 0.5*(n-2)) / n
				assert.False(t, rs[1].Usable, "%s: the hung pod", what)
			}
			assert.Equal(t, n-1, usable, "%s: healthy pods usable", what)
			assert.InDelta(t, want, p.Saturation(), 1e-9, "%s: pool", what)
		}
		// Warm-up: one sweep (n · 20 ms, the 500s take no time).
		time.Sleep(time.Duration(n) * tr.delay)
		for step := range 200 { // 2 s, a look every 10 ms
			synctest.Wait()
			look(fmt.Sprintf("step %d", step), false)
			if t.Failed() {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		st := p.Stats()
		assert.Equal(t, n, st.Pods)
		assert.Equal(t, n-1, st.Usable)
		// 19 pods of 20 ms each go round in 380 ms (the 500 pod is free).
		assert.InDelta(t, 380*time.Millisecond, st.Interval, float64(25*time.Millisecond), "achieved per-pod interval")
		rs := p.Readings()
		assert.InDelta(t, 380*time.Millisecond, rs[5].Interval, float64(25*time.Millisecond), "pod-5's interval")
		assert.Equal(t, st.MaxInterval, maxInterval(rs))

		// pod-1 hangs from here: each scrape holds the slot for the
		// timeout (100 ms). After 4 misses it scores 1; the others stay
		// usable all along.
		tr.set("pod-1", podHang)
		missed := false
		for step := range 600 {
			synctest.Wait()
			r1 := p.Readings()[1]
			if r1.Failures >= p.missK {
				missed = true
			}
			look(fmt.Sprintf("hang step %d (pod-1 failures %d)", step, r1.Failures), missed)
			if t.Failed() {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		assert.True(t, missed, "the hung pod missed 4 scrapes in 6 s")
		require.NoError(t, p.Close())
	})
}

func maxInterval(rs []PodReading) time.Duration {
	var m time.Duration
	for _, r := range rs {
		m = max(m, r.Interval)
	}
	return m
}

// TestPollerRescoreAfterRunReadsOne: once Run has returned, the pool reads 1
// whatever is rescored (Rescore, SetEndpoints), as documented, until a Scrape
// brings fresh readings again.
func TestPollerRescoreAfterRunReadsOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &backlogTransport{how: map[string]podBehaviour{}}
		eps := []string{"http://pod-0/metrics", "http://pod-1/metrics"}
		p, err := NewPoller(PollerConfig{Endpoints: eps, Client: &http.Client{Transport: tr}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(DefaultInterval)
		synctest.Wait()
		assert.Equal(t, 0.5, p.Saturation(), "running")
		cancel()
		<-done
		assert.Equal(t, 1.0, p.Saturation(), "after Run returned")
		p.Rescore()
		assert.Equal(t, 1.0, p.Saturation(), "Rescore after Run returned")
		require.NoError(t, p.SetEndpoints(eps[:1]))
		assert.Equal(t, 1.0, p.Saturation(), "SetEndpoints after Run returned")
		require.NoError(t, p.Scrape(context.Background()))
		assert.Equal(t, 0.5, p.Saturation(), "a Scrape reads the pods again")
		// And a Start/Close cycle ends at 1 as well.
		require.NoError(t, p.Start())
		synctest.Wait()
		require.NoError(t, p.Close())
		p.Rescore()
		assert.Equal(t, 1.0, p.Saturation(), "Rescore after Close")
	})
}

// TestLatencyMedian: the latency estimate settles near the median of its
// samples, and timeouts of a minority of scrapes (here 30 %) raise it only
// to a quantile of the healthy ones, never towards the timeout.
func TestLatencyMedian(t *testing.T) {
	var l latency
	// Samples 1..100 ms in a scrambled order, many times over.
	for k := range 200 * 100 {
		l.observe(time.Duration((k*37)%100+1) * time.Millisecond)
	}
	m := time.Duration(l.median.Load())
	assert.InDelta(t, 50*time.Millisecond, m, float64(10*time.Millisecond), "median of 1..100 ms")
	assert.Equal(t, max(TimeoutLatencyFactor*m, 100*time.Millisecond), l.timeout(100*time.Millisecond))
	for k := range 200 * 100 {
		if k%10 < 3 {
			l.observe(time.Second) // a timeout
		} else {
			l.observe(time.Duration((k*37)%100+1) * time.Millisecond)
		}
	}
	// 30 % above everything: the estimate sits where 50 % of all samples
	// lie below, the 71st percentile of the healthy ones (~71 ms).
	m = time.Duration(l.median.Load())
	assert.InDelta(t, 71*time.Millisecond, m, float64(12*time.Millisecond), "with 30 %% timeouts")
	assert.Equal(t, MaxTimeoutGrowth*10*time.Millisecond, l.timeout(10*time.Millisecond), "capped")
	// Every scrape timing out at 1 s: the estimate rises to 1 s and no
	// further.
	for range 10000 {
		l.observe(time.Second)
	}
	m = time.Duration(l.median.Load())
	assert.LessOrEqual(t, m, time.Second+time.Second/16)
	assert.GreaterOrEqual(t, m, time.Second-time.Second/16)
}

// TestLatencyMedianProperty: against the sorted samples, whatever their
// distribution and order, the estimate stays within [min, max] of the
// samples (with its 1/16 step of slack), and after enough samples drawn
// from a fixed set it lies between their 10th and 90th percentiles.
func TestLatencyMedianProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vals := rapid.SliceOfN(rapid.Int64Range(1, int64(10*time.Second)), 1, 50).Draw(t, "values")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0)) // the order of the samples
		var l latency
		lo, hi := vals[0], vals[0]
		for range 4000 {
			v := vals[rng.IntN(len(vals))]
			lo, hi = min(lo, v), max(hi, v)
			l.observe(time.Duration(v))
			m := l.median.Load()
			if m < lo-lo/16-1 || m > hi+hi/16+1 {
				t.Fatalf("estimate %v outside the samples' [%v, %v]", time.Duration(m), time.Duration(lo), time.Duration(hi))
			}
		}
		sorted := slices.Clone(vals)
		slices.Sort(sorted)
		p10, p90 := sorted[len(sorted)/10], sorted[(len(sorted)*9)/10]
		if m := l.median.Load(); m < p10-p10/8 || m > p90+p90/8 {
			t.Fatalf("estimate %v outside the 10th..90th percentiles [%v, %v] of %v",
				time.Duration(m), time.Duration(p10), time.Duration(p90), sorted)
		}
	})
}
