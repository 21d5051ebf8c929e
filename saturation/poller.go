package saturation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// Poller defaults.
const (
	DefaultInterval     = 50 * time.Millisecond
	DefaultTimeout      = 100 * time.Millisecond
	DefaultMaxBodyBytes = 4 << 20
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

// PollerConfig configures a Poller. Zero fields take their defaults.
type PollerConfig struct {
	// Endpoints are the full URLs of the pods' metrics pages
	// ("http://10.0.0.7:8000/metrics"). May be empty; change them at run
	// time with SetEndpoints.
	Endpoints []string
	// Interval between the starts of two polling rounds in Run. Default
	// 50 ms. A round that takes longer delays the next one; rounds never
	// overlap.
	Interval time.Duration
	// Timeout bounds one scrape (connect, headers and body). Default
	// 100 ms. Keep it below Scorer.Staleness.
	Timeout time.Duration
	// MaxBodyBytes caps the body read from one scrape; a longer body
	// fails with ErrBodyTooLarge. Default 4 MiB.
	MaxBodyBytes int64
	// Client performs the requests. Default: a client of the poller's own
	// (its idle connections are closed when Run returns).
	Client *http.Client
	// Now is the clock used to stamp readings and judge staleness.
	// Default time.Now. Run's ticker runs on real time regardless.
	Now func() time.Time
	// Scorer turns readings into saturation; the zero value is the
	// reference formula (see Scorer).
	Scorer Scorer
	// Metrics names the metrics to read. Zero value: VLLM().
	Metrics MetricNames
	// InFlight, when set, returns the number of requests this host has
	// in flight to an endpoint; it feeds Reading.InFlight, which the
	// Scorer credits when Scorer.InFlightCredit is set. It is called
	// under the poller's lock at every rescore: keep it fast and do not
	// call the poller from it.
	InFlight func(endpoint string) int64
	// FailFast scores a pod 1 as soon as one scrape fails. By default a
	// failed scrape keeps the pod's last good reading until it is older
	// than Scorer.Staleness, so one lost scrape does not jolt the pool.
	FailFast bool
}

// PodReading is a snapshot of one pod's state, for logs and metrics.
type PodReading struct {
	Endpoint string
	// Reading is the last good reading (OK false if none, or after a
	// failure with FailFast), with InFlight as of the last rescore.
	Reading
	// Score is the pod's saturation at the last rescore.
	Score float64
	// Usable reports whether the pod counted on its merits at the last
	// rescore (false: failed or stale, scored 1 or left out).
	Usable bool
	// Err is the error of the last scrape, nil if it succeeded.
	Err error
	// LastAttempt is when the last scrape started (zero: never).
	LastAttempt time.Time
	// Failures counts consecutive failed scrapes.
	Failures int
	// Scrapes counts all scrape attempts.
	Scrapes int64
}

// Poller scrapes the Prometheus metrics pages of a pool of model servers and
// reports the pool's saturation (see Scorer for the formula and the rules).
//
// Saturation is one atomic load of the value computed at the end of the last
// round (or rescore): no I/O, no lock, no allocation. Before the first round it
// is 1 (fail safe), and it returns to 1 when Run returns (or Close stops a
// Start), because nothing keeps the readings fresh any more.
//
// Drive it with Run (or Start/Close) on a real ticker, or call Poll for one
// synchronous round (tests, simulations). Scrapes within a round run
// concurrently, each bounded by Timeout. No goroutine outlives Poll, Run or
// Close. The zero value is not usable; call NewPoller.
type Poller struct {
	cfg     PollerConfig
	scorer  Scorer
	ownHTTP bool

	sat atomic.Float64

	round sync.Mutex // serialises rounds

	mu      sync.Mutex             // guards pods, order, scratch
	pods    map[string]*PodReading // by endpoint
	order   []string
	scratch []Reading

	running atomic.Bool
	life    sync.Mutex // guards cancel and done of Start/Close
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewPoller validates cfg, applies defaults and returns a stopped poller
// reporting 1. Errors wrap ErrInvalidConfig and name the field.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: PollerConfig.Interval must be >= 0, got %v", ErrInvalidConfig, cfg.Interval)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: PollerConfig.Timeout must be >= 0, got %v", ErrInvalidConfig, cfg.Timeout)
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: PollerConfig.MaxBodyBytes must be >= 0, got %d", ErrInvalidConfig, cfg.MaxBodyBytes)
	}
	if err := cfg.Scorer.Validate(); err != nil {
		return nil, err // names the Scorer field
	}
	if cfg.Scorer.InFlightCredit && cfg.InFlight == nil {
		return nil, fmt.Errorf("%w: PollerConfig.InFlight must be set when Scorer.InFlightCredit is", ErrInvalidConfig)
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
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Poller{cfg: cfg, scorer: cfg.Scorer, pods: map[string]*PodReading{}}
	if cfg.Client == nil {
		p.cfg.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		p.ownHTTP = true
	}
	p.sat.Store(1)
	if err := p.SetEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	p.cfg.Endpoints = nil // the live set is in p.order
	return p, nil
}

// Saturation returns the pool saturation computed at the end of the last
// round or rescore; 1 before the first and after Run returns. One atomic
// load: no I/O, lock or allocation.
func (p *Poller) Saturation() float64 { return p.sat.Load() }

// SetEndpoints replaces the set of endpoints. Pods kept keep their readings;
// new pods have none yet and score as failed (1, or left out with
// IgnoreStale) until their first good scrape. Duplicates are merged. The pool
// is rescored at once (an empty set reads 1). It fails with ErrInvalidConfig,
// changing nothing, if an endpoint is not an absolute http(s) URL.
func (p *Poller) SetEndpoints(endpoints []string) error {
	for i, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: endpoint %d (%q) must be an absolute http or https URL", ErrInvalidConfig, i, ep)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make(map[string]*PodReading, len(endpoints))
	order := make([]string, 0, len(endpoints))
	for _, ep := range endpoints {
		if _, dup := pods[ep]; dup {
			continue
		}
		pd := p.pods[ep]
		if pd == nil {
			pd = &PodReading{Endpoint: ep, Score: 1}
		}
		pods[ep] = pd
		order = append(order, ep)
	}
	p.pods, p.order = pods, order
	p.rescoreLocked()
	return nil
}

// Endpoints returns the current endpoints in order.
func (p *Poller) Endpoints() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order...)
}

// Readings returns a snapshot of every pod's state, in endpoint order.
func (p *Poller) Readings() []PodReading {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PodReading, len(p.order))
	for i, ep := range p.order {
		out[i] = *p.pods[ep]
	}
	return out
}

// Rescore recomputes the saturation from the readings held, with the current
// clock and in-flight counts, without scraping: readings age, and in-flight
// credit moves between rounds. Every round ends with a rescore.
func (p *Poller) Rescore() {
	p.mu.Lock()
	p.rescoreLocked()
	p.mu.Unlock()
}

func (p *Poller) rescoreLocked() {
	now := p.cfg.Now()
	p.scratch = p.scratch[:0]
	for _, ep := range p.order {
		pd := p.pods[ep]
		if p.cfg.InFlight != nil {
			pd.InFlight = p.cfg.InFlight(ep)
		}
		pd.Score = p.scorer.Pod(pd.Reading, now)
		pd.Usable = p.scorer.Usable(pd.Reading, now)
		p.scratch = append(p.scratch, pd.Reading)
	}
	p.sat.Store(p.scorer.Pool(p.scratch, now))
}

type scrapeResult struct {
	r     Reading
	start time.Time
	err   error
}

// Poll runs one round synchronously: it scrapes every endpoint concurrently
// (each bounded by Timeout and by ctx), updates the readings and rescores. It
// returns the round's scrape errors joined (nil if every scrape succeeded);
// the saturation is updated either way. Rounds never overlap: a Poll during
// another waits for it.
func (p *Poller) Poll(ctx context.Context) error {
	p.round.Lock()
	defer p.round.Unlock()

	eps := p.Endpoints()
	results := make([]scrapeResult, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = p.scrape(ctx, ep)
		}()
	}
	wg.Wait()

	var errs []error
	p.mu.Lock()
	for i, ep := range eps {
		res := results[i]
		if res.err != nil {
			errs = append(errs, res.err)
		}
		pd := p.pods[ep]
		if pd == nil {
			continue // removed by SetEndpoints during the round
		}
		pd.Scrapes++
		pd.LastAttempt = res.start
		pd.Err = res.err
		if res.err == nil {
			inflight := pd.InFlight
			pd.Reading = res.r
			pd.InFlight = inflight
			pd.Failures = 0
			continue
		}
		pd.Failures++
		if p.cfg.FailFast {
			pd.OK = false
		}
	}
	p.rescoreLocked()
	p.mu.Unlock()
	return errors.Join(errs...)
}

// scrape fetches and parses one endpoint.
func (p *Poller) scrape(ctx context.Context, ep string) (res scrapeResult) {
	res.start = p.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
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

// Run polls every Interval until ctx is done, then returns ctx.Err(). The
// first round starts at once. It fails with ErrRunning if the poller is
// already running. When it returns, the saturation reads 1 and no goroutine
// it started is left.
func (p *Poller) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	return p.loop(ctx)
}

func (p *Poller) loop(ctx context.Context) error {
	defer p.running.Store(false)
	defer func() {
		p.sat.Store(1)
		if p.ownHTTP {
			p.cfg.Client.CloseIdleConnections()
		}
	}()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		_ = p.Poll(ctx) // errors are per pod, in Readings
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
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

// Close stops a poller started with Start and waits for its goroutine (and
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
