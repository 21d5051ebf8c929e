package saturation

import (
	"math"
	"sync/atomic"
)

// The live in-flight credit.
//
// With Scorer.InFlightCredit a fresh pod scores
//
//	pod(f) = max((w + max(0, f − (w + r))) / Q, kv / K)
//
// for f requests in flight to it. As a function of f this is a hinge:
//
//	pod(f) = base + max(0, f − T) / Q
//	base   = max(w / Q, kv / K)                 the score without credit
//	T      = w + r + max(0, Q·kv/K − w)         the count beyond which a request adds 1/Q
//
// (for f ≤ w + r the credit is 0; beyond it the queue term (w + f − w − r)/Q
// passes the KV term at f = T, and from there grows by 1/Q per request). So
// the pool mean is
//
//	pool = (Σ base_i + Σ max(0, f_i − T_i) / Q) / n
//
// The first sum changes only when a scrape result arrives or the pool is
// rescored (under the poller's lock); the second, the pool's excess, changes
// by at most one unit per dispatch or completion, and is kept in one atomic
// integer: each pod holds its count f and its threshold T (quantised) in one
// atomic word, so a dispatch or completion is one compare-and-swap of that
// word, which yields exactly the transition (f, T) → (f ± 1, T), then at most
// one atomic add of that transition's change of the hinge to the excess.
// Changing a pod's T (under the lock) is the same: one CAS of the word and
// the change of its hinge added. The excess is therefore exactly Σ hinge_i
// whenever no operation is half done, whatever the interleaving.
//
// The one approximation: T is rounded to the nearest 1/65536 of a request
// (the hinge is then integer arithmetic in those units). The credit of a pod
// is off by at most 2^−17 of a request, its score by at most 2^−17/Q, and so
// is the pool mean (a mean of such errors): 1.5e−6 at the default Q of 5.
// Counts are held in 24 bits (at most 16,777,215 requests in flight to one
// pod) and T in 40 bits: a T beyond 2^24 requests can never be reached by a
// count, so it is stored as "never" and the credit stays exactly 0.
const (
	creditFracBits   = 16                           // T in units of 2^−16 request
	creditCountShift = 40                           // the count lives above T
	creditTMask      = 1<<creditCountShift - 1      // the T bits; also "no credit"
	maxPodInFlight   = 1<<(64-creditCountShift) - 1 // 16,777,215
	creditUnit       = 1 << creditFracBits          // one request in T's units
)

// credit is one endpoint's live in-flight count and credit threshold.
type credit struct {
	word    atomic.Uint64 // count<<creditCountShift | T (units of 2^−16 request)
	removed atomic.Bool   // the endpoint left the set: Finished only
}

func (c *credit) count() int64 { return int64(c.word.Load() >> creditCountShift) }

// hinge returns max(0, count − T) of a word in units of 2^−16 request.
func hinge(w uint64) int64 {
	return max(0, int64(w>>creditCountShift)<<creditFracBits-int64(w&creditTMask))
}

// quantizeThreshold turns T (in requests) into its stored form: rounded to
// the nearest 2^−16, and "never" for a T no count can reach (or not a number).
func quantizeThreshold(t float64) uint64 {
	q := math.Round(t * creditUnit)
	if !(q >= 0) {
		return 0 // T ≥ 0 always (counts are ≥ 0); keep NaN out
	}
	if q >= creditTMask {
		return creditTMask
	}
	return uint64(q)
}

// creditThreshold returns T for a fresh reading (see the comment above):
// the in-flight count beyond which each request raises the pod's score by
// 1/QueueDepthThreshold. With Scorer.Projection or PromptTokenThreshold,
// base is the score with those terms (kv projected, the prompt-token term
// of the scraped waiting count) and T the count at which the queue term
// passes it; a credited request then adds 1/Q, not its prompt tokens'
// share (the live credit has one slope per pool), so with
// PromptTokenThreshold the credit is a lower bound of Pool's.
func (s Scorer) creditThreshold(r Reading) float64 {
	s = s.withDefaults()
	if s.Projection == ProjectNone && s.PromptTokenThreshold == 0 {
		return r.Waiting + r.Running + max(0, s.QueueDepthThreshold*(r.KVUsage/s.KVUtilThreshold)-r.Waiting)
	}
	s.InFlightCredit = false
	return r.Waiting + r.Running + max(0, s.QueueDepthThreshold*s.score(r)-r.Waiting)
}

// poolSnap is the part of the pool value fixed between two scrape results
// or rescores. Immutable once published.
type poolSnap struct {
	sum    float64 // Σ base over the counted pods with a finite score
	n, inf int     // pods counted; of them, pods scoring +Inf
}

// liveCredit is the lock-free side of the poller.
type liveCredit struct {
	excess     atomic.Int64 // Σ hinge over the pods, in units of 2^−16 request
	scale      float64      // 1 / (2^16 · Q): excess → score units; set once
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
	return (max(s.sum, 0) + float64(max(l.excess.Load(), 0))*l.scale) / float64(s.n)
}

// inc counts one more request in flight on c (false: the count is at its
// maximum, and the call is counted as unbalanced).
func (l *liveCredit) inc(c *credit) bool {
	for {
		w := c.word.Load()
		if w>>creditCountShift == maxPodInFlight {
			l.unbalanced.Add(1)
			return false
		}
		nw := w + 1<<creditCountShift
		if c.word.CompareAndSwap(w, nw) {
			if d := hinge(nw) - hinge(w); d != 0 {
				l.excess.Add(d)
			}
			return true
		}
	}
}

// dec counts one request finished on c; never below zero (false: the count
// was 0, and the call is counted as unbalanced).
func (l *liveCredit) dec(c *credit) bool {
	for {
		w := c.word.Load()
		if w>>creditCountShift == 0 {
			l.unbalanced.Add(1)
			return false
		}
		nw := w - 1<<creditCountShift
		if c.word.CompareAndSwap(w, nw) {
			if d := hinge(nw) - hinge(w); d != 0 {
				l.excess.Add(d)
			}
			return true
		}
	}
}

// setThreshold replaces c's stored T (quantised) and moves the excess by the
// change of c's hinge.
func (l *liveCredit) setThreshold(c *credit, t uint64) {
	for {
		w := c.word.Load()
		nw := w&^creditTMask | t
		if w == nw {
			return
		}
		if c.word.CompareAndSwap(w, nw) {
			if d := hinge(nw) - hinge(w); d != 0 {
				l.excess.Add(d)
			}
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
// With Scorer.InFlightCredit the pod's score is then, at once,
//
//	max((waiting + max(0, inflight − (waiting + running))) / QueueDepthThreshold,
//	    kv / KVUtilThreshold)
//
// with waiting, running and kv from its last reading (the formula of
// Scorer; exact up to 2^−17/QueueDepthThreshold, see Saturation). Without
// it the count is kept (Readings shows it) but not scored. Call Finished
// once for every Dispatched that returned true, when the request ends.
//
// When PollerConfig.InFlight is set, that hook supplies the counts instead
// and Dispatched and Finished do nothing (and report false).
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
	if p.cfg.InFlight != nil {
		return nil
	}
	m := p.live.byEndpoint.Load()
	if m == nil {
		return nil
	}
	return (*m)[endpoint]
}

// InFlight returns the number of requests Dispatched to endpoint and not yet
// Finished (0 for an unknown endpoint, or when PollerConfig.InFlight is set).
func (p *Poller) InFlight(endpoint string) int64 {
	if c := p.lookup(endpoint); c != nil {
		return c.count()
	}
	return 0
}

// Unbalanced counts Finished calls that found no request in flight on their
// endpoint, and Dispatched calls beyond 16,777,215 requests in flight to one
// endpoint; both were ignored. Non-zero means the host's bookkeeping is
// wrong; export it as an error metric.
func (p *Poller) Unbalanced() uint64 { return p.live.unbalanced.Load() }

// ReadingSeq returns the number of scrape results applied so far (Run's
// and Poll's, failures included: a failed scrape may change the pod's
// score too). It only grows. A dispatcher that paces releases by reading
// compares it with the value it saw last: a change means at least one pod's
// reading changed since. Rescores (ageing) and in-flight credit do not
// advance it. One atomic load.
func (p *Poller) ReadingSeq() uint64 { return p.live.seq.Load() }
