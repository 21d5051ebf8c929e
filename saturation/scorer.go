package saturation

import (
	"fmt"
	"math"
	"time"
)

// Defaults of Scorer, those of the reference gateway, so that the zero
// Scorer scores as it does.
const (
	// DefaultQueueDepthThreshold is Scorer.QueueDepthThreshold's default.
	DefaultQueueDepthThreshold = 5
	// DefaultKVUtilThreshold is Scorer.KVUtilThreshold's default.
	DefaultKVUtilThreshold = 0.8
	// DefaultStaleness is Scorer.Staleness' default: a few of the
	// poller's DefaultInterval, so one lost scrape does not fail a pod.
	DefaultStaleness = 200 * time.Millisecond
)

// DefaultPromptTokenThreshold is the Scorer.PromptTokenThreshold a Poller
// uses when its config gives 0 (PollerConfig.NoPromptTokens keeps 0; the
// zero Scorer itself stays the reference formula, without the term): a pod
// is saturated when half of vLLM's default token budget of a step
// (max_num_batched_tokens) waits in prompts.
const DefaultPromptTokenThreshold = 4096

// Reading is one pod's metrics as the scorer sees them. The Poller fills it
// from a scrape; a simulator fills it from its model with virtual time.
type Reading struct {
	// Waiting is the number of requests queued in the model server
	// (vllm:num_requests_waiting; includes preempted requests).
	Waiting float64
	// Running is the number of requests in the running batch
	// (vllm:num_requests_running). Used only for the in-flight credit.
	Running float64
	// KVUsage is the fraction of KV-cache blocks in use, normally 0..1
	// (vllm:kv_cache_usage_perc). Values above 1 are scored, not rejected.
	KVUsage float64
	// InFlight is the number of requests this host has sent to the pod
	// and not yet seen finish. Used only when Scorer.InFlightCredit is set.
	InFlight int64
	// At is when the metrics were taken (for a scrape: when the response
	// arrived). Staleness is measured from it, so a reading with OK true
	// and a zero At is stale.
	At time.Time
	// OK reports that the reading holds a good scrape. A pod never
	// scraped successfully has OK false and scores as failed.
	OK bool
	// PromptMean and OutputMean are the mean prompt and output lengths,
	// in tokens, of the requests the pod has finished: the _sum over the
	// _count of vLLM's vllm:request_prompt_tokens and
	// vllm:request_generation_tokens histograms. Used only by
	// Scorer.Projection. Zero (no request finished yet), negative, NaN or
	// infinite means unknown: the KV usage is then scored as it is, and
	// the pod is not failed for it (the projection is a refinement, its
	// absence is no reason to call a pod saturated).
	PromptMean, OutputMean float64
	// KVCapacity is the pod's KV cache in tokens (vLLM's
	// vllm:cache_config_info labels num_gpu_blocks × block_size). Used
	// only by ProjectSteady; unknown (0 or bad) as for PromptMean.
	KVCapacity float64
}

// Scorer turns pod readings into a saturation, the reference gateway's
// formula by default:
//
//	pod  = max(waiting' / QueueDepthThreshold, kv' / KVUtilThreshold [, waiting'·PromptMean / PromptTokenThreshold])
//	pool = unweighted mean of pod over the pods
//
// where kv' is kv anticipated as Projection says (kv with ProjectNone)
// (PoolMax is the maximum instead of the mean);
// waiting' = waiting + max(0, inflight − (waiting + running)) when
// InFlightCredit is set (requests dispatched but not yet visible in the
// metrics count as waiting) and waiting' = waiting otherwise.
//
// Its methods are pure (no I/O, no clock: now is an argument), allocation-free
// and safe for concurrent use, so a simulator can score with virtual time.
// The zero value is the reference configuration: a zero field takes its
// default.
//
// Rules for a pod (each yields a value >= 0, never NaN; a fresh reading is
// scored raw, without a cap: the dispatcher applies the one sanitising rule):
//
//	OK false (no good scrape yet, or failed)        -> 1 (failed)
//	now − At > Staleness                            -> 1 (failed)
//	Waiting, Running or KVUsage NaN, ±Inf or
//	negative                                        -> 1 (failed: unusable)
//	a formula that overflows (huge finite values)   -> +Inf
//	InFlight negative                               -> treated as 0
//	At in the future (clock skew)                   -> fresh
//
// With IgnoreStale, failed pods are left out of the pool mean instead of
// scoring 1. A pool with no pods, or whose pods are all left out, is 1 (fail
// safe: no information is not "idle").
type Scorer struct {
	// QueueDepthThreshold is the waiting count that alone makes a pod
	// saturated (1.0): finite and > 0. Zero means
	// DefaultQueueDepthThreshold.
	QueueDepthThreshold float64
	// KVUtilThreshold is the KV-cache usage that alone makes a pod
	// saturated, in (0, 1]: usage is a fraction of the cache, so a
	// threshold above 1 could never be reached by a pod that is merely
	// full. Zero means DefaultKVUtilThreshold.
	KVUtilThreshold float64
	// Staleness is the age beyond which a reading counts as failed, in
	// [MinStaleness, MaxStaleness]. Zero means DefaultStaleness.
	Staleness time.Duration
	// IgnoreStale leaves failed and stale pods out of the pool mean
	// instead of scoring them 1. False (the reference) scores them 1: a
	// pod the scorer cannot see is not assumed idle.
	IgnoreStale bool
	// InFlightCredit adds max(0, InFlight − (Waiting + Running)) to
	// Waiting, so requests sent since the last scrape count at once.
	// False (the reference) ignores Reading.InFlight.
	InFlightCredit bool
	// Projection is how a pod's KV usage is anticipated: ProjectNone
	// (the zero value, the reference: as scraped), ProjectCompletion or
	// ProjectSteady (see KVProjection). A long decode's blocks are
	// allocated one token at a time, so a pod that admitted many requests
	// reads half full and fills later; a projection makes the gate see
	// that growth at admission. A reading without the inputs a projection
	// needs is scored unprojected.
	Projection KVProjection
	// PromptTokenThreshold, if > 0, adds a third term to a pod's score:
	// the prompt tokens waiting there, waiting' · PromptMean, over this
	// many. What a waiting request costs the next steps (and a critical
	// request's first token) is its prompt, which the request count does
	// not see: a few short chat prompts and a few long code prompts are
	// the same queue depth. 0 means off (the reference); otherwise finite
	// and >= 1. A reading without PromptMean has no such term.
	PromptTokenThreshold float64
}

// KVProjection is how Scorer anticipates a pod's KV usage kv from its
// running count R, its mean prompt and output lengths p and o of finished
// requests and its capacity C in tokens (Reading).
type KVProjection uint8

// Projections of Scorer.Projection.
const (
	// ProjectNone scores kv as scraped (the reference).
	ProjectNone KVProjection = iota
	// ProjectCompletion scores what the running requests will hold at
	// their expected completion: kv · KVGrowth(p, o).
	ProjectCompletion
	// ProjectSteady scores at least what R running requests hold once
	// their progress is spread as in a steady batch:
	// max(kv, R·(p + o/2)/C). A batch just admitted (every request at the
	// start of its output) reads below it and is scored at it; a steady
	// batch reads at it and is scored as scraped.
	ProjectSteady
)

// String returns "none", "completion" or "steady" (or "KVProjection(N)").
func (p KVProjection) String() string {
	switch p {
	case ProjectNone:
		return "none"
	case ProjectCompletion:
		return "completion"
	case ProjectSteady:
		return "steady"
	}
	return fmt.Sprintf("KVProjection(%d)", uint8(p))
}

// SteadyKV returns R·(p + o/2)/c, the KV fraction R running requests hold in
// a steady batch (each on average half through an output of mean o, by
// Little's law), or 0 when an input is unknown (not finite, negative, or o
// or c not positive).
func SteadyKV(running, p, o, c float64) float64 {
	if !(running >= 0) || !(p >= 0) || !(o > 0) || !(c > 0) ||
		running > maxFinite || p > maxFinite || o > maxFinite || c > maxFinite {
		return 0
	}
	// Scale before multiplying so that huge finite inputs do not make
	// Inf·0 or Inf/Inf: each factor is finite.
	v := running / c * (p + o/2)
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// KVGrowth returns the factor by which the KV cache held by a pod's running
// requests grows by the time they complete, estimated from the mean prompt
// and output lengths p and o of the requests it finished:
//
//	growth = (p + o) / (p + o/2)
//
// By Little's law on a steady batch, a running request is on average half
// way through its output, so it holds p + o/2 tokens now and will hold
// p + o at completion. The factor is in [1, 2]: 1 for prompt-only work, 2
// for pure generation. It ignores the spread of the lengths (longer
// requests are over-represented in a batch, which raises both terms) and
// requests still in prefill. An unknown mean (see Reading.PromptMean)
// gives 1.
func KVGrowth(p, o float64) float64 {
	if !(p >= 0) || !(o > 0) || p > maxFinite || o > maxFinite {
		return 1
	}
	// Divide both terms by o first so that huge finite lengths do not
	// overflow: (p/o + 1) / (p/o + 1/2).
	r := p / o
	if r > maxFinite/2 {
		return 1 // o negligible against p: nothing grows
	}
	return (r + 1) / (r + 0.5)
}

// Bounds of Scorer.Staleness (and of the poller's Interval and Timeout; see
// PollerConfig).
const (
	// MinStaleness is the shortest Staleness: no scrape over a network
	// stays fresh for less.
	MinStaleness = time.Millisecond
	// MaxStaleness is the longest Staleness: an hour-old reading says
	// nothing about queues that move in seconds.
	MaxStaleness = time.Hour
)

// Validate reports a field outside its documented range (each field's
// comment; zero always means the default) as an ErrInvalidConfig error
// naming the field. Pod and Pool never fail: they treat such a field as its
// default.
func (s Scorer) Validate() error {
	if !(s.QueueDepthThreshold >= 0) || s.QueueDepthThreshold > maxFinite {
		return fmt.Errorf("%w: Scorer.QueueDepthThreshold must be finite and > 0 (0 = default %v), got %v",
			ErrInvalidConfig, DefaultQueueDepthThreshold, s.QueueDepthThreshold)
	}
	if !(s.KVUtilThreshold >= 0) || s.KVUtilThreshold > 1 {
		return fmt.Errorf("%w: Scorer.KVUtilThreshold must be in (0, 1] (0 = default %v), got %v",
			ErrInvalidConfig, DefaultKVUtilThreshold, s.KVUtilThreshold)
	}
	if s.Staleness != 0 && (s.Staleness < MinStaleness || s.Staleness > MaxStaleness) {
		return fmt.Errorf("%w: Scorer.Staleness must be in [%v, %v] (0 = default %v), got %v",
			ErrInvalidConfig, MinStaleness, MaxStaleness, DefaultStaleness, s.Staleness)
	}
	if s.PromptTokenThreshold != 0 && !(s.PromptTokenThreshold >= 1 && s.PromptTokenThreshold <= maxFinite) {
		return fmt.Errorf("%w: Scorer.PromptTokenThreshold must be 0 (off) or finite and >= 1, got %v",
			ErrInvalidConfig, s.PromptTokenThreshold)
	}
	if s.Projection > ProjectSteady {
		return fmt.Errorf("%w: Scorer.Projection must be ProjectNone, ProjectCompletion or ProjectSteady, got %v",
			ErrInvalidConfig, s.Projection)
	}
	return nil
}

const maxFinite = 1.7976931348623157e308

// withDefaults returns s with every zero or invalid field replaced by its
// default.
func (s Scorer) withDefaults() Scorer {
	if !(s.QueueDepthThreshold > 0) || s.QueueDepthThreshold > maxFinite {
		s.QueueDepthThreshold = DefaultQueueDepthThreshold
	}
	if !(s.KVUtilThreshold > 0) || s.KVUtilThreshold > 1 {
		s.KVUtilThreshold = DefaultKVUtilThreshold
	}
	if s.Staleness < MinStaleness || s.Staleness > MaxStaleness {
		s.Staleness = DefaultStaleness
	}
	if !(s.PromptTokenThreshold >= 1 && s.PromptTokenThreshold <= maxFinite) {
		s.PromptTokenThreshold = 0
	}
	if s.Projection > ProjectSteady {
		s.Projection = ProjectNone
	}
	return s
}

// Pod returns the saturation of one pod at time now (see Scorer for the
// rules). A failed or stale pod scores 1 here even with IgnoreStale; use
// Usable to tell whether Pool would count it.
func (s Scorer) Pod(r Reading, now time.Time) float64 {
	s = s.withDefaults()
	if !s.fresh(r, now) {
		return 1
	}
	return s.score(r)
}

// Usable reports whether the reading is a good, fresh scrape with sane
// values — whether Pool counts it on its merits rather than as failed.
func (s Scorer) Usable(r Reading, now time.Time) bool {
	return s.withDefaults().fresh(r, now)
}

// Pool returns the unweighted mean of Pod over rs at time now; 1 when rs is
// empty, or when IgnoreStale is set and no pod is usable.
func (s Scorer) Pool(rs []Reading, now time.Time) float64 {
	mean, _ := s.pool(rs, now)
	return mean
}

// PoolReleased is Pool plus the credit of requests a gateway has released
// to the pool without naming their endpoint: of released requests in flight
// (released and not yet done), those beyond what the fresh pods' counts
// already show (Σ T_i, each pod's credit threshold, as with
// InFlightCredit) count as waiting requests on an average fresh pod. Why:
// a request is released before any scrape can show it, so without this a
// gate releases a scrape interval's worth of requests before the reading
// moves. InFlightCredit, which credits each pod its own requests, is the
// exact form for a host that knows where each request went; PoolReleased
// is for one that does not (a plain flowcontrol.Controller).
func (s Scorer) PoolReleased(rs []Reading, now time.Time, released int64) float64 {
	mean, _ := s.pool(rs, now)
	t, slope := s.releaseHinge(rs, now)
	if x := float64(released); x > t && slope > 0 {
		mean += (x - t) * slope
	}
	return mean
}

// releaseHinge returns PoolReleased's hinge: the count beyond which a
// released request raises the pool mean, Σ T_i (Σ max(InFlight_i, T_i)
// with InFlightCredit: a pod's own requests are accounted for by its
// credit), and by how much (the fresh pods' mean credit slope over the
// pods the mean counts). The count is +Inf when no pod is fresh with a
// finite score.
func (s Scorer) releaseHinge(rs []Reading, now time.Time) (t, slope float64) {
	s = s.withDefaults()
	own := s.InFlightCredit
	s.InFlightCredit = false
	sumT, sumM, k, n := 0.0, 0.0, 0, 0
	for i := range rs {
		r := &rs[i]
		if !s.fresh(*r, now) {
			if !s.IgnoreStale {
				n++
			}
			continue
		}
		n++
		if math.IsInf(s.score(*r), 1) {
			continue
		}
		ti, mi := s.releaseShare(*r)
		if mi == 0 {
			continue
		}
		if own && r.InFlight > 0 {
			ti = min(max(ti, float64(r.InFlight)), bigScore)
		}
		sumT += ti
		sumM += mi
		k++
	}
	if k == 0 {
		return math.Inf(1), 0
	}
	return sumT, sumM / float64(k) / float64(n)
}

// releaseShare is one fresh pod's share of PoolReleased's hinge: its credit
// threshold T and slope m, each held at 2^20 (a pod that absorbs more
// requests, or one request that weighs more, is beyond any real count) so
// that the poller's running sums stay exact; m 0 when the pod has no hinge.
func (s Scorer) releaseShare(r Reading) (t, m float64) {
	t, m = s.creditHinge(r)
	if math.IsNaN(t) || !(m > 0) {
		return 0, 0
	}
	return min(t, bigScore), min(m, bigScore)
}

// PoolMax returns the largest Pod over rs at time now, with Pool's rules for
// failed pods and empty pools: the most saturated pod, which an idle pod
// cannot average away. The Poller scores the mean (Pool); PoolMax is for a
// host (or a simulator) that scores readings itself.
func (s Scorer) PoolMax(rs []Reading, now time.Time) float64 {
	_, hi := s.pool(rs, now)
	return hi
}

// pool returns the mean and the maximum of Pod over rs (both 1 with no pod
// counted).
func (s Scorer) pool(rs []Reading, now time.Time) (mean, hi float64) {
	s = s.withDefaults()
	sum, n := 0.0, 0
	for i := range rs {
		r := &rs[i]
		v := 1.0
		if !s.fresh(*r, now) {
			if s.IgnoreStale {
				continue
			}
		} else {
			v = s.score(*r)
		}
		sum += v
		hi = max(hi, v)
		n++
	}
	if n == 0 {
		return 1, 1
	}
	// Every term is >= 0 (at worst +Inf): the mean is never NaN.
	return sum / float64(n), hi
}

// fresh: a good scrape, no older than Staleness, with finite, non-negative
// values.
func (s Scorer) fresh(r Reading, now time.Time) bool {
	if !r.OK || now.Sub(r.At) > s.Staleness {
		return false
	}
	return !isBad(r.Waiting) && !isBad(r.Running) && !isBad(r.KVUsage)
}

// badValues: a reading holds a value that cannot be a count or a usage.
func (s Scorer) badValues(r Reading) bool {
	return isBad(r.Waiting) || isBad(r.Running) || isBad(r.KVUsage)
}

// score applies the formula to a fresh reading (s has its defaults).
func (s Scorer) score(r Reading) float64 {
	waiting := r.Waiting
	if s.InFlightCredit && r.InFlight > 0 {
		// Dispatched requests the metrics do not show yet. If Waiting +
		// Running overflows to +Inf the credit is 0, never NaN (Inf − Inf
		// is not computed: the comparison short-circuits).
		if visible := r.Waiting + r.Running; float64(r.InFlight) > visible {
			waiting += float64(r.InFlight) - visible
		}
	}
	q := waiting / s.QueueDepthThreshold
	usage := r.KVUsage
	switch s.Projection {
	case ProjectCompletion:
		usage *= KVGrowth(r.PromptMean, r.OutputMean) // <= 2·KVUsage: +Inf only if KVUsage is huge
	case ProjectSteady:
		usage = max(usage, SteadyKV(r.Running, r.PromptMean, r.OutputMean, r.KVCapacity))
	}
	kv := usage / s.KVUtilThreshold
	if kv > q {
		q = kv
	}
	if s.PromptTokenThreshold > 0 && r.PromptMean > 0 && r.PromptMean <= maxFinite {
		// waiting/threshold first: a huge waiting count overflows to
		// +Inf, never to NaN (PromptMean > 0).
		if t := waiting / s.PromptTokenThreshold * r.PromptMean; t > q {
			q = t
		}
	}
	return q // >= 0, never NaN: inputs are finite and >= 0, thresholds > 0
}
