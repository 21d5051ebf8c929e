package flowhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
	"github.com/flowgate/flowgate/saturation"
)

// Errors of a Gateway's life.
var (
	// ErrInvalidConfig: NewGateway was given a configuration it cannot
	// run; the message names the field.
	ErrInvalidConfig = errors.New("flowhttp: invalid gateway configuration")
	// ErrStarted: Start or Serve on a gateway already running.
	ErrStarted = errors.New("flowhttp: gateway already started")
	// ErrGatewayClosed: Start or Serve on a gateway that was closed.
	ErrGatewayClosed = errors.New("flowhttp: gateway closed")
)

// DefaultMetricsPath is where GatewayConfig.Endpoints serve their metrics
// (vLLM's and SGLang's path).
const DefaultMetricsPath = "/metrics"

// CreditQueueDepthThreshold is the Scorer.QueueDepthThreshold a Gateway
// runs with the in-flight credit on, when GatewayConfig.Poller leaves it 0
// (with NoCredit, 0 means saturation.DefaultQueueDepthThreshold). It is
// above that reference because the credit charges each request released
// since the last scrape at once: a lower value makes each release weigh
// more, and on a saturated pool blocks the sheddable band between scrapes,
// at a cost in throughput.
const CreditQueueDepthThreshold = 6.25

// DefaultBands is GatewayConfig.Flow.Bands' default: llm-d's two objectives,
// critical (band 0, never gated: see flowcontrol.Dispatcher) and
// sheddable. Their queues are long enough for a burst of a few seconds of a
// busy pool; a sheddable request that waited two minutes is refused 503
// expired rather than served after its client gave up. Both are
// round-robin between flows (the callers' identities, see Options.Identify),
// so one caller's flood adds one turn per round to another's wait.
func DefaultBands() []flowcontrol.BandConfig {
	return []flowcontrol.BandConfig{
		{Name: "critical", Capacity: 1024, MaxWait: 30 * time.Second, Fairness: flowcontrol.FairnessRoundRobin},
		{Name: "sheddable", Capacity: 4096, MaxWait: 2 * time.Minute, Fairness: flowcontrol.FairnessRoundRobin},
	}
}

// GatewayConfig configures NewGateway. Every zero field takes a default
// that protects: soft-reflective over DefaultBands, vLLM's metrics, the
// in-flight credit on, and Options' safe zero values.
type GatewayConfig struct {
	// Endpoints are the model servers' base URLs
	// ("http://10.0.0.7:8000"), the names the host gives Forward. With
	// none the pool reads saturated (only band 0 passes, for the host to
	// refuse).
	Endpoints []string
	// MetricsPath is where each endpoint serves its Prometheus metrics.
	// Empty: DefaultMetricsPath.
	MetricsPath string
	// Flow configures the controller: Bands (nil: DefaultBands()),
	// Policy (nil: soft-reflective), Burst, Tick, BlockCritical, Now. Source
	// must be nil: the gateway's saturation is the poller's, plus the
	// credit below.
	Flow flowcontrol.Config
	// Admitter sheds at the door, before a request queues
	// (flowcontrol.ControllerConfig). Nil: nothing is shed.
	Admitter flowcontrol.Admitter
	// OnOutcome is called with every queued request's outcome, after the
	// metrics have counted it (flowcontrol.ControllerConfig). Nil: only
	// the metrics see it.
	OnOutcome func(band int, outcome error, waited time.Duration)
	// Poller configures the scraping of the endpoints' metrics (interval,
	// timeout, scorer, metric names); zero fields are the poller's
	// defaults. Endpoints must be empty (they come from Endpoints).
	// Scorer.InFlightCredit is set from NoCredit, and with the credit on a
	// zero Scorer.QueueDepthThreshold means CreditQueueDepthThreshold.
	// PeerInFlight adds other gateway replicas' requests
	// (redisshare.Endpoint.Others).
	Poller saturation.PollerConfig
	// NoCredit turns the in-flight credit off, for comparison; false (the
	// default) keeps it on. With it on, a released request counts at once
	// as waiting on an average endpoint, and from Forward on as waiting on
	// its own, until a scrape shows it, so the requests released between
	// two scrapes close the gate before they fill the pool. Off, the
	// saturation is what the last scrape said.
	NoCredit bool
	// OnRetire is called once for each forwarded request the credit
	// retires (see Forward), with its endpoint as given to Forward, from
	// the poller's goroutine: a host that counts its requests per endpoint
	// elsewhere (the replicas' shared view) takes it out there, and skips
	// it when its done reports it retired. Nil: not called.
	OnRetire func(endpoint string)
	// HTTP configures Handler (classification, body bounds, OnFinish);
	// its zero value protects (see Options).
	HTTP Options
	// Metrics configures the collector Collector returns; zero fields are
	// flowmetrics' defaults, and BandNames is filled from the bands.
	Metrics flowmetrics.Options
	// CriticalKVHeadroom turns on the Router's critical routing: a band-0
	// request goes to an endpoint with at least this share of its KV cache
	// free at its last reading (1 − the poller's Reading.KVUsage), or, when
	// none has it, to those with the most free. In [0, 1]. 0 means
	// DefaultCriticalKVHeadroom when HTTP.ForwardPriority is PrioritySet
	// (the operator's statement that the model servers schedule by
	// priority), and off otherwise (NoCriticalKVRouting: off whatever
	// ForwardPriority says).
	CriticalKVHeadroom float64
	// NoCriticalKVRouting turns the critical routing off: band 0 is routed
	// as every band (CriticalKVHeadroom must then be 0).
	NoCriticalKVRouting bool
	// Eviction turns eviction on when Enabled (off by default): while a
	// request of a more critical band waits — forwarded, without its first
	// byte for Eviction.Stall, to an endpoint whose KV cache reads full
	// (Eviction.KVThreshold; KVUsage defaults to the poller's reading), or
	// queued behind a gate while the pool reads saturated — the gateway
	// takes back forwarded requests of less critical bands
	// (flowcontrol.Evictor has the rule). It cancels
	// the victim's request to its endpoint (vLLM and SGLang abort a request
	// whose connection closes, and free its KV cache). A victim that has
	// sent no body byte to its client is not failed: its attempt's output
	// is dropped and it waits again at the head of its band, with its
	// first wait's MaxWait deadline (then 503 expired with Retry-After),
	// and its client sees only a later first token. A started response is
	// never cut unless Eviction.Started: then a streamed one ends with an
	// OpenAI-shaped error event, any other with its connection cut.
	//
	// With eviction on, the Handler holds a response's status and headers
	// until its first body byte (or until the handler returns), and the
	// host's handler must call Forward and serve the request with the
	// request's context (httputil.ReverseProxy does), which the eviction
	// cancels; it may be called more than once per request. A zero Grace
	// is the poller's interval (at least flowcontrol.DefaultEvictionGrace);
	// a Grace shorter than the interval is an error: the freed capacity
	// would not show in the saturation before the next eviction is judged.
	Eviction flowcontrol.EvictionConfig
	// Logger receives the gateway's one line at Start: whom it trusts
	// with a band (Options.Identify, Options.TrustObjectiveHeader, or
	// nobody). Nil: slog.Default().
	Logger *slog.Logger
}

// DefaultCriticalKVHeadroom is GatewayConfig.CriticalKVHeadroom's default
// when the gateway forwards priority (HTTP.ForwardPriority PrioritySet).
// A server that schedules by priority lets a critical request pass every
// queued one, but admits it only once its prompt's KV blocks are free, and
// preempts no running request to free them, while another server may have
// the room now. The headroom filters the endpoints and does not rank them:
// sending every critical request to the emptiest cache can unbalance the
// pool.
const DefaultCriticalKVHeadroom = 0.1

// Gateway is a protected inference gateway short of its routing: the
// metrics poller of the model servers, the in-flight credit, the
// flowcontrol.Controller, the HTTP Handler and their metrics, wired as
// examples/proxy runs them. The host routes: its handler, wrapped by
// Handler, picks an endpoint however it likes (Router offers a ready-made
// pick) and calls Forward with it.
//
// A Gateway is safe for concurrent use. Its zero value is not usable: call
// NewGateway.
type Gateway struct {
	endpoints Router // the endpoints, by index, and the ready-made routing over them
	interval  time.Duration
	poller    *saturation.Poller
	ctrl      *flowcontrol.Controller
	intake    *intake
	fwd       []forwardedList // per endpoint, by index: its requests forwarded and not done
	col       *flowmetrics.Collector
	extra     *gatewayCollector
	logger    *slog.Logger

	mu      sync.Mutex
	state   int // 0 new, 1 running, 2 closed
	cancel  context.CancelFunc
	stopped chan struct{} // closed when the controller and poller have returned
}

// NewGateway validates cfg and builds the gateway; Start (or Serve) runs it.
// Every error wraps ErrInvalidConfig (or the package's own sentinel that
// caused it) and names the field.
func NewGateway(cfg GatewayConfig) (*Gateway, error) {
	if cfg.Flow.Source != nil {
		return nil, fmt.Errorf("%w: Flow.Source must be nil: the gateway reads its poller", ErrInvalidConfig)
	}
	if len(cfg.Poller.Endpoints) != 0 {
		return nil, fmt.Errorf("%w: Poller.Endpoints must be unset: the endpoints are GatewayConfig.Endpoints", ErrInvalidConfig)
	}
	switch h := cfg.CriticalKVHeadroom; {
	case !(h >= 0 && h <= 1):
		return nil, fmt.Errorf("%w: CriticalKVHeadroom %v must be in [0, 1]", ErrInvalidConfig, h)
	case cfg.NoCriticalKVRouting && h != 0:
		return nil, fmt.Errorf("%w: CriticalKVHeadroom %v with NoCriticalKVRouting: set one or the other", ErrInvalidConfig, h)
	}
	path := cfg.MetricsPath
	if path == "" {
		path = DefaultMetricsPath
	}
	g := &Gateway{}
	switch {
	case cfg.NoCriticalKVRouting:
	case cfg.CriticalKVHeadroom > 0:
		g.endpoints.headroom = cfg.CriticalKVHeadroom
	case cfg.HTTP.ForwardPriority == PrioritySet:
		g.endpoints.headroom = DefaultCriticalKVHeadroom
	}
	urls, err := g.endpoints.configure(cfg.Endpoints, path)
	if err != nil {
		return nil, err
	}
	pc := cfg.Poller
	pc.Endpoints = urls
	pc.Scorer.InFlightCredit = !cfg.NoCredit
	if !cfg.NoCredit && pc.Scorer.QueueDepthThreshold == 0 {
		pc.Scorer.QueueDepthThreshold = CreditQueueDepthThreshold
	}
	now := pc.Now
	if now == nil {
		now = time.Now
	}
	g.fwd = make([]forwardedList, len(urls))
	for i, u := range urls {
		g.fwd[i].endpoint, g.fwd[i].base, g.fwd[i].now, g.fwd[i].onRetire = u, g.endpoints.bases[i], now, cfg.OnRetire
	}
	if !cfg.NoCredit {
		user := pc.OnReading
		pc.OnReading = func(r saturation.PodReading) {
			if i, ok := g.endpoints.byMetric[r.Endpoint]; ok {
				g.fwd[i].retire(r)
			}
			if user != nil {
				user(r)
			}
		}
	}
	poller, err := saturation.NewPoller(pc)
	if err != nil {
		return nil, fmt.Errorf("%w: Poller: %w", ErrInvalidConfig, err)
	}
	g.poller = poller
	for i := range g.fwd {
		g.fwd[i].poller = poller
	}
	g.interval = pc.Interval
	if g.interval == 0 {
		g.interval = saturation.DefaultInterval
	}

	fc := cfg.Flow
	if fc.Bands == nil {
		fc.Bands = DefaultBands()
	}
	fc.Source = poller
	mo := cfg.Metrics
	mo.BandNames = make([]string, len(fc.Bands))
	for i, b := range fc.Bands {
		mo.BandNames[i] = b.Name
		if b.Name == "" {
			mo.BandNames[i] = fmt.Sprintf("band%d", i)
		}
	}
	g.col, err = flowmetrics.New(len(fc.Bands), mo)
	if err != nil {
		return nil, fmt.Errorf("%w: Metrics: %w", ErrInvalidConfig, err)
	}
	onOutcome := g.col.OnOutcome
	if user := cfg.OnOutcome; user != nil {
		onOutcome = func(band int, outcome error, waited time.Duration) {
			g.col.OnOutcome(band, outcome, waited)
			user(band, outcome, waited)
		}
	}
	ev := cfg.Eviction
	if ev.Enabled {
		switch {
		case ev.Grace == 0:
			ev.Grace = max(g.interval, flowcontrol.DefaultEvictionGrace)
		case ev.Grace > 0 && ev.Grace < g.interval:
			return nil, fmt.Errorf("%w: Eviction.Grace %v is shorter than the poller's interval %v", ErrInvalidConfig, ev.Grace, g.interval)
		}
		if ev.KVUsage == nil {
			// Each endpoint's KV-cache usage as the poller last read it
			// from its metrics URL (NaN while it has no usable reading,
			// or for an endpoint the gateway does not know: nothing is
			// taken there).
			ev.KVUsage = func(endpoint string) float64 {
				i, ok := g.endpoints.index[endpoint]
				if !ok {
					return math.NaN()
				}
				return g.poller.KVUsage(g.fwd[i].endpoint)
			}
		}
	}
	cc := flowcontrol.ControllerConfig{Config: fc, OnOutcome: onOutcome, Admitter: cfg.Admitter, Eviction: ev}
	if cfg.NoCredit {
		// The controller would tell the poller of each release (its
		// credit to the pool); with NoCredit nothing is credited.
		cc.InFlight = uncounted{}
	}
	g.ctrl, err = flowcontrol.NewController(cc)
	if err != nil {
		return nil, fmt.Errorf("%w: Flow: %w", ErrInvalidConfig, err)
	}
	if err := g.col.Bind(g.ctrl); err != nil {
		return nil, fmt.Errorf("%w: Metrics: %w", ErrInvalidConfig, err)
	}
	g.intake, err = newIntake(g.ctrl, cfg.HTTP)
	if err != nil {
		return nil, fmt.Errorf("%w: HTTP: %w", ErrInvalidConfig, err)
	}
	if e := g.ctrl.Evictor(); e != nil {
		g.intake.evict = &evicting{ev: e, started: e.Config().Started, counts: make([]evictCounts, len(fc.Bands))}
	}
	g.endpoints.poller = poller
	g.extra = newGatewayCollector(g, mo)
	g.logger = cfg.Logger
	if g.logger == nil {
		g.logger = slog.Default()
	}
	return g, nil
}

// Handler returns next, the host's forwarding handler, behind the queue: a
// gated request reaches next once the controller releases it, with its body
// buffered (see the package documentation). next calls Forward with the
// endpoint it sends the request to. Handlers from several calls share the
// gateway's queues and budgets.
func (g *Gateway) Handler(next http.Handler) http.Handler {
	return &handler{intake: g.intake, next: next}
}

// Forward tells the gateway that the request w answers is being sent to
// endpoint (one of GatewayConfig.Endpoints, as written there), and returns
// the function to call when the endpoint is done with it (its response
// copied, or the stream ended, or the attempt failed). Call it from the
// handler Handler wraps, right before sending; done may be called more than
// once. The request counts at once in the endpoint's in-flight credit, so
// the saturation moves before the next scrape. A request retried on another
// endpoint calls Forward again (and the first done); an endpoint the
// gateway does not know is not counted.
//
// With the credit on, the count ends early when the endpoint reports it
// finished, whatever the client still does with the answer: when a scrape
// sent at least a second after Forward shows fewer requests waiting and
// running on the endpoint than the gateway forwarded there before, the
// oldest of those beyond the server's count are done at once (their
// controller slots released too, GatewayConfig.OnRetire called), and their
// done does nothing but report retired true; it reports false otherwise.
//
// With eviction on (GatewayConfig.Eviction), Forward also has the evictor
// track the request on endpoint until done, or until the handler returns,
// which gives back the endpoint's count of each Forward of an evicted
// attempt, once, whether or not done was called.
func (g *Gateway) Forward(w http.ResponseWriter, endpoint string) (done func() (retired bool)) {
	rec := recorderOf(w)
	if rec != nil && rec.intake == g.intake && !rec.forwarded {
		// From here on the poller counts it (the gap between release
		// and forwarding is exported as a metric).
		rec.forwarded = true
		g.intake.forwarded.Add(1)
	}
	done = g.count(rec, endpoint)
	if rec != nil && rec.intake == g.intake && rec.at != nil {
		// Eviction on: the evictor tracks the request on endpoint from
		// here until done (or the attempt's end).
		done = rec.at.forward(g.intake.evict.ev, endpoint, done)
	}
	return done
}

// count is Forward's count of the request on endpoint, and its done.
func (g *Gateway) count(rec *recorder, endpoint string) func() bool {
	i, ok := g.endpoints.index[endpoint]
	if !ok {
		return notCounted
	}
	l := &g.fwd[i]
	if !g.poller.Dispatched(l.endpoint) {
		return notCounted
	}
	f := &forwarded{}
	if rec != nil && rec.intake == g.intake {
		f.permit = rec.permit
	}
	l.push(f)
	return func() bool { return f.done(l) }
}

// notCounted is the done of a request Forward did not count.
func notCounted() bool { return false }

// critical reports whether a request is granted band 0 before its body is
// read (by its identity, the trusted objective header or DefaultObjective,
// and not lowered by its headers): what Serve keeps its reserved
// connections for (ServerConfig.ReservedConns).
func (g *Gateway) critical(r *http.Request) bool {
	ceiling, _ := g.intake.grant(r)
	return g.intake.preBand(r.Header, ceiling) == 0
}

// Router returns the gateway's ready-made routing, which a host with its
// own may ignore.
func (g *Gateway) Router() *Router { return &g.endpoints }

// Controller returns the flow controller (Stats, Bands, InFlight).
func (g *Gateway) Controller() *flowcontrol.Controller { return g.ctrl }

// Poller returns the metrics poller (Readings: which endpoints read
// usable, and why not).
func (g *Gateway) Poller() *saturation.Poller { return g.poller }

// Saturation is what the controller reads: the pool's scraped saturation
// with the in-flight credit.
func (g *Gateway) Saturation() float64 { return g.poller.Saturation() }

// Collector returns the gateway's metrics, to register with a Prometheus
// registry: flowmetrics' (queue depth, outcomes, waits, saturation, gates
// per band), the bytes of request bodies held, and per endpoint the score,
// queue, KV-cache usage and requests in flight the poller last saw.
func (g *Gateway) Collector() prometheus.Collector { return g.extra }

// Start runs the controller and the poller until ctx is done or Close; the
// controller is running when Start returns, so no request sees
// ErrNotRunning. It fails with ErrStarted or ErrGatewayClosed.
func (g *Gateway) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case 1:
		return ErrStarted
	case 2:
		return ErrGatewayClosed
	}
	g.state = 1
	g.logger.Info("flowgate: gateway started", "classification", g.intake.trustMode(),
		"default_band", g.intake.bands[g.intake.defBand].name)
	ctx, g.cancel = context.WithCancel(ctx)
	g.stopped = make(chan struct{})
	ran := g.ctrl.Start(ctx)
	polled := make(chan struct{})
	go func() { defer close(polled); _ = g.poller.Run(ctx) }()
	watched := make(chan struct{})
	go func() { defer close(watched); g.endpoints.watch(ctx, g.interval) }()
	go func() {
		<-ran
		<-polled
		<-watched
		close(g.stopped)
	}()
	return nil
}

// Drain is the first step of a graceful shutdown: every queued request is
// answered 503 shutting-down, and so is every request that arrives later.
// Requests already released go on; call Close once they have finished (for
// example after http.Server.Shutdown returns).
func (g *Gateway) Drain() { g.ctrl.Close() }

// Close drains and stops the controller and the poller and waits for their
// goroutines. Idempotent.
func (g *Gateway) Close() {
	g.ctrl.Close()
	g.mu.Lock()
	stopped := g.stopped
	if g.cancel != nil {
		g.cancel()
	}
	g.state = 2
	g.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
	_ = g.poller.Close()
}

// uncounted is the in-flight hook of a gateway without credit: releases are
// not counted anywhere.
type uncounted struct{}

func (uncounted) Inc() {}
func (uncounted) Dec() {}
