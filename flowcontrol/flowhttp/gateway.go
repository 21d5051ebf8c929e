package flowhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
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

// CreditQueueDepthThreshold is the poller's Scorer.QueueDepthThreshold
// the gateway ships with the in-flight credit on (a zero threshold takes
// it; with NoCredit a zero threshold stays the reference
// saturation.DefaultQueueDepthThreshold, 5).
//
// Why not 5: the credit charges each request sent since a pod's last
// scrape at 1/Q of that pod's score (or its prompt tokens' share, if
// larger) as soon as the pod's queue term leads, which is where a
// saturated chat pool sits. At Q = 5 on two pods one
// release raises the pool score by 0.1, and the sheddable band, held near
// 0.9 by the soft-reflective ceiling, is hard-blocked until the next
// scrape: in the simulator at chat@80 (seed 1) it spent 61 % of the ticks
// blocked (9 % without the credit), the replicas ran batches of 695
// instead of 755, and the pool kept 95.8 % of the throughput of no flow
// control (5-seed median). At 6.25 a request weighs a fifth less (31 % of
// the ticks blocked, batches of 742): 97.1 % of the throughput at a
// critical TTFT p99 of 155 ms, inside 1.1× the 142 ms step-time bound (6
// keeps 96.97 %, 6.5 gives 156.4 ms, over it). It costs the knee nothing:
// there the credit charges a request its prompt tokens (a code-generation
// pod's slope is PromptMean/PromptTokenThreshold, above 1/Q), so
// codegen@16 reads 534 ms at every Q from 5 to 7, 1.95× the floor. The
// sweeps are in examples/sim/README.md ("The exact credit"); the
// simulator's default flowgate row runs this value.
const CreditQueueDepthThreshold = 6.25

// DefaultBands is GatewayConfig.Flow.Bands' default: llm-d's two objectives,
// critical (band 0, never gated by the soft-reflective ceiling) and
// sheddable. Their queues are long enough for a burst of a few seconds of a
// busy pool; a sheddable request that waited two minutes is refused 503
// expired rather than served after its client gave up.
func DefaultBands() []flowcontrol.BandConfig {
	return []flowcontrol.BandConfig{
		{Name: "critical", Capacity: 1024, MaxWait: 30 * time.Second},
		{Name: "sheddable", Capacity: 4096, MaxWait: 2 * time.Minute},
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
	// Policy (nil: soft-reflective), Burst, Tick, Pacing, Now. Source
	// must be nil: the gateway's saturation is the poller's, plus the
	// credit below.
	Flow flowcontrol.Config
	// Admitter, if set, sheds at the door (flowcontrol.ControllerConfig).
	Admitter flowcontrol.Admitter
	// OnOutcome, if set, is called with every queued request's outcome,
	// after the metrics have counted it (flowcontrol.ControllerConfig).
	OnOutcome func(band int, outcome error, waited time.Duration)
	// Poller configures the scraping of the endpoints' metrics (interval,
	// timeout, scorer, metric names: zero fields are the poller's
	// defaults). Endpoints must be empty (they come from Endpoints) and
	// InFlight nil (the gateway counts through Forward);
	// Scorer.InFlightCredit is set from NoCredit, and with the credit on a
	// zero Scorer.QueueDepthThreshold takes CreditQueueDepthThreshold. PeerInFlight adds
	// other gateway replicas' requests (redisshare.Endpoint.Others).
	Poller saturation.PollerConfig
	// NoCredit turns the in-flight credit off: the saturation is then
	// only what the scraped metrics said at the last scrape. With it on
	// (the default), a request counts at once as waiting on its
	// endpoint, from its release by the controller (before the host has
	// even chosen the endpoint) to the scrape that sees it, and an open
	// band re-reads the saturation after every release from a backlog
	// (flowcontrol.Pacing.Recheck): without both, a backlog built while
	// its band was gated reaches the pool in one tick the moment a
	// reading dips, and every request released between two scrapes is
	// invisible to the controller (see the package documentation).
	NoCredit bool
	// NoPromptTokens leaves the poller's Scorer.PromptTokenThreshold at 0
	// (off) when it is 0; otherwise a zero threshold takes
	// saturation.DefaultPromptTokenThreshold: a pod's waiting prompt
	// tokens (its waiting count times the mean prompt length of vLLM's
	// vllm:request_prompt_tokens histogram) saturate it at 4096, so a
	// queue of long prompts, several steps of prefill ahead of any new
	// critical request, gates sheddable work where five short ones would
	// not. Engines without that histogram (SGLang) have no such term.
	NoPromptTokens bool
	// HTTP configures Handler (classification, body bounds, OnFinish).
	HTTP Options
	// Metrics configures the collector Collector returns; BandNames is
	// filled from the bands.
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
}

// DefaultCriticalKVHeadroom is GatewayConfig.CriticalKVHeadroom's default
// when the gateway forwards priority (HTTP.ForwardPriority PrioritySet).
//
// Why: under vLLM's priority scheduling a critical request passes every
// sheddable one in a replica's waiting queue but still needs free KV blocks
// for its prompt, and vLLM preempts no running request to admit a waiting
// one: on a replica whose cache is full it waits at the head of the queue
// until the running requests' growth forces a preemption, while another
// replica may have room. In the simulator (examples/sim/README.md, "Backend
// priority at reasoning@0.7") routing band 0 among the replicas with 10 %
// of their cache free, and to the emptiest when none has it ("round 5"),
// took reasoning@0.7's critical TTFT p99 with soft-reflective and backend
// priority to 1.3× the critical-only floor on seeds 1–5 (241 ms) and over
// seeds 1–40 (224 ms), with nothing else under reasoning@1.2 moving; 3 of
// the 40 seeds stay above 4× the floor, and no headroom tried (0.05–0.3)
// removes them. The headroom is a filter, not a score (sending every
// critical request to the emptiest cache unbalanced the code-generation
// pods).
const DefaultCriticalKVHeadroom = 0.1

// Gateway is a protected inference gateway short of its routing: the
// metrics poller of the model servers, the in-flight credit, the
// flowcontrol.Controller, the HTTP Handler and their metrics, wired as
// examples/proxy runs them. The host routes: its handler, wrapped by
// Handler, picks an endpoint however it likes and calls Forward with it.
//
// A Gateway is safe for concurrent use. Its zero value is not usable: call
// NewGateway.
type Gateway struct {
	endpoints Router // the endpoints, by index, and the ready-made routing over them
	interval  time.Duration
	poller    *saturation.Poller
	ctrl      *flowcontrol.Controller
	intake    *intake
	col       *flowmetrics.Collector
	extra     *gatewayCollector
	credit    *releaseCredit // nil with NoCredit

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
	//lint:ignore SA1019 read only to refuse it: the gateway counts through Forward
	if len(cfg.Poller.Endpoints) != 0 || cfg.Poller.InFlight != nil {
		return nil, fmt.Errorf("%w: Poller.Endpoints and Poller.InFlight must be unset: the endpoints are GatewayConfig.Endpoints, counted by Forward", ErrInvalidConfig)
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
	if !cfg.NoPromptTokens && pc.Scorer.PromptTokenThreshold == 0 {
		pc.Scorer.PromptTokenThreshold = saturation.DefaultPromptTokenThreshold
	}
	poller, err := saturation.NewPoller(pc)
	if err != nil {
		return nil, fmt.Errorf("%w: Poller: %w", ErrInvalidConfig, err)
	}
	g.poller = poller
	g.interval = pc.Interval
	if g.interval == 0 {
		g.interval = saturation.DefaultInterval
	}

	fc := cfg.Flow
	if fc.Bands == nil {
		fc.Bands = DefaultBands()
	}
	var src flowcontrol.SaturationSource = poller
	if !cfg.NoCredit {
		g.credit = newReleaseCredit(poller, pc.Scorer.QueueDepthThreshold, len(urls))
		src = g.credit
		// A release is charged the moment it happens: re-reading while an
		// open band drains a backlog stops the drain as soon as the
		// gate closes (without the credit a re-read would see the same
		// reading, so it is only paid for with it).
		fc.Pacing.Recheck = true
	}
	fc.Source = src
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
	g.ctrl, err = flowcontrol.NewController(flowcontrol.ControllerConfig{Config: fc, OnOutcome: onOutcome, Admitter: cfg.Admitter})
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
	if g.credit != nil {
		g.credit.ctrl.Store(g.ctrl)
		g.credit.forwarded = &g.intake.forwarded
	}
	g.endpoints.poller = poller
	g.extra = newGatewayCollector(g, mo)
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
func (g *Gateway) Forward(w http.ResponseWriter, endpoint string) (done func()) {
	if rec := recorderOf(w); rec != nil && rec.intake == g.intake && !rec.forwarded {
		// From here on the poller counts it: it leaves the gap between
		// release and forwarding that releaseCredit charges (until the
		// handler returns, see ServeHTTP).
		rec.forwarded = true
		g.intake.forwarded.Add(1)
	}
	i, ok := g.endpoints.index[endpoint]
	if !ok {
		return func() {}
	}
	m := g.endpoints.murls[i]
	if !g.poller.Dispatched(m) {
		return func() {}
	}
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			g.poller.Finished(m)
		}
	}
}

// critical reports whether a request's headers place it in band 0 (its
// objective, or DefaultObjective when it names none): what Serve keeps its
// reserved connections for (ServerConfig.ReservedConns).
func (g *Gateway) critical(h http.Header) bool { return g.intake.preBand(h) == 0 }

// Router returns the gateway's ready-made routing, which a host with its
// own may ignore.
func (g *Gateway) Router() *Router { return &g.endpoints }

// Controller returns the flow controller (Stats, Bands, InFlight).
func (g *Gateway) Controller() *flowcontrol.Controller { return g.ctrl }

// Poller returns the metrics poller (Readings: which endpoints read
// usable, and why not).
func (g *Gateway) Poller() *saturation.Poller { return g.poller }

// Saturation is what the controller reads: the pool's scraped saturation
// with the in-flight credit, plus the releases not yet forwarded.
func (g *Gateway) Saturation() float64 {
	if g.credit != nil {
		return g.credit.Saturation()
	}
	return g.poller.Saturation()
}

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

// releaseCredit is the controller's saturation source when the in-flight
// credit is on: the poller's saturation plus the requests the controller
// has released that the host has not yet Forwarded.
//
// Why: the poller credits a request when the host names its endpoint
// (Forward), but the controller releases it earlier, on its own goroutine,
// and the request's goroutine forwards it a scheduling delay later. A
// backlog released in one drain is therefore invisible to the gate that
// drains it, and Pacing.Recheck would re-read an unchanged saturation (20 of
// 20 queued requests reached one idle pod in the example proxy's
// TestProxyBacklogDoesNotFloodOnReopen without this). Controller.InFlight
// counts a release before its waiter wakes, forwarded counts the released
// requests handed to the poller and not finished, and their difference is
// what neither has counted.
//
// Each such request is charged as one waiting request on one of the N pods
// (1/(Q·N) of pool score), what the poller will charge once it is forwarded
// if the pod's request-count term dominates; where the KV term does, the
// charge is an overestimate for that brief gap, erring towards gating, and
// where the prompt-token term does, an underestimate (the poller charges
// PromptMean/PromptTokenThreshold per request there).
type releaseCredit struct {
	poller    *saturation.Poller
	ctrl      atomic.Pointer[flowcontrol.Controller]
	forwarded *atomic.Int64 // the gate's: released requests Forwarded and not finished
	per       float64       // pool score of one waiting request: 1/(Q·N)
}

func newReleaseCredit(p *saturation.Poller, queueThreshold float64, pods int) *releaseCredit {
	if queueThreshold <= 0 {
		queueThreshold = saturation.DefaultQueueDepthThreshold
	}
	return &releaseCredit{poller: p, per: 1 / (queueThreshold * float64(max(pods, 1)))}
}

// Saturation implements flowcontrol.SaturationSource.
func (c *releaseCredit) Saturation() float64 {
	s := c.poller.Saturation()
	if ctrl := c.ctrl.Load(); ctrl != nil && c.forwarded != nil {
		if gap := ctrl.InFlight() - c.forwarded.Load(); gap > 0 {
			s += float64(gap) * c.per
		}
	}
	return s
}

// ReadingSeq implements flowcontrol.ReadingSource: the poller's readings.
func (c *releaseCredit) ReadingSeq() uint64 { return c.poller.ReadingSeq() }
