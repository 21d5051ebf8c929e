package saturation

import (
	"math"
	"sync/atomic"
)

// The live in-flight credit.
//
// With Scorer.InFlightCredit a fresh pod with w waiting, r running and f
// requests in flight scores
//
//	pod(f) = max(kv', (w + e)/Q, (w + e)·p/PT)    e = max(0, f − (w + r))
//
// kv' its KV term (KV usage, projected as Scorer.Projection says, over
// KVUtilThreshold), p its mean prompt length and PT PromptTokenThreshold
// (the third term is absent without PromptTokenThreshold or p: read p/PT as
// 0 then). A credited request is a waiting one in every term. Both queue
// terms are (w + e) times a slope and vanish together, so with
//
//	m = max(1/Q, p/PT)                          the pod's slope
//
// pod(f) = max(kv', (w + e)·m): still a single hinge in f, with a slope of
// its own per pod:
//
//	pod(f) = base + m · max(0, f − T)
//	base   = max(kv', w·m)                      the score without credit
//	T      = w + r + max(0, kv'/m − w)          the count beyond which a request adds m
//
// (for f ≤ w + r the credit is 0; beyond it (w + e)·m = (f − r)·m passes kv'
// at f = r + kv'/m and grows by m per request from the larger of that and
// w + r). The projections change kv' only, from the scraped running count,
// never from f, so the credit stays this hinge with every Projection. So the
// pool mean is
//
//	pool = (Σ base_i + Σ c_i(f_i)) / n        c_i(f) = m_i · max(0, f − T_i)
//
// The first sum changes only when a scrape result arrives or the pool is
// rescored (under the poller's lock); the second, the pool's excess, is kept
// in one atomic integer, in units of 2^−24 of a score. Each pod holds its
// count f and the generation g of its hinge (T_i, m_i) in one atomic word,
// and the hinge itself, immutable, in one of two slots by the parity of g,
// published before any word names it. A dispatch or completion loads the
// word, then the hinge its generation names (a slot holding a newer
// generation means the word has moved on: reload), and compare-and-swaps
// (f, g) → (f ± 1, g): the swap succeeds only if the word still is (f, g),
// so it yields exactly that transition under that hinge, and one atomic add
// of c(f ± 1) − c(f) follows. Changing a pod's hinge (under the lock, so one
// at a time) publishes the new one in the other slot, swaps (f, g) →
// (f, g + 1) and adds c_new(f) − c_old(f), the same way. The excess is
// therefore exactly Σ c_i(f_i) whenever no operation is half done, whatever
// the interleaving: every c is a function of the pod's state alone, so every
// rounding in it is undone by the transition that leaves the state.
//
// The approximations: c is rounded to the nearest 2^−24 of a score, so a
// pod's credit is off by at most 2^−25 (3·10^−8) and so is the pool mean (a
// mean of such errors), beside float rounding; and c is held at 2^20 (a
// pod whose credit alone is past 2^20 saturates any pool of fewer than a
// million pods by itself), which keeps Σ c within an int64 for pools of
// fewer than 2^19 (524,288) pods. Counts are held in 24 bits (at most
// 16,777,215 requests in flight to one pod) and generations in 40: a
// reader holding a word from 2^40 hinge changes ago, with the count back
// where it was, is the one interleaving that could pass unnoticed. A hinge
// change allocates its immutable hinge (under the lock, only when T or m
// moved); dispatches, completions and reads allocate nothing.
const (
	creditCountShift = 40                           // the count lives above the generation
	creditGenMask    = 1<<creditCountShift - 1      // the generation bits
	maxPodInFlight   = 1<<(64-creditCountShift) - 1 // 16,777,215
	creditScoreBits  = 24                           // the excess in units of 2^−24 score
	creditUnit       = 1 << creditScoreBits         // one score in the excess' units
	maxPodCredit     = bigScore * creditUnit        // c_i is held at 2^20 scores
)

// creditScale turns the excess into score units.
const creditScale = 1.0 / creditUnit

// creditHinge is one pod's credit as a function of its in-flight count:
// slope · max(0, f − t). Immutable once published.
type creditHinge struct {
	gen   uint64  // the generation (low 40 bits) whose word it belongs to
	t     float64 // T: beyond this count a request adds slope (+Inf: never)
	slope float64 // m: score per request beyond T (> 0; 0 with t = +Inf)
}

// excess returns c(f), the pod's credit at count f in units of 2^−24
// score: rounded, never negative, at most maxPodCredit. A pure function of
// (f, t, slope): the transitions' additions cancel exactly.
func (h *creditHinge) excess(f uint64) int64 {
	x := float64(f)
	if !(x > h.t) {
		return 0 // also t = +Inf: no credit
	}
	v := (x - h.t) * h.slope * creditUnit
	if !(v < maxPodCredit) {
		return maxPodCredit // also +Inf (a slope of 1/Q for a denormal Q)
	}
	return int64(v + 0.5)
}

// credit is one endpoint's live in-flight count and credit hinge.
type credit struct {
	word    atomic.Uint64 // count<<creditCountShift | generation of the hinge in force
	hinges  [2]atomic.Pointer[creditHinge]
	removed atomic.Bool // the endpoint left the set: Finished only
}

// noCredit is the hinge of a pod without credit (failed, stale, scoring
// +Inf, credit off, or removed).
var noCredit = creditHinge{t: math.Inf(1)}

// newCredit returns a count of 0 with no credit.
func newCredit() *credit {
	c := &credit{}
	h := noCredit
	c.hinges[0].Store(&h)
	return c
}

func (c *credit) count() int64 { return int64(c.word.Load() >> creditCountShift) }

// hinge returns the hinge the word w names, or nil when its slot already
// holds a newer one (w is out of date: reload it).
func (c *credit) hinge(w uint64) *creditHinge {
	g := w & creditGenMask
	h := c.hinges[g&1].Load()
	if h.gen != g {
		return nil
	}
	return h
}

// creditHinge returns T and m for a fresh reading (see the comment above):
// the in-flight count beyond which each request raises the pod's score by
// m, its slope, and m = max(1/QueueDepthThreshold, PromptMean /
// PromptTokenThreshold) (the second only with the prompt-token term). T is
// +Inf when kv'/m overflows (a QueueDepthThreshold too large for any count
// to matter).
func (s Scorer) creditHinge(r Reading) (t, slope float64) {
	s = s.withDefaults()
	slope = 1 / s.QueueDepthThreshold
	if s.PromptTokenThreshold > 0 && r.PromptMean > 0 && r.PromptMean <= maxFinite {
		// As score computes the term: waiting / PT · p.
		slope = max(slope, 1/s.PromptTokenThreshold*r.PromptMean)
	}
	s.InFlightCredit = false
	base := s.score(r) // = max(kv', w·m)
	return r.Waiting + r.Running + max(0, base/slope-r.Waiting), slope
}

// poolSnap is the part of the pool value fixed between two scrape results
// or rescores. Immutable once published.
type poolSnap struct {
	sum    float64 // Σ base over the counted pods with a finite score
	n, inf int     // pods counted; of them, pods scoring +Inf
	// The released credit's hinge (Scorer.PoolReleased): Σ T_i over the
	// usable pods with a finite score, and the pool score of one released
	// request beyond it (their mean slope over n). slope 0: none.
	sumT, slope float64
}

// liveCredit is the lock-free side of the poller.
type liveCredit struct {
	excess atomic.Int64 // Σ c_i(f_i) over the pods, in units of 2^−24 score
	// over is Σ max(0, f_i − T_i) over the pods with a hinge, in units of
	// 2^−24 request: with sumT it is Σ max(f_i, T_i), what the pods
	// already account for of the requests released to the pool.
	over atomic.Int64
	// released counts requests released to the pool and not yet done
	// (Inc, Dec), endpoint unknown.
	released   atomic.Int64
	snap       atomic.Pointer[poolSnap]
	byEndpoint atomic.Pointer[map[string]*credit]
	seq        atomic.Uint64
	unbalanced atomic.Uint64
}

// stoppedSnap reads 1: no pods counted.
var stoppedSnap = &poolSnap{}

func (l *liveCredit) saturation() float64 {
	s := l.snap.Load()
	switch {
	case s.n <= 0:
		return 1
	case s.inf > 0:
		return math.Inf(1)
	}
	// Both terms are clamped at 0: the running sum may drift a hair below
	// it, and a completion's share of the excess may land a moment before
	// its dispatch's.
	v := (max(s.sum, 0) + float64(max(l.excess.Load(), 0))*creditScale) / float64(s.n)
	if s.slope > 0 {
		if u := float64(l.released.Load()); u > s.sumT {
			if e := u - s.sumT - float64(max(l.over.Load(), 0))*creditScale; e > 0 {
				v += e * s.slope
			}
		}
	}
	return v
}

// overUnits is max(0, f − t) in units of 2^−24 request, rounded and held
// at maxPodCredit, as excess is: a pure function of (f, t).
func (h *creditHinge) overUnits(f uint64) int64 {
	x := float64(f)
	if !(x > h.t) {
		return 0
	}
	v := (x - h.t) * creditUnit
	if !(v < maxPodCredit) {
		return maxPodCredit
	}
	return int64(v + 0.5)
}

// move adds the change of a pod's credit and of its count beyond its
// hinge between two (count, hinge) states.
func (l *liveCredit) move(from, to *creditHinge, f, g uint64) {
	if d := to.excess(g) - from.excess(f); d != 0 {
		l.excess.Add(d)
	}
	if d := to.overUnits(g) - from.overUnits(f); d != 0 {
		l.over.Add(d)
	}
}

// inc counts one more request in flight on c (false: the count is at its
// maximum, and the call is counted as unbalanced).
func (l *liveCredit) inc(c *credit) bool {
	for {
		w := c.word.Load()
		f := w >> creditCountShift
		if f == maxPodInFlight {
			l.unbalanced.Add(1)
			return false
		}
		h := c.hinge(w)
		if h == nil {
			continue // a newer hinge is published: w is out of date
		}
		if c.word.CompareAndSwap(w, w+1<<creditCountShift) {
			l.move(h, h, f, f+1)
			return true
		}
	}
}

// dec counts one request finished on c; never below zero (false: the count
// was 0, and the call is counted as unbalanced).
func (l *liveCredit) dec(c *credit) bool {
	for {
		w := c.word.Load()
		f := w >> creditCountShift
		if f == 0 {
			l.unbalanced.Add(1)
			return false
		}
		h := c.hinge(w)
		if h == nil {
			continue
		}
		if c.word.CompareAndSwap(w, w-1<<creditCountShift) {
			l.move(h, h, f, f-1)
			return true
		}
	}
}

// setHinge makes slope · max(0, f − t) c's credit (t = +Inf: none) and
// moves the excess by the change at c's count. Callers hold the poller's
// lock: hinges change one at a time, so the word's generation is the
// latest published and only counts move under it.
func (l *liveCredit) setHinge(c *credit, t, slope float64) {
	if !(t < math.Inf(1)) || !(slope > 0) {
		t, slope = noCredit.t, noCredit.slope // keep NaN out: no credit
	}
	w := c.word.Load()
	old := c.hinge(w)
	if old.t == t && old.slope == slope {
		return // unchanged (most rescores): no allocation
	}
	g := (w + 1) & creditGenMask
	h := &creditHinge{gen: g, t: t, slope: slope}
	c.hinges[g&1].Store(h) // the slot of generation g − 1 is left alone
	for {
		f := w >> creditCountShift
		if c.word.CompareAndSwap(w, f<<creditCountShift|g) {
			l.move(old, h, f, f)
			return
		}
		w = c.word.Load() // a dispatch or completion moved the count
	}
}

// Inc records one request released to the pool whose endpoint the poller
// is not told: flowcontrol.Controller calls it at each release when the
// poller is its Source (and Dec at its done), so the saturation moves before
// any scrape can show the request. Such requests beyond what the pods
// already account for (their counts, or their Dispatched requests) count as
// waiting requests on an average usable pod: Scorer.PoolReleased, exact up
// to 2^−25 of a request per pod times that weight. Lock-free,
// allocation-free.
func (p *Poller) Inc() { p.live.released.Add(1) }

// Dec records that a request Inc counted is done. A Dec without its Inc is
// ignored and counted in Unbalanced.
func (p *Poller) Dec() {
	for {
		v := p.live.released.Load()
		if v <= 0 {
			p.live.unbalanced.Add(1)
			return
		}
		if p.live.released.CompareAndSwap(v, v-1) {
			return
		}
	}
}

// Dispatched records one request sent to endpoint (one of Endpoints, as
// given): from this call on it counts toward the pod's score, with no lock
// and no rescoring: one map look-up, one compare-and-swap and at most one
// atomic add, no allocation. It reports false, counting nothing, for an
// endpoint the poller does not know.
//
// With Scorer.InFlightCredit the pod's score is then, at once, Scorer.Pod
// of its last reading with InFlight the live count: the request counts as
// a waiting one in every term, the prompt-token term included (exact up to
// 2^−25, see Saturation). Without it the count is kept (Readings shows it)
// but not scored. Call Finished
// once for every Dispatched that returned true, when the request ends.
func (p *Poller) Dispatched(endpoint string) bool {
	c := p.lookup(endpoint)
	if c == nil || c.removed.Load() {
		return false
	}
	return p.live.inc(c)
}

// Finished records the end of one request that Dispatched counted on
// endpoint; like Dispatched it is lock-free and allocation-free. A Finished
// with no request in flight on that endpoint is ignored and counted in
// Unbalanced; it reports false then, and for an unknown endpoint.
//
// An endpoint removed by SetEndpoints while requests are in flight to it
// keeps its count (out of the score) until they finish, so their Finished
// calls still land; if it is added back meanwhile, it resumes that count.
// (A Dispatched that races with the SetEndpoints removing its endpoint, on
// an endpoint with nothing else in flight, may land on a count that is
// being dropped: its Finished then reports false. Neither call changes the
// saturation, since the endpoint is out of the score.)
func (p *Poller) Finished(endpoint string) bool {
	c := p.lookup(endpoint)
	if c == nil {
		return false
	}
	return p.live.dec(c)
}

func (p *Poller) lookup(endpoint string) *credit {
	m := p.live.byEndpoint.Load()
	if m == nil {
		return nil
	}
	return (*m)[endpoint]
}

// InFlight returns the number of requests Dispatched to endpoint and not yet
// Finished (0 for an unknown endpoint).
func (p *Poller) InFlight(endpoint string) int64 {
	if c := p.lookup(endpoint); c != nil {
		return c.count()
	}
	return 0
}

// KVUsage returns endpoint's KV-cache usage (vllm:kv_cache_usage_perc,
// 0 to 1) from its last reading, or NaN when the poller does not know the
// endpoint or its pod is not Usable (never scraped, failing, stale): an
// evictor must not take work back from a server on a reading it cannot
// trust. It takes the poller's lock.
func (p *Poller) KVUsage(endpoint string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	pd := p.pods[endpoint]
	if pd == nil || !pd.Usable || !pd.OK {
		return math.NaN()
	}
	return pd.KVUsage
}

// Unbalanced counts Finished calls that found no request in flight on their
// endpoint, and Dispatched calls beyond 2^24 − 1 requests in flight to one
// endpoint; both were ignored. Non-zero means the host's bookkeeping is
// wrong; export it as an error metric.
func (p *Poller) Unbalanced() uint64 { return p.live.unbalanced.Load() }

// ReadingSeq returns the number of scrape results applied so far (Run's
// and Scrape's, failures included: a failed scrape may change the pod's
// score too). It only grows. A dispatcher that paces releases by reading
// compares it with the value it saw last: a change means at least one pod's
// reading changed since. Rescores (ageing) and in-flight credit do not
// advance it. One atomic load.
func (p *Poller) ReadingSeq() uint64 { return p.live.seq.Load() }
