package saturation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// Defaults of PollerConfig.
const (
	// DefaultInterval is PollerConfig.Interval's default: a few scrapes
	// fit in DefaultStaleness, so one lost scrape does not fail a pod.
	DefaultInterval = 50 * time.Millisecond
	// DefaultTimeout is PollerConfig.Timeout's default: within
	// DefaultStaleness, so a scrape that times out does not outlive the
	// reading it would replace.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultMaxBodyBytes is PollerConfig.MaxBodyBytes' default, well
	// above a vLLM metrics page.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxConcurrency is PollerConfig.MaxConcurrency's default. A
	// scrape mostly waits on the network, so a pool up to this size is
	// scraped fully in parallel; a larger one does not hold a socket and a
	// body buffer per pod at once, and stays far inside the common
	// file-descriptor limit.
	DefaultMaxConcurrency = 64
)

// Bounds of PollerConfig.Interval and Timeout (Staleness: see Scorer).
const (
	// MinInterval is the shortest Interval: scraping a pod more often
	// than every millisecond costs more than the reading is worth.
	MinInterval = time.Millisecond
	// MaxInterval is the longest Interval, MaxStaleness: a pod scraped
	// less often could never hold a fresh reading.
	MaxInterval = time.Hour
	// MinTimeout is the shortest Timeout: no scrape completes faster.
	MinTimeout = time.Millisecond
)

// Errors of a scrape, wrapped with the endpoint; branch on them with
// errors.Is. A timeout wraps context.DeadlineExceeded; ParseMetrics' errors
// (ErrParse, ErrMissingMetric, ErrBadValue) pass through.
var (
	// ErrHTTPStatus: the endpoint answered with a status other than 200.
	ErrHTTPStatus = errors.New("saturation: unexpected HTTP status")
	// ErrBodyTooLarge: the body exceeded PollerConfig.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("saturation: metrics body too large")
	// ErrRunning: Run or Start was called while the poller was running.
	ErrRunning = errors.New("saturation: poller already running")
)

// PollerConfig configures a Poller. A zero field takes its default.
type PollerConfig struct {
	// Endpoints are the full URLs of the pods' metrics pages
	// ("http://10.0.0.7:8000/metrics"). Empty means no pods yet (the pool
	// reads 1); change them at run time with SetEndpoints.
	Endpoints []string
	// Interval is the time between two scrapes of one endpoint in Run,
	// and between two rescores of the pool (ageing the readings,
	// refreshing in-flight counts), in [MinInterval, MaxInterval]: a
	// shorter one spends a core on scraping, a longer one leaves every
	// reading stale for most of it. 0 means DefaultInterval.
	//
	// Every endpoint runs on its own schedule: the first scrapes are
	// spread evenly over the first interval, so a large pool is scraped
	// at a steady rate rather than in bursts; a scrape that takes longer
	// than Interval delays only its own endpoint's next one (scrapes of
	// one endpoint never overlap). A pool larger than the machine can
	// scrape every Interval is reached less often, each pod in turn;
	// Poller.Stats and PodReading.Interval report the cadence achieved,
	// and that backlog does not age the readings (see Poller).
	Interval time.Duration
	// Timeout bounds one scrape (connect, headers and body), counted from
	// when the scrape gets one of the MaxConcurrency slots, so waiting for
	// a slot never eats into it. It must lie in [MinTimeout,
	// Scorer.Staleness]: a scrape allowed to outlast the staleness would
	// deliver a reading older than the pod's last one expired. 0 means
	// DefaultTimeout, or Scorer.Staleness if that is shorter.
	//
	// It is the floor of the effective timeout: on a node so busy that
	// healthy scrapes take longer, a scrape is cut off only after
	// TimeoutLatencyFactor times the median latency of the recent scrapes,
	// and at the latest after MaxTimeoutGrowth times Timeout (Poller.Stats
	// reports it).
	Timeout time.Duration
	// MaxConcurrency bounds the scrapes in flight at once, over Run and
	// Scrape together; >= 0. 0 means DefaultMaxConcurrency.
	MaxConcurrency int
	// MaxBodyBytes caps the body read from one scrape; a longer body
	// fails with ErrBodyTooLarge. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Client performs the requests. Nil means a client of the poller's
	// own that keeps one idle connection per pod (up to MaxConcurrency
	// per host), so a pod is not reconnected at every scrape; its idle
	// connections are closed when Run returns.
	Client *http.Client
	// Now is the clock used to stamp readings and judge staleness. Nil
	// means time.Now. Run's schedule runs on the runtime's timers
	// regardless (testing/synctest fakes both).
	Now func() time.Time
	// Scorer turns readings into saturation; the zero value is the
	// reference formula (see Scorer) with the prompt-token term: a zero
	// PromptTokenThreshold means DefaultPromptTokenThreshold unless
	// NoPromptTokens, since a queue of long prompts holds more work ahead
	// of a new request than its count says.
	Scorer Scorer
	// NoPromptTokens keeps a zero Scorer.PromptTokenThreshold at 0: the
	// reference formula exactly (llm-d's utilization detector).
	NoPromptTokens bool
	// Metrics names the metrics to read. The zero value means VLLM().
	Metrics MetricNames
	// PeerInFlight, when set, returns the number of requests other gateway
	// replicas have in flight to an endpoint (for example
	// redisshare.Endpoint.Others): with Scorer.InFlightCredit, the pod's
	// credit is then max(0, own + peers − (waiting + running)), own being
	// this poller's Dispatched minus Finished. It is read under the
	// poller's lock, for one pod when its scrape result arrives and for
	// every pod at each rescore (every Interval under Run), so the peers'
	// part moves at that pace while the own part moves at once; keep it
	// fast and do not call the poller from it. A negative value counts as
	// 0.
	PeerInFlight func(endpoint string) int64
	// FailFast scores a pod 1 as soon as one scrape fails. When false
	// (the default) a failed scrape keeps the pod's last good reading until it is older
	// than Scorer.Staleness, so one lost scrape does not jolt the pool.
	// A scrape that succeeds but reports a NaN, infinite or negative
	// value (ErrBadValue) scores the pod 1 at once either way: the pod
	// answered, and what it said is unusable.
	FailFast bool
	// OnReading, when set, is called with each pod's state right after a
	// successful scrape's reading is applied (Reading the new one,
	// LastAttempt when that scrape was sent, InFlight as Readings
	// reports it), from the goroutine that scraped, outside the poller's
	// lock: it may call Dispatched and Finished (a host that learns from
	// the reading that some of its requests have finished, say), and it
	// delays that pod's next scrape by as long as it runs. Nil: none.
	OnReading func(PodReading)
}

// Reasons a pod is not usable, in PodReading.Reason.
const (
	// ReasonNotScraped: no scrape of the pod has finished yet.
	ReasonNotScraped = "not scraped yet"
	// ReasonScrapeFailed: no good reading is held (the last scrapes
	// failed with FailFast, or none ever succeeded).
	ReasonScrapeFailed = "scrape failed"
	// ReasonBadValue: the reading holds a NaN, infinite or negative value.
	ReasonBadValue = "bad value"
	// ReasonStale: the last good reading is older than Scorer.Staleness.
	ReasonStale = "stale"
)

// PodReading is a snapshot of one pod's state, for logs and metrics.
type PodReading struct {
	// Endpoint is the pod's metrics URL, as given to the poller.
	Endpoint string
	// Reading is the last good reading (OK false if none, or after a
	// failure with FailFast or a bad value), with InFlight the pod's
	// live count at the snapshot (Dispatched minus Finished) plus the
	// peers' count (PeerInFlight) as of the pod's last rescore.
	Reading
	// Score is the pod's saturation at its last rescore, without the live
	// in-flight credit of this poller's own requests (which
	// Poller.Saturation adds on read); the part of the peers' requests
	// (PeerInFlight) beyond what the metrics show is in it.
	Score float64
	// Usable reports whether the pod counted on its merits at its last
	// rescore (false: scored 1, or left out with Scorer.IgnoreStale).
	Usable bool
	// Reason says why the pod is not Usable: ReasonNotScraped,
	// ReasonScrapeFailed, ReasonBadValue (a NaN, infinite or negative
	// value, parsed or supplied) or ReasonStale; "" when Usable. Err has
	// the detail of the last scrape.
	Reason string
	// Err is the error of the last scrape, nil if it succeeded.
	Err error
	// LastAttempt is when the last scrape started (zero: never).
	LastAttempt time.Time
	// Failures counts consecutive failed scrapes.
	Failures int
	// Scrapes counts all scrape attempts.
	Scrapes int64
	// Interval is the time between the starts of the pod's last two
	// scrapes (zero before its second): the cadence the poller achieved
	// for it, Interval when it keeps up, longer when it cannot.
	Interval time.Duration
	// Owed is how much of the reading's age, at the pod's last scoring,
	// was the poller's own backlog rather than the pod's (see Poller:
	// the wait since its next scrape fell due, the time spent on its
	// failed scrapes, the rest of a Scrape round, reading the body after
	// the headers' timestamp), which its staleness does not count. It is
	// zero once the pod has failed ceil(Staleness/Interval) scrapes in a
	// row.
	Owed time.Duration
}

// pod is the poller's state of one endpoint.
type pod struct {
	PodReading
	bad       bool      // the last scrape parsed an unusable value
	lastStart time.Time // start of the newest scrape applied
	// lastResult is when that scrape's result was applied.
	lastResult time.Time
	cr         *credit // live in-flight count and credit threshold
	peers      int64   // PeerInFlight at the pod's last scoring
	// relT and relM are the pod's share of the released credit's hinge
	// (its T and slope); relM 0: the pod does not count (not usable, or
	// scoring +Inf).
	relT, relM float64
	stop       context.CancelFunc
	// pendingSince is the start of the Scrape round whose scrape of the pod
	// is still to come (zero: none); under Run the due time follows from
	// the schedule instead (see dueLocked).
	pendingSince time.Time
	// owed is the backlog already spent on the pod since its last good
	// reading (the body read after its timestamp, then each failed
	// scrape from when it fell due, and the rest of each Scrape round),
	// subtracted from the reading's age.
	owed time.Duration
}

// Poller scrapes the Prometheus metrics pages of a pool of model servers and
// reports the pool's saturation (see Scorer for the formula and the rules).
//
// Saturation reads the pool value in O(1): the pool's sum as of the last
// scrape result (the pod's score is replaced in a running sum) or rescore
// (recomputed from every reading), plus the live in-flight credit of the
// requests the host reported with Dispatched and Finished, kept in one
// atomic counter: no I/O, no lock, no allocation. Before the first result it
// is 1 (fail safe), and it returns to 1 when Run returns (or Close stops a
// Start), because nothing keeps the readings fresh any more. ReadingSeq
// counts the results applied.
//
// Drive it with Run (or Start/Close): each endpoint is scraped every
// Interval on its own schedule, each scrape under its own Timeout, at most
// MaxConcurrency at once, and the pool is rescored every Interval. Or call
// Scrape for one synchronous round (tests, simulations). No goroutine
// outlives Scrape, Run or Close. The zero value is not usable; call
// NewPoller.
//
// # Staleness against the cadence achieved
//
// A pool can be more than the machine scrapes every Interval, and a busy
// node slows every scrape. The poller then reaches each pod less often, and
// that is its own backlog, not the pod's age: a pod is judged as of when
// its next scrape fell due (under Run an Interval after its last one
// started, or at that one's result if later; under Scrape the round's
// start) for as long as the poller is behind on it, and the time the poller
// spent on it since its last good reading (waits for a slot, failed
// scrapes, the rest of a Scrape round, reading the body after the headers'
// timestamp) is not counted in its age either (PodReading.Owed). So a
// healthy pod stays usable at any pool size and cadence; Stats reports the
// cadence (Interval, MaxInterval) and the effective timeout.
//
// A pod that really fails still scores 1: a bad value at once, FailFast at
// the first failure, and otherwise once it has failed
// ceil(Staleness/Interval) scrapes in a row, from which its reading ages on
// the plain clock again. A pod answering errors at once is thus at 1 about
// Staleness after its last good reading while the poller keeps up, and
// after that many of its turns when it does not; a pod that hangs, after as
// many (effective) timeouts.
type Poller struct {
	cfg     PollerConfig
	scorer  Scorer
	ownHTTP bool

	live liveCredit    // the pool value: snapshot, live excess, reading count
	sem  chan struct{} // one token per scrape in flight

	round sync.Mutex // serialises Scrape calls

	mu    sync.Mutex // guards everything below it up to life
	pods  map[string]*pod
	order []*pod
	// The pool mean is kept as a running sum over the counted pods,
	// with infinite scores counted apart so that one +Inf neither
	// poisons the sum with Inf − Inf nor is lost.
	sum    float64
	n, inf int
	usable int // pods Usable at their last scoring
	// Σ relT, Σ relM and their count over the counted pods (the released
	// credit's hinge, see Inc).
	relT, relM float64
	relK       int
	run        *runState // non-nil while Run runs
	// stopped: Run has returned (or Close stopped a Start) and no Scrape
	// has run since: the pool reads 1 whatever is rescored.
	stopped   bool
	lastRound time.Duration // length of the last Scrape round (Stats)
	lat       latency       // the scrapes' latency, and the timeout it allows
	// missK is how many scrapes in a row a pod may fail before its
	// reading ages on the plain clock: ceil(Staleness / Interval).
	missK int

	onApply func(endpoint string) // test hook: after a scrape result is applied

	running atomic.Bool
	life    sync.Mutex // guards cancel and done of Start/Close
	cancel  context.CancelFunc
	done    chan struct{}
}

// runState is one Run's: the context its workers derive from and the group
// it waits for.
type runState struct {
	ctx context.Context
	wg  sync.WaitGroup
}

// NewPoller validates cfg, applies the defaults and returns a stopped poller
// whose Saturation reads 1 until its first scrape result. Errors wrap
// ErrInvalidConfig and name the field.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.Interval != 0 && (cfg.Interval < MinInterval || cfg.Interval > MaxInterval) {
		return nil, fmt.Errorf("%w: PollerConfig.Interval must be in [%v, %v] (0 = default %v), got %v",
			ErrInvalidConfig, MinInterval, MaxInterval, DefaultInterval, cfg.Interval)
	}
	if err := cfg.Scorer.Validate(); err != nil {
		return nil, err // names the Scorer field
	}
	staleness := cfg.Scorer.withDefaults().Staleness
	if cfg.Timeout != 0 && (cfg.Timeout < MinTimeout || cfg.Timeout > staleness) {
		return nil, fmt.Errorf("%w: PollerConfig.Timeout must be in [%v, Scorer.Staleness = %v] (0 = default %v), got %v",
			ErrInvalidConfig, MinTimeout, staleness, DefaultTimeout, cfg.Timeout)
	}
	if cfg.MaxConcurrency < 0 {
		return nil, fmt.Errorf("%w: PollerConfig.MaxConcurrency must be >= 0, got %d", ErrInvalidConfig, cfg.MaxConcurrency)
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: PollerConfig.MaxBodyBytes must be >= 0, got %d", ErrInvalidConfig, cfg.MaxBodyBytes)
	}
	names := cfg.Metrics
	if len(names.Waiting) == 0 && len(names.Running) == 0 && len(names.KVUsage) == 0 {
		names = VLLM()
	}
	if err := names.validate(); err != nil {
		return nil, err
	}
	cfg.Metrics = names
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(DefaultTimeout, staleness)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxConcurrency == 0 {
		cfg.MaxConcurrency = DefaultMaxConcurrency
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Scorer.PromptTokenThreshold == 0 && !cfg.NoPromptTokens {
		cfg.Scorer.PromptTokenThreshold = DefaultPromptTokenThreshold
	}
	p := &Poller{cfg: cfg, scorer: cfg.Scorer, pods: map[string]*pod{},
		sem:   make(chan struct{}, cfg.MaxConcurrency),
		missK: int(max(1, (staleness+cfg.Interval-1)/cfg.Interval))}
	if cfg.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// The default keeps 100 idle connections in all and 2 per host:
		// a pool of more pods, or a test serving many pods from one
		// host, would reconnect on nearly every scrape.
		tr.MaxIdleConns = 0 // no total limit: one per pod
		tr.MaxIdleConnsPerHost = cfg.MaxConcurrency
		p.cfg.Client = &http.Client{Transport: tr}
		p.ownHTTP = true
	}
	p.live.snap.Store(stoppedSnap)
	if err := p.SetEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	p.cfg.Endpoints = nil // the live set is in p.order
	return p, nil
}

// Saturation returns the pool saturation as of the last scrape result or
// rescore, with the live in-flight credit of every request Dispatched and not
// yet Finished (when Scorer.InFlightCredit is set) and of the requests
// released to the pool (Inc); 1 before the first result and after Run returns. Two atomic loads
// and a few flops: no I/O, lock or allocation, whatever the number of pods.
//
// At rest (no Dispatched, Finished or result half applied) it equals
// Scorer.Pool over the readings with each pod's in-flight count (the
// prompt-token term and any Projection included), to within 2^−25 plus
// float rounding: each pod's credit is kept in units of 2^−24 of a score,
// and held at 2^20. While results and dispatches are being applied, a read
// may see one of them half applied: a pod's new reading without its new
// credit term, or the reverse.
func (p *Poller) Saturation() float64 { return p.live.saturation() }

// SetEndpoints replaces the set of endpoints. Pods kept keep their readings
// (and, while Run runs, their schedules); new pods have none yet and score as
// failed (1, or left out with IgnoreStale) until their first good scrape,
// which Run starts at once. Duplicates are merged. The pool is rescored at
// once (an empty set reads 1). It fails with ErrInvalidConfig, changing
// nothing, if an endpoint is not an absolute http(s) URL.
func (p *Poller) SetEndpoints(endpoints []string) error {
	for i, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: endpoint %d (%q) must be an absolute http or https URL", ErrInvalidConfig, i, ep)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var old map[string]*credit
	if m := p.live.byEndpoint.Load(); m != nil {
		old = *m
	}
	pods := make(map[string]*pod, len(endpoints))
	order := make([]*pod, 0, len(endpoints))
	credits := make(map[string]*credit, len(endpoints))
	for _, ep := range endpoints {
		if _, dup := pods[ep]; dup {
			continue
		}
		pd := p.pods[ep]
		if pd == nil {
			pd = &pod{PodReading: PodReading{Endpoint: ep, Score: 1, Reason: ReasonNotScraped}}
			// A pod removed and added back resumes its in-flight count.
			if pd.cr = old[ep]; pd.cr == nil {
				pd.cr = newCredit()
			}
			pd.cr.removed.Store(false)
			if p.run != nil {
				p.startWorkerLocked(pd, 0)
			}
		}
		pods[ep] = pd
		order = append(order, pd)
		credits[ep] = pd.cr
	}
	for ep, c := range old {
		if pods[ep] == nil {
			// Out of the score; kept while requests to it are in
			// flight so that their Finished calls still land.
			p.live.setHinge(c, noCredit.t, noCredit.slope)
			c.removed.Store(true)
			if c.count() > 0 {
				credits[ep] = c
			}
		}
	}
	for ep, pd := range p.pods {
		if pods[ep] == nil && pd.stop != nil {
			pd.stop()
			pd.stop = nil
		}
	}
	p.pods, p.order = pods, order
	p.live.byEndpoint.Store(&credits)
	p.rescoreLocked()
	return nil
}

// Endpoints returns the current endpoints in order.
func (p *Poller) Endpoints() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.order))
	for i, pd := range p.order {
		out[i] = pd.Endpoint
	}
	return out
}

// Readings returns a snapshot of every pod's state, in endpoint order.
func (p *Poller) Readings() []PodReading { return p.AppendReadings(nil) }

// AppendReadings appends Readings' snapshot to dst and returns the extended
// slice. A caller that takes snapshots often (a router re-reading every pod
// after each scrape result) passes its previous slice truncated to zero
// length and allocates nothing once it has grown.
func (p *Poller) AppendReadings(dst []PodReading) []PodReading {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pd := range p.order {
		r := pd.PodReading
		r.InFlight = pd.cr.count() + pd.peers
		dst = append(dst, r)
	}
	return dst
}

// Rescore recomputes the saturation from the readings held, with the current
// clock, without scraping: readings age (a pod whose reading passes
// Scorer.Staleness, less what the poller owes it — see Poller — scores 1
// from here). Run rescores every Interval and every Scrape ends with one; the
// result equals Scorer.Pool over the readings with their in-flight counts,
// each judged at its own instant (now less PodReading.Owed). Once Run has
// returned (or Close stopped a Start) the pool keeps reading 1, Rescore or
// not, until a Scrape reads the pods again. It takes the poller's lock and
// costs O(pods). It is not needed for the in-flight credit of Dispatched and
// Finished, which moves the saturation at once.
func (p *Poller) Rescore() {
	p.mu.Lock()
	p.rescoreLocked()
	p.mu.Unlock()
}

func (p *Poller) rescoreLocked() {
	now := p.cfg.Now()
	// Recomputing the sum from scratch also clears the rounding drift the
	// running sum gathers between rescores.
	for _, pd := range p.order {
		p.scorePodLocked(pd, now)
	}
	p.resumLocked()
	p.publishLocked()
}

// scorePodLocked refreshes one pod's score without live credit, its credit
// threshold, usability and reason (not the pool). The peers' count (PeerInFlight) is read now too: it shifts the threshold down
// by as many requests, and what exceeds the threshold goes into Score.
func (p *Poller) scorePodLocked(pd *pod, now time.Time) {
	pd.InFlight, pd.peers = 0, 0
	if p.cfg.PeerInFlight != nil {
		pd.peers = max(0, p.cfg.PeerInFlight(pd.Endpoint))
	}
	// The poller's own backlog does not age a reading (see Poller): the
	// pod is judged as of when its next scrape fell due, less what the
	// poller already owes it.
	at := now
	if pd.Failures < p.missK {
		if due := p.dueLocked(pd); !due.IsZero() && due.Before(at) {
			at = due
		}
		at = at.Add(-pd.owed)
	} // else the pod has missed as many scrapes as Staleness allows: its own doing
	pd.Owed = now.Sub(at)
	pd.Score = p.scorer.Pod(pd.Reading, at)
	pd.Usable = p.scorer.Usable(pd.Reading, at)
	pd.relT, pd.relM = 0, 0
	if pd.Usable && !math.IsInf(pd.Score, 1) {
		// The released credit's share (Scorer.PoolReleased), net of
		// the peers' requests as the pod's own hinge is.
		pd.relT, pd.relM = p.scorer.releaseShare(pd.Reading)
		pd.relT = max(0, pd.relT-float64(pd.peers))
	}
	t, slope := noCredit.t, noCredit.slope
	if p.scorer.InFlightCredit && pd.Usable && !math.IsInf(pd.Score, 1) {
		// credit = m·max(0, own + peers − T) = m·max(0, own − (T − peers)),
		// and when peers ≥ T it is m·(own + (peers − T)) for every own ≥ 0.
		t, slope = p.scorer.creditHinge(pd.Reading)
		t -= float64(pd.peers)
		if t < 0 {
			pd.Score += -t * slope
			t = 0
		}
	}
	p.live.setHinge(pd.cr, t, slope)
	switch {
	case pd.Usable:
		pd.Reason = ""
	case pd.bad || pd.OK && p.scorer.badValues(pd.Reading):
		pd.Reason = ReasonBadValue
	case !pd.OK && pd.Scrapes == 0:
		pd.Reason = ReasonNotScraped
	case !pd.OK:
		pd.Reason = ReasonScrapeFailed
	default:
		pd.Reason = ReasonStale
	}
}

// dueLocked returns when the poller owed pd its next scrape (zero: not
// known, or not owed): under Run, an Interval after its last scrape started,
// or at that scrape's result if it came later (the worker's ticker drops the
// ticks it missed, so the next scrape is due at once); under Scrape, the start
// of the round in progress. It is derived from the schedule, not from when
// the worker goroutine gets to run, so a starved scheduler's delay counts as
// the poller's backlog too.
func (p *Poller) dueLocked(pd *pod) time.Time {
	due := pd.pendingSince
	if p.run != nil && !pd.lastResult.IsZero() {
		if d := p.nextByScheduleLocked(pd); due.IsZero() || d.Before(due) {
			due = d
		}
	}
	return due
}

// nextByScheduleLocked is when the schedule makes pd's next scrape due: an
// Interval after its last one started, or at that one's result if later.
// pd has had a result.
func (p *Poller) nextByScheduleLocked(pd *pod) time.Time {
	d := pd.lastStart.Add(p.cfg.Interval)
	if d.Before(pd.lastResult) {
		d = pd.lastResult
	}
	return d
}

// countLocked adds (sign 1) or removes (sign −1) a pod's score to or from the
// running pool sum, as Scorer.Pool would count it.
func (p *Poller) countLocked(pd *pod, sign int) {
	if pd.Usable {
		p.usable += sign
	}
	if !pd.Usable && p.scorer.IgnoreStale {
		return
	}
	p.n += sign
	if math.IsInf(pd.Score, 1) {
		p.inf += sign
		return
	}
	p.sum += float64(sign) * pd.Score
	if pd.relM > 0 {
		p.relT += float64(sign) * pd.relT
		p.relM += float64(sign) * pd.relM
		p.relK += sign
	}
}

// bigScore is the finite pod score above which a result re-sums the pool
// instead of updating the running sum (O(pods) additions, no rescoring):
// below it, the sum of any pool loses at most a few ulps per update.
const bigScore = 1 << 20

// resumLocked recomputes the running sum from the pods' current scores.
func (p *Poller) resumLocked() {
	p.sum, p.n, p.inf, p.usable = 0, 0, 0, 0
	p.relT, p.relM, p.relK = 0, 0, 0
	for _, pd := range p.order {
		p.countLocked(pd, 1)
	}
}

// publishLocked publishes the running pool sum (Saturation adds the live
// credit on read).
func (p *Poller) publishLocked() {
	if p.stopped {
		// Run has returned: nothing keeps the readings fresh, whatever
		// a Rescore or SetEndpoints recomputes.
		p.live.snap.Store(stoppedSnap)
		return
	}
	snap := &poolSnap{sum: p.sum, n: p.n, inf: p.inf}
	if p.relK > 0 && p.n > 0 {
		snap.sumT = max(p.relT, 0)
		snap.slope = max(p.relM, 0) / float64(p.relK) / float64(p.n)
	}
	p.live.snap.Store(snap)
}

type scrapeResult struct {
	r     Reading
	start time.Time
	err   error
}

// apply records one scrape result of pd and updates the pool at once.
func (p *Poller) apply(pd *pod, res scrapeResult) {
	p.mu.Lock()
	if p.pods[pd.Endpoint] != pd || res.start.Before(pd.lastStart) {
		// Removed by SetEndpoints meanwhile, or overtaken by a newer
		// scrape of the same pod (a Scrape beside Run).
		p.mu.Unlock()
		return
	}
	before := pd.Score
	p.countLocked(pd, -1)
	if !pd.lastStart.IsZero() {
		pd.Interval = res.start.Sub(pd.lastStart)
	}
	now := p.cfg.Now()
	if due := p.dueLocked(pd); res.err != nil && !due.IsZero() {
		// From when the scrape fell due to its failure: the wait for a
		// slot and the time the poller gave the pod.
		pd.owed += max(0, now.Sub(due))
	}
	pd.pendingSince = time.Time{}
	if res.err == nil {
		// The reading is stamped when its headers arrived; reading and
		// parsing the body until now is the poller's time, not the
		// pod's age (on a starved node it can pass the staleness).
		pd.owed = max(0, now.Sub(res.r.At))
	}
	pd.lastStart, pd.lastResult = res.start, now
	pd.Scrapes++
	pd.LastAttempt = res.start
	pd.Err = res.err
	pd.bad = errors.Is(res.err, ErrBadValue)
	if res.err == nil {
		pd.Reading = res.r
		pd.InFlight = 0
		pd.Failures = 0
	} else {
		pd.Failures++
		if p.cfg.FailFast || pd.bad {
			pd.OK = false
		}
	}
	p.scorePodLocked(pd, now)
	p.countLocked(pd, 1)
	if before > bigScore && !math.IsInf(before, 1) || pd.Score > bigScore && !math.IsInf(pd.Score, 1) {
		// Taking a huge score out of the running sum would cancel the
		// small ones with it (1e300 + 1 − 1e300 = 0): sum afresh.
		p.resumLocked()
	}
	p.publishLocked()
	p.live.seq.Add(1)
	hook := p.onApply
	var read PodReading
	onReading := p.cfg.OnReading
	if onReading != nil && res.err == nil {
		read = pd.PodReading
		read.InFlight = pd.cr.count() + pd.peers
	} else {
		onReading = nil
	}
	p.mu.Unlock()
	if onReading != nil {
		onReading(read)
	}
	if hook != nil {
		hook(pd.Endpoint)
	}
}

// scrapeAndApply takes a concurrency slot, scrapes pd and applies the
// result. A result cut short because ctx ended is applied only when
// applyCancelled (Scrape reports it; a stopping worker drops it).
func (p *Poller) scrapeAndApply(ctx context.Context, pd *pod, applyCancelled bool) error {
	var res scrapeResult
	select {
	case p.sem <- struct{}{}:
		t0 := time.Now()
		res = p.scrape(ctx, pd.Endpoint, p.lat.timeout(p.cfg.Timeout))
		if ctx.Err() == nil {
			p.lat.observe(time.Since(t0))
		}
		<-p.sem
	case <-ctx.Done():
		res = scrapeResult{start: p.cfg.Now(),
			err: fmt.Errorf("saturation: scrape %s: %w", pd.Endpoint, ctx.Err())}
	}
	if ctx.Err() != nil && !applyCancelled {
		return res.err
	}
	p.apply(pd, res)
	return res.err
}

// Scrape runs one scrape round synchronously: it scrapes every endpoint (at
// most MaxConcurrency at once, each bounded by Timeout and by ctx), applying
// each result as it arrives, then rescores. It returns the round's scrape
// errors joined in endpoint order (nil if every scrape succeeded); the
// saturation is updated either way. Rounds never overlap: a Scrape during
// another waits for it. A Scrape beside Run shares Run's concurrency slots.
func (p *Poller) Scrape(ctx context.Context) error {
	p.round.Lock()
	defer p.round.Unlock()

	start := p.cfg.Now()
	p.mu.Lock()
	p.stopped = false // fresh readings again
	pods := append([]*pod(nil), p.order...)
	for _, pd := range pods {
		if pd.pendingSince.IsZero() { // every scrape of the round is due now
			pd.pendingSince = start
		}
	}
	p.mu.Unlock()
	errs := make([]error, len(pods))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(pods), p.cfg.MaxConcurrency) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Inc() - 1)
				if i >= len(pods) {
					return
				}
				errs[i] = p.scrapeAndApply(ctx, pods[i], true)
			}
		}()
	}
	wg.Wait()
	p.mu.Lock()
	// The rest of the round after a pod was due again (an Interval after
	// its scrape started, or at its result if that came later) is the
	// poller's backlog too: going round took that long. Owed, as the wait
	// for a slot is, until the pod's next good reading.
	end := p.cfg.Now()
	p.lastRound = max(0, end.Sub(start))
	for _, pd := range pods {
		if pd.pendingSince.Equal(start) {
			pd.pendingSince = time.Time{} // its result was overtaken by a newer one
		}
		if p.pods[pd.Endpoint] != pd || pd.lastResult.IsZero() {
			continue
		}
		if due := p.nextByScheduleLocked(pd); end.After(due) {
			pd.owed += end.Sub(due)
		}
	}
	p.rescoreLocked()
	p.mu.Unlock()
	return errors.Join(errs...)
}

// scrape fetches and parses one endpoint.
func (p *Poller) scrape(ctx context.Context, ep string, timeout time.Duration) (res scrapeResult) {
	res.start = p.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fail := func(err error) scrapeResult {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			// A read cut off by the deadline surfaces as a parse
			// or transport error; say what actually happened.
			err = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		res.err = fmt.Errorf("saturation: scrape %s: %w", ep, err)
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep, nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return fail(err)
	}
	// Closing without draining makes the transport drop the connection
	// rather than read the rest of a huge or endless body.
	defer resp.Body.Close()
	at := p.cfg.Now()
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Errorf("%w %d", ErrHTTPStatus, resp.StatusCode))
	}
	body := &cappedReader{r: resp.Body, left: p.cfg.MaxBodyBytes}
	r, err := ParseMetrics(body, p.cfg.Metrics)
	if body.over {
		return fail(fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, p.cfg.MaxBodyBytes))
	}
	if err != nil {
		return fail(err)
	}
	r.At = at
	res.r = r
	return res
}

// cappedReader reads at most left bytes and then fails, remembering that the
// source had more.
type cappedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (c *cappedReader) Read(b []byte) (int, error) {
	if c.left <= 0 {
		// Probe one byte: a body of exactly the cap is fine.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			c.over = true
			return 0, ErrBodyTooLarge
		}
		return 0, err
	}
	if int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.r.Read(b)
	c.left -= int64(n)
	return n, err
}

// Run scrapes every endpoint every Interval, each on its own schedule (see
// PollerConfig.Interval), and rescores the pool every Interval, until ctx is
// done; then it returns ctx.Err(). It fails with ErrRunning if the poller is
// already running. When it returns, the saturation reads 1 (and keeps
// reading 1 through Rescore and SetEndpoints, until a Scrape) and no goroutine
// it started is left.
func (p *Poller) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	return p.loop(ctx)
}

func (p *Poller) loop(parent context.Context) error {
	defer p.running.Store(false)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	rs := &runState{ctx: ctx}
	p.mu.Lock()
	p.run = rs
	p.stopped = false
	// Spread the first scrapes evenly over one interval: endpoints
	// started together would stay in step, and the whole pool would hit
	// the concurrency bound at once every interval.
	n := time.Duration(len(p.order))
	for i, pd := range p.order {
		p.startWorkerLocked(pd, time.Duration(i)*p.cfg.Interval/n)
	}
	p.mu.Unlock()

	t := time.NewTicker(p.cfg.Interval)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
			p.Rescore()
		}
	}
	t.Stop()

	p.mu.Lock()
	p.run = nil
	p.stopped = true // reads 1 from here, whatever is rescored
	for _, pd := range p.order {
		pd.stop = nil // cancelled with ctx below
		pd.pendingSince = time.Time{}
	}
	p.mu.Unlock()
	cancel()
	rs.wg.Wait()
	p.live.snap.Store(stoppedSnap)
	if p.ownHTTP {
		p.cfg.Client.CloseIdleConnections()
	}
	return parent.Err()
}

// startWorkerLocked starts pd's scraping goroutine under the running Run:
// its first scrape after phase, then one every Interval.
func (p *Poller) startWorkerLocked(pd *pod, phase time.Duration) {
	rs := p.run
	ctx, stop := context.WithCancel(rs.ctx)
	pd.stop = stop
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer stop()
		if phase > 0 {
			t := time.NewTimer(phase)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		// A Ticker drops ticks for a slow receiver: a scrape slower than
		// Interval delays this endpoint's next one instead of queueing
		// a burst behind it.
		tick := time.NewTicker(p.cfg.Interval)
		defer tick.Stop()
		for {
			_ = p.scrapeAndApply(ctx, pd, false) // errors are per pod, in Readings
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// Start runs the poller in a goroutine of its own until Close. It fails with
// ErrRunning if the poller is already running.
func (p *Poller) Start() error {
	p.life.Lock()
	defer p.life.Unlock()
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.cancel, p.done = cancel, done
	go func() {
		defer close(done)
		_ = p.loop(ctx)
	}()
	return nil
}

// Close stops a poller started with Start and waits for its goroutines (and
// any scrape in flight) to finish, then closes the idle connections of the
// poller's own HTTP client (if it made one). It is idempotent, may be called
// on a poller never started, and returns nil.
func (p *Poller) Close() error {
	p.life.Lock()
	defer p.life.Unlock()
	if p.cancel != nil {
		p.cancel()
		<-p.done
		p.cancel, p.done = nil, nil
	}
	if p.ownHTTP {
		p.cfg.Client.CloseIdleConnections()
	}
	return nil
}
