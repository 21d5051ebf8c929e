package saturation

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// tb is what both *testing.T and *rapid.T offer.
type tb interface {
	require.TestingT
	Helper()
}

// inject applies a scrape result to endpoint ep as if a scrape had returned
// it (no HTTP): the result path Run and Poll use.
func inject(t tb, p *Poller, ep string, r Reading, err error) {
	t.Helper()
	p.mu.Lock()
	pd := p.pods[ep]
	p.mu.Unlock()
	require.NotNil(t, pd, ep)
	now := p.cfg.Now()
	if err == nil {
		r.OK, r.At = true, now
	}
	p.apply(pd, scrapeResult{r: r, start: now, err: err})
}

// exactPool is the O(pods) reference: Scorer.Pool over the poller's readings
// with each pod's in-flight count taken from the model (own, plus the
// peers' in the optional second map).
func exactPool(p *Poller, counts map[string]int64, peers ...map[string]int64) float64 {
	p.mu.Lock()
	rs := make([]Reading, 0, len(p.order))
	for _, pd := range p.order {
		r := pd.Reading
		r.InFlight = counts[pd.Endpoint]
		for _, m := range peers {
			r.InFlight += m[pd.Endpoint]
		}
		rs = append(rs, r)
	}
	p.mu.Unlock()
	return p.scorer.Pool(rs, p.cfg.Now())
}

// creditTolerance is the documented bound (2^−17/Q) plus float rounding.
func creditTolerance(p *Poller, exact float64) float64 {
	q := p.scorer.withDefaults().QueueDepthThreshold
	return math.Ldexp(1, -17)/q + 1e-9*max(1, math.Abs(exact))
}

func requireExact(t tb, p *Poller, counts map[string]int64, what string, peers ...map[string]int64) {
	t.Helper()
	exact, got := exactPool(p, counts, peers...), p.Saturation()
	if math.IsInf(exact, 1) || math.IsInf(got, 1) {
		require.Equal(t, exact, got, what)
		return
	}
	require.InDelta(t, exact, got, creditTolerance(p, exact), "%s: live %v, exact %v", what, got, exact)
}

// TestLiveCreditMatchesFormula: after every operation (dispatches,
// completions, scrape results good and failed, ageing, endpoint changes) the
// O(1) saturation equals Scorer.Pool over the readings with the live counts,
// within the documented bound.
func TestLiveCreditMatchesFormula(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		sc := Scorer{
			QueueDepthThreshold: rapid.SampledFrom([]float64{0, 0.5, 1, 2.5, 5, 7.3, 64}).Draw(t, "q"),
			KVUtilThreshold:     rapid.SampledFrom([]float64{0, 0.3, 0.8, 1}).Draw(t, "kv"),
			IgnoreStale:         rapid.Bool().Draw(t, "ignoreStale"),
			InFlightCredit:      rapid.Float64Range(0, 1).Draw(t, "credit") < 0.9,
		}
		universe := make([]string, rapid.IntRange(1, 6).Draw(t, "universe"))
		for i := range universe {
			universe[i] = fmt.Sprintf("http://pod%d/metrics", i)
		}
		peers := map[string]int64{} // other replicas' requests, read at scoring
		cfg := PollerConfig{Endpoints: universe, Now: clk.Now, Scorer: sc,
			FailFast: rapid.Bool().Draw(t, "failFast")}
		if rapid.Bool().Draw(t, "peers") {
			cfg.PeerInFlight = func(ep string) int64 { return peers[ep] }
		}
		p, err := NewPoller(cfg)
		require.NoError(t, err)
		current := map[string]bool{}
		for _, ep := range universe {
			current[ep] = true
		}
		counts := map[string]int64{}
		// Credit is scored only with InFlightCredit; the model's counts
		// are always kept (Readings shows them).
		scored := func() map[string]int64 {
			if sc.InFlightCredit {
				return counts
			}
			return nil
		}
		scoredPeers := func() map[string]int64 {
			if sc.InFlightCredit {
				return peers
			}
			return nil
		}
		value := rapid.OneOf(
			rapid.Float64Range(0, 20),
			rapid.Map(rapid.IntRange(0, 20), func(i int) float64 { return float64(i) }),
			rapid.SampledFrom([]float64{0, 1e300, math.NaN(), -1}),
		)
		for i := range rapid.IntRange(1, 120).Draw(t, "ops") {
			ep := rapid.SampledFrom(universe).Draw(t, "ep")
			var what string
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); op {
			case 0, 1, 2:
				ok := p.Dispatched(ep)
				require.Equal(t, current[ep], ok, "Dispatched on a known endpoint")
				if ok {
					counts[ep]++
				}
				what = "dispatch " + ep
			case 3, 4:
				ok := p.Finished(ep)
				want := counts[ep] > 0
				if ok && !want {
					t.Fatalf("Finished(%s) true with nothing in flight", ep)
				}
				if want {
					require.True(t, ok)
					counts[ep]--
				}
				what = "finish " + ep
			case 5, 6:
				if !current[ep] {
					continue
				}
				r := Reading{Waiting: value.Draw(t, "w"), Running: value.Draw(t, "r"),
					KVUsage: rapid.OneOf(rapid.Float64Range(0, 1.2), value).Draw(t, "kvu")}
				inject(t, p, ep, r, nil)
				what = "reading " + ep
			case 7:
				if !current[ep] {
					continue
				}
				inject(t, p, ep, Reading{}, fmt.Errorf("scrape: %w", ErrHTTPStatus))
				what = "failed scrape " + ep
			case 8:
				clk.Advance(time.Duration(rapid.IntRange(0, 300).Draw(t, "ms")) * time.Millisecond)
				p.Rescore()
				what = "age"
			case 9:
				var eps []string
				for _, e := range universe {
					if rapid.Bool().Draw(t, "keep") {
						eps = append(eps, e)
					}
				}
				require.NoError(t, p.SetEndpoints(eps))
				current = map[string]bool{}
				for _, e := range eps {
					current[e] = true
				}
				for e, n := range counts {
					if !current[e] && n == 0 {
						delete(counts, e) // dropped: resumes at 0
					}
				}
				what = fmt.Sprintf("set %v", eps)
			case 10:
				if cfg.PeerInFlight == nil {
					continue
				}
				peers[ep] = int64(rapid.IntRange(-2, 30).Draw(t, "peers"))
				p.Rescore()
				if peers[ep] < 0 {
					peers[ep] = 0 // counts as 0
				}
				what = fmt.Sprintf("peers %s %d", ep, peers[ep])
			}
			requireExact(t, p, scored(), fmt.Sprintf("op %d (%s)", i, what), scoredPeers())
			for e, n := range counts {
				require.Equal(t, n, p.InFlight(e), e)
			}
			for _, r := range p.Readings() {
				require.Equal(t, counts[r.Endpoint]+peers[r.Endpoint], r.InFlight, r.Endpoint)
			}
		}
		// Draining every request leaves no credit at all.
		for e, n := range counts {
			for range n {
				require.True(t, p.Finished(e))
			}
		}
		requireExact(t, p, nil, "drained", scoredPeers())
		if cfg.PeerInFlight == nil {
			require.Zero(t, p.live.excess.Load())
		}
	})
}

// TestLiveCreditRace: many goroutines dispatch and finish on few pods while
// scrape results and rescores move every pod's threshold. Afterwards every
// count is exact, the excess is exactly the sum of the hinges, and the
// saturation equals the exact formula; drained, the excess is 0.
func TestLiveCreditRace(t *testing.T) {
	clk := newFakeClock()
	eps := []string{"http://a/metrics", "http://b/metrics", "http://c/metrics"}
	p, err := NewPoller(PollerConfig{Endpoints: eps, Now: clk.Now, Scorer: Scorer{InFlightCredit: true}})
	require.NoError(t, err)
	for _, ep := range eps {
		inject(t, p, ep, Reading{Waiting: 1, Running: 2, KVUsage: 0.3}, nil)
	}
	workers, ops := 8, 20000*scale()
	if raceSlowdown > 1 {
		ops /= 4
	}
	left := make([][3]int64, workers) // what each worker leaves in flight
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // results and rescores, as Run would deliver them
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for !stop.Load() {
			ep := eps[rng.IntN(len(eps))]
			inject(t, p, ep, Reading{Waiting: float64(rng.IntN(6)), Running: float64(rng.IntN(6)),
				KVUsage: rng.Float64()}, nil)
			if rng.IntN(8) == 0 {
				p.Rescore()
			}
		}
	}()
	var workersWG sync.WaitGroup
	for w := range workers {
		workersWG.Add(1)
		go func() {
			defer workersWG.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine [3]int64
			for range ops {
				i := rng.IntN(len(eps))
				if mine[i] > 0 && rng.IntN(2) == 0 {
					if !p.Finished(eps[i]) {
						panic("Finished lost a request")
					}
					mine[i]--
				} else if p.Dispatched(eps[i]) {
					mine[i]++
				}
				_ = p.Saturation()
			}
			left[w] = mine
		}()
	}
	workersWG.Wait()
	stop.Store(true)
	wg.Wait()

	counts := map[string]int64{}
	for _, m := range left {
		for i, n := range m {
			counts[eps[i]] += n
		}
	}
	var hinges int64
	for _, ep := range eps {
		require.Equal(t, counts[ep], p.InFlight(ep), ep)
		hinges += hinge(p.pods[ep].cr.word.Load())
	}
	require.Equal(t, hinges, p.live.excess.Load(), "excess = Σ hinge at rest")
	require.Zero(t, p.Unbalanced())
	requireExact(t, p, counts, "at rest")

	// Drain concurrently, one goroutine per worker.
	for w := range workers {
		workersWG.Add(1)
		go func() {
			defer workersWG.Done()
			for i, n := range left[w] {
				for range n {
					p.Finished(eps[i])
				}
			}
		}()
	}
	workersWG.Wait()
	for _, ep := range eps {
		require.Zero(t, p.InFlight(ep), ep)
	}
	require.Zero(t, p.live.excess.Load())
	require.Zero(t, p.Unbalanced())
	requireExact(t, p, nil, "drained")
}

// TestQuantizeThreshold: the stored threshold's rounding and range.
func TestQuantizeThreshold(t *testing.T) {
	require.Equal(t, uint64(0), quantizeThreshold(0))
	require.Equal(t, uint64(0), quantizeThreshold(math.NaN()))
	require.Equal(t, uint64(3*creditUnit), quantizeThreshold(3))
	require.Equal(t, uint64(creditUnit/2), quantizeThreshold(0.5))
	require.Equal(t, uint64(creditTMask), quantizeThreshold(1<<24))
	require.Equal(t, uint64(creditTMask), quantizeThreshold(math.Inf(1)))
	// The largest count never passes the "never" threshold.
	require.Zero(t, hinge(uint64(maxPodInFlight)<<creditCountShift|creditTMask))
	require.Equal(t, int64(creditUnit/2), hinge(3<<creditCountShift|quantizeThreshold(2.5)))
}

// TestLiveCreditSaturatesCount: past the 24-bit count, Dispatched refuses
// and says so, and the count stays consistent.
func TestLiveCreditSaturatesCount(t *testing.T) {
	p, err := NewPoller(PollerConfig{Endpoints: []string{"http://a/metrics"}, Scorer: Scorer{InFlightCredit: true}})
	require.NoError(t, err)
	c := p.pods["http://a/metrics"].cr
	c.word.Store(uint64(maxPodInFlight-1)<<creditCountShift | creditTMask)
	require.True(t, p.Dispatched("http://a/metrics"))
	require.False(t, p.Dispatched("http://a/metrics"))
	require.Equal(t, uint64(1), p.Unbalanced())
	require.Equal(t, int64(maxPodInFlight), p.InFlight("http://a/metrics"))
}

// BenchmarkInFlightCredit: one dispatch, one saturation read and one
// completion, as a proxy does per forwarded request. "hook+Rescore" is the
// old path (PollerConfig.InFlight read by a Rescore after each dispatch,
// as examples/proxy did); "live" is Dispatched/Finished.
func BenchmarkInFlightCredit(b *testing.B) {
	for _, pods := range []int{8, 64} {
		eps := make([]string, pods)
		for i := range eps {
			eps[i] = fmt.Sprintf("http://10.0.0.%d:8000/metrics", i)
		}
		fill := func(p *Poller) {
			for _, ep := range eps {
				inject(b, p, ep, Reading{Waiting: 1, Running: 3, KVUsage: 0.3}, nil)
			}
		}
		b.Run(fmt.Sprintf("pods=%d/hook+Rescore", pods), func(b *testing.B) {
			counts := make(map[string]*atomic.Int64, pods)
			for _, ep := range eps {
				counts[ep] = new(atomic.Int64)
			}
			p, err := NewPoller(PollerConfig{Endpoints: eps, Scorer: Scorer{InFlightCredit: true},
				InFlight: func(ep string) int64 { return counts[ep].Load() }})
			require.NoError(b, err)
			fill(p)
			b.ReportAllocs()
			var sink float64
			i := 0
			for b.Loop() {
				c := counts[eps[i%pods]]
				c.Add(1)
				p.Rescore()
				sink += p.Saturation()
				c.Add(-1)
				i++
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("pods=%d/live", pods), func(b *testing.B) {
			p, err := NewPoller(PollerConfig{Endpoints: eps, Scorer: Scorer{InFlightCredit: true}})
			require.NoError(b, err)
			fill(p)
			b.ReportAllocs()
			var sink float64
			i := 0
			for b.Loop() {
				ep := eps[i%pods]
				p.Dispatched(ep)
				sink += p.Saturation()
				p.Finished(ep)
				i++
			}
			_ = sink
		})
	}
	b.Run("pods=64/live/parallel", func(b *testing.B) {
		eps := make([]string, 64)
		for i := range eps {
			eps[i] = fmt.Sprintf("http://10.0.0.%d:8000/metrics", i)
		}
		p, err := NewPoller(PollerConfig{Endpoints: eps, Scorer: Scorer{InFlightCredit: true}})
		require.NoError(b, err)
		for _, ep := range eps {
			inject(b, p, ep, Reading{Waiting: 1, Running: 3, KVUsage: 0.3}, nil)
		}
		var next atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := next.Add(1)
			var sink float64
			for pb.Next() {
				ep := eps[i%64]
				p.Dispatched(ep)
				sink += p.Saturation()
				p.Finished(ep)
				i++
			}
			_ = sink
		})
	})
}

// TestLiveCreditAllocs: a dispatch, a read and a completion allocate nothing.
func TestLiveCreditAllocs(t *testing.T) {
	p, err := NewPoller(PollerConfig{Endpoints: []string{"http://a/metrics"}, Scorer: Scorer{InFlightCredit: true}})
	require.NoError(t, err)
	inject(t, p, "http://a/metrics", Reading{Waiting: 1, Running: 3, KVUsage: 0.3}, nil)
	var sink float64
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		p.Dispatched("http://a/metrics")
		sink += p.Saturation()
		p.Finished("http://a/metrics")
	}))
	_ = sink
}

// TestReadingSeq: every applied result advances the sequence, failed ones
// included; a result for a pod removed meanwhile, a rescore and the credit
// do not.
func TestReadingSeq(t *testing.T) {
	p, err := NewPoller(PollerConfig{Endpoints: []string{"http://a/metrics", "http://b/metrics"}})
	require.NoError(t, err)
	require.Zero(t, p.ReadingSeq())
	inject(t, p, "http://a/metrics", Reading{Waiting: 1}, nil)
	require.Equal(t, uint64(1), p.ReadingSeq())
	inject(t, p, "http://a/metrics", Reading{}, fmt.Errorf("scrape: %w", ErrHTTPStatus))
	require.Equal(t, uint64(2), p.ReadingSeq(), "a failure is a result")
	p.mu.Lock()
	b := p.pods["http://b/metrics"]
	p.mu.Unlock()
	require.NoError(t, p.SetEndpoints([]string{"http://a/metrics"}))
	now := p.cfg.Now()
	p.apply(b, scrapeResult{r: Reading{OK: true, At: now}, start: now})
	require.Equal(t, uint64(2), p.ReadingSeq(), "a result of a removed pod is dropped")
	p.Rescore()
	p.Dispatched("http://a/metrics")
	require.Equal(t, uint64(2), p.ReadingSeq())
}
