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
// it (no HTTP): the result path Run and Scrape use.
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

// exactReleased is the O(pods) reference: Scorer.PoolReleased over the
// poller's readings with each pod's in-flight count taken from the model
// (own, plus the peers' in the optional second map) and the requests
// released to the pool without an endpoint (Inc).
func exactReleased(p *Poller, counts map[string]int64, released int64, peers ...map[string]int64) float64 {
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
	return p.scorer.PoolReleased(rs, p.cfg.Now(), released)
}

// creditTolerance is the documented bound (2^−25) plus float rounding.
func creditTolerance(_ *Poller, exact float64) float64 {
	return math.Ldexp(1, -25) + 1e-9*max(1, math.Abs(exact))
}

// excessAtRest is Σ c_i(f_i) recomputed from every pod's word and hinge:
// what the live excess must hold when no operation is half done.
func excessAtRest(t tb, p *Poller) int64 { return atRest(t, p, (*creditHinge).excess) }

// overAtRest is Σ max(0, f_i − T_i) recomputed the same way: what the live
// over count must hold at rest.
func overAtRest(t tb, p *Poller) int64 { return atRest(t, p, (*creditHinge).overUnits) }

// atRest sums term(hinge, count) over every pod's word and the hinge it
// names.
func atRest(t tb, p *Poller, term func(*creditHinge, uint64) int64) int64 {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum int64
	for _, c := range *p.live.byEndpoint.Load() {
		w := c.word.Load()
		h := c.hinge(w)
		require.NotNil(t, h, "at rest the word names the hinge in its slot")
		sum += term(h, w>>creditCountShift)
	}
	return sum
}

func requireExact(t tb, p *Poller, counts map[string]int64, what string, peers ...map[string]int64) {
	t.Helper()
	requireExactReleased(t, p, counts, 0, what, peers...)
}

func requireExactReleased(t tb, p *Poller, counts map[string]int64, released int64, what string, peers ...map[string]int64) {
	t.Helper()
	exact, got := exactReleased(p, counts, released, peers...), p.Saturation()
	if math.IsInf(exact, 1) || math.IsInf(got, 1) {
		require.Equal(t, exact, got, what)
		return
	}
	tol := creditTolerance(p, exact)
	if released > 0 {
		// The pods' counts beyond their thresholds are held in units of
		// 2^−24 request: 2^−25 per pod at most, times the slope.
		p.mu.Lock()
		tol += float64(len(p.order)) * math.Ldexp(1, -25) * p.live.snap.Load().slope * (1 + 1e-9)
		p.mu.Unlock()
	}
	require.InDelta(t, exact, got, tol, "%s: live %v, exact %v", what, got, exact)
}

// TestLiveCreditMatchesFormula: after every operation (dispatches,
// completions, scrape results good and failed, ageing, endpoint changes,
// peers' counts) the O(1) saturation equals Scorer.Pool over the readings
// with the live counts, within the documented bound, with the prompt-token
// term (each pod its own slope, moving with its mean prompt) and every
// Projection; and the excess is Σ c_i(f_i) of the pods' words.
func TestLiveCreditMatchesFormula(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		sc := Scorer{
			QueueDepthThreshold:  rapid.SampledFrom([]float64{0, 0.5, 1, 2.5, 5, 6.25, 7.3, 64}).Draw(t, "q"),
			KVUtilThreshold:      rapid.SampledFrom([]float64{0, 0.3, 0.8, 1}).Draw(t, "kv"),
			IgnoreStale:          rapid.Bool().Draw(t, "ignoreStale"),
			InFlightCredit:       rapid.Float64Range(0, 1).Draw(t, "credit") < 0.9,
			PromptTokenThreshold: rapid.SampledFrom([]float64{0, 1, 300, 4096}).Draw(t, "promptThreshold"),
			Projection:           rapid.SampledFrom([]KVProjection{ProjectNone, ProjectCompletion, ProjectSteady}).Draw(t, "projection"),
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
		var released int64 // Inc without Dec: requests released to the pool
		for i := range rapid.IntRange(1, 120).Draw(t, "ops") {
			ep := rapid.SampledFrom(universe).Draw(t, "ep")
			var what string
			switch op := rapid.IntRange(0, 12).Draw(t, "op"); op {
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
					KVUsage: rapid.OneOf(rapid.Float64Range(0, 1.2), value).Draw(t, "kvu"),
					// Prompt means up to 4,000 tokens keep every pod's
					// credit below the 2^20 hold (at most 120 requests
					// at a slope of 4,000 with PromptTokenThreshold 1).
					PromptMean: rapid.SampledFrom([]float64{0, 1, 39, 1176, 4000, math.NaN()}).Draw(t, "p"),
					OutputMean: rapid.SampledFrom([]float64{0, 10, 500}).Draw(t, "o"),
					KVCapacity: rapid.SampledFrom([]float64{0, 1e3, 1e5}).Draw(t, "capacity")}
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
			case 11:
				// Scorer.PoolReleased has no notion of peers: the
				// reference holds for a single gateway.
				if cfg.PeerInFlight != nil {
					continue
				}
				p.Inc()
				released++
				what = "release"
			case 12:
				if released == 0 {
					continue
				}
				p.Dec()
				released--
				what = "release done"
			}
			requireExactReleased(t, p, scored(), released, fmt.Sprintf("op %d (%s)", i, what), scoredPeers())
			require.Equal(t, excessAtRest(t, p), p.live.excess.Load(), "op %d (%s): excess = Σ c_i(f_i)", i, what)
			require.Equal(t, overAtRest(t, p), p.live.over.Load(), "op %d (%s): over = Σ max(0, f_i − T_i)", i, what)
			for e, n := range counts {
				require.Equal(t, n, p.InFlight(e), e)
			}
			for _, r := range p.Readings() {
				require.Equal(t, counts[r.Endpoint]+peers[r.Endpoint], r.InFlight, r.Endpoint)
			}
		}
		// Draining every request leaves no credit at all.
		for ; released > 0; released-- {
			p.Dec()
		}
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
	p, err := NewPoller(PollerConfig{Endpoints: eps, Now: clk.Now,
		Scorer: Scorer{InFlightCredit: true, PromptTokenThreshold: DefaultPromptTokenThreshold}})
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
			// The mean prompt moves each pod's slope (1/Q up to
			// 8000/4096) as the threshold moves.
			inject(t, p, ep, Reading{Waiting: float64(rng.IntN(6)), Running: float64(rng.IntN(6)),
				KVUsage: rng.Float64(), PromptMean: float64(rng.IntN(8000))}, nil)
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
	for _, ep := range eps {
		require.Equal(t, counts[ep], p.InFlight(ep), ep)
	}
	require.Equal(t, excessAtRest(t, p), p.live.excess.Load(), "excess = Σ c_i(f_i) at rest")
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

// TestCreditHingeExcess: c(f) = slope · max(0, f − t) in units of 2^−24
// score, rounded, held at 2^20 scores, 0 for the no-credit hinge.
func TestCreditHingeExcess(t *testing.T) {
	h := creditHinge{t: 2.5, slope: 0.2}
	require.Zero(t, h.excess(0))
	require.Zero(t, h.excess(2))
	require.Equal(t, int64(math.Round(0.5*0.2*creditUnit)), h.excess(3))
	require.Equal(t, int64(math.Round(7.5*0.2*creditUnit)), h.excess(10))
	require.Zero(t, noCredit.excess(maxPodInFlight), "the largest count never passes 'never'")
	big := creditHinge{t: 0, slope: 1e6}
	require.Equal(t, int64(maxPodCredit), big.excess(2), "held at 2^20 scores")
	require.Equal(t, int64(maxPodCredit), (&creditHinge{slope: math.Inf(1)}).excess(1))
	// A pool of 2^19 − 1 pods each at the hold sums within an int64.
	require.LessOrEqual(t, uint64(maxPodCredit)*(1<<19-1), uint64(math.MaxInt64))
}

// TestCreditHingeOfScorer: the hinge the poller stores for a reading is
// Scorer.Pod's credit at every count: base + m·max(0, f − T), m the larger
// of 1/Q and the prompt-token slope, with and without a Projection.
func TestCreditHingeOfScorer(t *testing.T) {
	now := time.Unix(1, 0)
	for _, tc := range []struct {
		name      string
		s         Scorer
		r         Reading
		wantSlope float64
	}{
		{"queue leads", Scorer{InFlightCredit: true}, Reading{Waiting: 4, Running: 2, KVUsage: 0.3}, 1.0 / 5},
		{"KV leads", Scorer{InFlightCredit: true}, Reading{Waiting: 1, Running: 2, KVUsage: 0.6}, 1.0 / 5},
		{"prompt term leads", Scorer{InFlightCredit: true, QueueDepthThreshold: 6.25, PromptTokenThreshold: 4096},
			Reading{Waiting: 4, Running: 2, KVUsage: 0.3, PromptMean: 1000}, 1000.0 / 4096},
		{"prompt term below the queue's", Scorer{InFlightCredit: true, PromptTokenThreshold: 4096},
			Reading{Waiting: 4, Running: 2, KVUsage: 0.3, PromptMean: 200}, 1.0 / 5},
		{"steady projection leads", Scorer{InFlightCredit: true, PromptTokenThreshold: 4096, Projection: ProjectSteady},
			Reading{Waiting: 1, Running: 40, KVUsage: 0.2, PromptMean: 1000, OutputMean: 500, KVCapacity: 5e4}, 1000.0 / 4096},
	} {
		tc.r.OK, tc.r.At = true, now
		th, slope := tc.s.creditHinge(tc.r)
		require.InDelta(t, tc.wantSlope, slope, 1e-15, tc.name)
		off := tc.s
		off.InFlightCredit = false
		base := off.Pod(tc.r, now)
		for f := int64(0); f < 40; f++ {
			r := tc.r
			r.InFlight = f
			want := base + slope*max(0, float64(f)-th)
			require.InDelta(t, want, tc.s.Pod(r, now), 1e-12*max(1, want), "%s: f %d (T %v)", tc.name, f, th)
		}
	}
}

// TestLiveCreditSaturatesCount: past the 24-bit count, Dispatched refuses
// and says so, and the count stays consistent.
func TestLiveCreditSaturatesCount(t *testing.T) {
	p, err := NewPoller(PollerConfig{Endpoints: []string{"http://a/metrics"}, Scorer: Scorer{InFlightCredit: true}})
	require.NoError(t, err)
	c := p.pods["http://a/metrics"].cr
	c.word.Store(uint64(maxPodInFlight-1) << creditCountShift) // generation 0: no credit
	require.True(t, p.Dispatched("http://a/metrics"))
	require.False(t, p.Dispatched("http://a/metrics"))
	require.Equal(t, uint64(1), p.Unbalanced())
	require.Equal(t, int64(maxPodInFlight), p.InFlight("http://a/metrics"))
}

// BenchmarkInFlightCredit: one dispatch, one saturation read and one
// completion, as a proxy does per forwarded request (Dispatched/Finished).
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
