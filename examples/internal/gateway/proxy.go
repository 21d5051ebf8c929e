package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
	"github.com/flowgate/flowgate/saturation/redisshare"
)

// Headers the proxy sets: flowhttp's.
const (
	// ReasonHeader says why the proxy itself answered (no model server
	// response): one of the Reason values below. llm-d's name.
	ReasonHeader = flowhttp.DroppedReasonHeader
	// BandHeader carries the band the request was queued in.
	BandHeader = flowhttp.BandHeader
)

// Reasons in ReasonHeader, with their status codes (flowhttp's, plus the
// proxy's own no-backend and backend-error):
//
//	queue-full       429  the band already holds its capacity of waiting requests
//	queue-bytes-full 429  the band's waiting bodies fill its byte budget
//	expired          503  waited longer than the band's maxWait (x-should-retry: false)
//	shutting-down    503  the proxy is shutting down (it was queued, or arrived late)
//	body-too-large   413  the request body exceeds MaxBodyBytes
//	body-timeout     408  the request body arrived slower than MinBodyRate
//	bad-body         400  the request body could not be read
//	no-backend       503  no backend is configured
//	backend-error    502  the backend could not be reached or failed mid-response
//
// A client that goes away while queued gets no answer (there is nobody to
// answer) and is counted as the cancelled outcome.
const (
	ReasonQueueFull    = flowhttp.ReasonQueueFull
	ReasonBytesFull    = flowhttp.ReasonBytesFull
	ReasonExpired      = flowhttp.ReasonExpired
	ReasonShutdown     = flowhttp.ReasonShuttingDown
	ReasonTooLarge     = flowhttp.ReasonTooLarge
	ReasonBodyTimeout  = flowhttp.ReasonBodyTimeout
	ReasonBadBody      = flowhttp.ReasonBadBody
	ReasonNoBackend    = "no-backend"
	ReasonBackendError = "backend-error"
	ReasonCancelled    = flowhttp.ReasonCancelled // metrics only: never sent
	ReasonForwarded    = flowhttp.ReasonForwarded // metrics only: the backend answered
)

// Options configures NewProxy.
type Options struct {
	Config   Config
	Backends []string // base URLs of the model servers, e.g. http://127.0.0.1:8001
	// MaxBodyBytes caps a gated request's body. Default 8 MiB.
	MaxBodyBytes int64
	// BodyGrace and MinBodyRate (bytes/s) cut a gated request's body that
	// arrives slower than MinBodyRate after BodyGrace, with 408. Defaults
	// 5 s and 1 KiB/s (flowhttp's); MinBodyRate < 0: no limit.
	BodyGrace   time.Duration
	MinBodyRate int64
	// BodyIdleTimeout cuts a body of which nothing arrived for this long
	// (408). Default 10 s (flowhttp's); < 0: none.
	BodyIdleTimeout time.Duration
	// MaxBodyMemory bounds the bytes of every gated body being read or
	// waiting, together. Default 64 MiB (flowhttp's); < 0: no bound.
	MaxBodyMemory int64
	// BackendResponseHeaderTimeout bounds the wait for a backend's
	// response headers. Default 10 min (a non-streamed completion's
	// headers come when it is done).
	BackendResponseHeaderTimeout time.Duration
	// LLMDMetrics exports the four facts llm-d's flow controller names
	// under llm-d's names (llm_d_epp_flow_control_*; see llmd.go) in place
	// of flowgate's (flowgate_queue_depth, _saturation, _requests_total,
	// _wait_seconds), so that each fact is served once.
	LLMDMetrics bool
	// Logf logs; default log.Printf. Use a no-op in tests.
	Logf func(format string, args ...any)
	// OnFinish, if set, is called when a gated request is finished: its
	// band, the status sent (0: none, the client left) and the reason
	// ("forwarded" when the backend answered). Tests wait on it.
	OnFinish func(band, code int, reason string)
	// APIKeys maps API keys (Authorization: Bearer <key>) to tenants: the
	// band a key's requests may use at most and their fairness id (see
	// ParseAPIKeys). A request without a known key is anonymous: at most
	// the default band. Nil: every caller is anonymous.
	APIKeys map[string]Tenant
	// TrustObjectiveHeader trusts the objective header from every caller
	// without a key, as llm-d does: only behind a front proxy that
	// authenticates and sets the header (flowhttp.Options).
	TrustObjectiveHeader bool
	// StripLLMDHeaders is llm-d's advice made a switch: every x-llm-d-*
	// and x-gateway-inference-* request header is removed at ingress,
	// and a request with a known key gets the objective (its ceiling
	// band) and fairness id of its tenant, which the backend sees too.
	StripLLMDHeaders bool
	// OnPick, if set, is called on every choice of a backend, on the
	// request path: with the instant the choice was made, every backend
	// as the choice saw it (in Backends order) and the index of the one
	// chosen (see BackendState). Tests check the routing with it.
	OnPick func(now time.Time, backends []BackendState, picked int)
	// DialContext, if set, connects to the backends, for their requests
	// and their /metrics, in place of a net.Dialer: the demo's test serves
	// them on an in-memory network (see examples/internal/memnet).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Eviction, with Config.Eviction on, is the evictor's settings (its
	// Enabled is Config.Eviction's; a zero field takes the gateway's
	// default): the demo divides its times by the fake backends' speed-up,
	// as it does the scrape interval's. Ignored with Config.Eviction off.
	Eviction flowcontrol.EvictionConfig
}

// BackendState is what the choice of a backend knows of one: the backend
// is passed over while it failed within EjectFor or its metrics are
// unusable, unless every backend is in that state.
type BackendState struct {
	URL string // as in Options.Backends
	// FailedAt is the backend's last failed answer (a 5xx or a transport
	// error, as the proxy saw it); zero if none, or if it answered well
	// since.
	FailedAt time.Time
	// Unusable: the poller's last verdict on the backend's /metrics was
	// failed, stale or never scraped (copied once per scrape interval).
	Unusable bool
}

// newBackendState is a backend's state from its failedAt (unix ns, 0:
// none) and unusable flags.
func newBackendState(url string, failedAt int64, unusable bool) BackendState {
	s := BackendState{URL: url, Unusable: unusable}
	if failedAt != 0 {
		s.FailedAt = time.Unix(0, failedAt)
	}
	return s
}

type backend struct {
	base     *url.URL
	label    string               // its base URL: the metrics label (unique, unlike host:port)
	metrics  string               // its /metrics URL, the poller's key for it
	inflight atomic.Int64         // this replica's requests in flight (when not shared)
	shared   *redisshare.Endpoint // this replica's and the others' (when shared), else nil
	failedAt atomic.Int64         // unix ns of its last failed answer (5xx or transport error); 0 = healthy
	unusable atomic.Bool          // the poller's last verdict on its /metrics: failed, stale or never scraped
	reason   string               // why it was unusable at the last look (watchPods only)
	rp       *httputil.ReverseProxy
}

// inc counts one request dispatched to b by this replica.
func (b *backend) inc() {
	if b.shared != nil {
		b.shared.Inc()
		return
	}
	b.inflight.Add(1)
}

// dec counts one of this replica's requests to b finished.
func (b *backend) dec() {
	if b.shared != nil {
		b.shared.Dec()
		return
	}
	b.inflight.Add(-1)
}

// own is this replica's requests in flight to b.
func (b *backend) own() int64 {
	if b.shared != nil {
		return b.shared.Own()
	}
	return b.inflight.Load()
}

// load is what pick compares: every replica's requests in flight to b when
// the view is shared (own + the others' last fetch), else this replica's.
func (b *backend) load() int64 {
	if b.shared != nil {
		return b.shared.InFlight()
	}
	return b.inflight.Load()
}

// EjectFor is how long a backend that just failed (a 5xx or a transport
// error) is passed over by pick, as long as another backend is eligible.
// Without it a backend that fails fast has the fewest requests in flight
// and draws the most traffic.
const EjectFor = time.Second

// Proxy gates requests with a flowhttp.Gateway and forwards them to the
// least-loaded backend. It is an http.Handler. Everything that protects (the
// poller, the in-flight credit, the controller, the gate, the body bounds)
// is the public Gateway's; what is here is the example's own: its
// configuration, its routing (pick), the replicas' shared view and its
// metrics.
type Proxy struct {
	cfg      Config
	logf     func(string, ...any)
	gw       *flowhttp.Gateway
	backends []*backend
	byMetric map[string]*backend
	handler  http.Handler // the gate in front of route
	llmd     *llmdMetrics // nil unless Options.LLMDMetrics
	reg      *prometheus.Registry
	gather   prometheus.Gatherer    // what /metrics serves: reg, less what llm-d's names replace
	shared   *redisshare.InFlight   // nil unless Config.Shared is enabled
	answers  *prometheus.CounterVec // proxy-level responses by band, code and reason
	// okAnswers caches answers' child for a forwarded 200, per band (see
	// answer).
	okAnswers []atomic.Pointer[prometheus.Counter]
	rr        atomic.Uint64 // tie-breaker for backend choice
	onFinish  func(band, code int, reason string)
	onPick    func(now time.Time, backends []BackendState, picked int)

	mu          sync.Mutex
	closeShared sync.Once
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	started     bool
}

// NewProxy builds the gateway (controller, saturation poller, gate) and the
// metrics registry. Start runs them.
func NewProxy(opts Options) (_ *Proxy, err error) {
	cfg := opts.Config
	if len(cfg.Bands) == 0 {
		return nil, errors.New("proxy: Config.Bands is empty")
	}
	p := &Proxy{
		cfg:      cfg,
		logf:     opts.Logf,
		onFinish: opts.OnFinish,
		onPick:   opts.OnPick,
		byMetric: map[string]*backend{},
		reg:      prometheus.NewRegistry(),
	}
	if p.logf == nil {
		p.logf = log.Printf
	}
	if sh := cfg.Shared; sh.Enabled() {
		conn, err := sh.RedisOptions()
		if err != nil {
			return nil, fmt.Errorf("proxy: sharedInFlight: %w", err)
		}
		view, err := redisshare.New(redisshare.Options{Redis: conn, ReplicaID: sh.ReplicaID,
			Period: sh.Period, TTL: sh.TTL, Logger: slog.New(slog.NewTextHandler(logfWriter(p.logf), nil))})
		if err != nil {
			return nil, fmt.Errorf("proxy: sharedInFlight: %w", err)
		}
		p.shared = view
		defer func() {
			if err != nil {
				_ = view.Close()
			}
		}()
	}
	// One transport for every backend: enough idle connections that a
	// burst of streams does not churn them.
	transport := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// A backend that accepts and never answers holds the slot
		// until this, not forever.
		ResponseHeaderTimeout: opts.BackendResponseHeaderTimeout,
	}
	if transport.ResponseHeaderTimeout == 0 {
		transport.ResponseHeaderTimeout = 10 * time.Minute
	}
	if opts.DialContext != nil {
		transport.DialContext = opts.DialContext
	}
	for i, raw := range opts.Backends {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("proxy: backends[%d]: %q is not an http(s) base URL", i, raw)
		}
		b := &backend{base: u, label: raw, metrics: u.JoinPath("metrics").String()}
		if _, dup := p.byMetric[b.metrics]; dup {
			return nil, fmt.Errorf("proxy: backends[%d]: %q listed twice", i, raw)
		}
		b.rp = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(b.base)
				pr.Out.Host = b.base.Host
				forwardBuffered(pr)
			},
			Transport: transport,
			// FlushInterval 0: httputil flushes text/event-stream
			// and unknown-length (chunked) answers at every write
			// anyway, so streamed tokens are not held back; a
			// non-streamed answer is copied without a flush per
			// write (-1 cost ~20 % CPU there).
			ModifyResponse: stripOwnHeaders,
			ErrorHandler:   p.backendError,
			ErrorLog:       log.New(io.Discard, "", 0),
			// Without a pool httputil allocates a 32 KiB copy buffer
			// per response, which is most of a small request's
			// garbage.
			BufferPool: copyBuffers,
		}
		if p.shared != nil {
			// Its base URL: the same name on every replica given the
			// same -backends.
			b.shared = p.shared.Endpoint(b.label)
		}
		p.backends = append(p.backends, b)
		p.byMetric[b.metrics] = b
	}

	sc := cfg.Saturation
	var peers func(string) int64
	if p.shared != nil {
		// The other replicas' requests join the in-flight credit; this
		// replica's own go through the gateway's Forward.
		peers = func(ep string) int64 {
			if b := p.byMetric[ep]; b != nil && b.shared != nil {
				return b.shared.Others()
			}
			return 0
		}
	}
	policy, err := newPolicy(cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("proxy: policy: %w", err)
	}
	gc := GatewayConfig(cfg, policy)
	gc.Endpoints = opts.Backends
	gc.Poller.PeerInFlight = peers
	gc.OnRetire = p.retired
	if cfg.Eviction {
		gc.Eviction = opts.Eviction
		gc.Eviction.Enabled = true
	}
	if opts.DialContext != nil {
		scrape := transport.Clone()
		scrape.ResponseHeaderTimeout = 0 // the poller's Timeout bounds a scrape
		gc.Poller.Client = &http.Client{Transport: scrape}
	}
	gc.Poller.Timeout = max(saturation.MinTimeout, min(sc.MetricsStalenessThreshold/2, saturation.DefaultTimeout))
	gc.HTTP.MaxBodyBytes = opts.MaxBodyBytes
	gc.HTTP.MaxBodyMemory = opts.MaxBodyMemory
	gc.HTTP.BodyGrace = opts.BodyGrace
	gc.HTTP.MinBodyRate = opts.MinBodyRate
	gc.HTTP.BodyIdleTimeout = opts.BodyIdleTimeout
	gc.HTTP.OnFinish = p.finished
	gc.HTTP.TrustObjectiveHeader = opts.TrustObjectiveHeader
	if opts.APIKeys != nil || opts.StripLLMDHeaders {
		id, err := newIdentifier(opts.APIKeys, cfg.Bands, opts.StripLLMDHeaders)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		gc.HTTP.Identify = id.identify
	}
	p.gw, err = flowhttp.NewGateway(gc)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	p.answers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flowgate_proxy_responses_total",
		Help: "Requests the proxy finished, by band, HTTP status sent (0: client gone, none sent) and reason (forwarded: the backend answered).",
	}, []string{"band", "code", "reason"})
	p.okAnswers = make([]atomic.Pointer[prometheus.Counter], len(cfg.Bands))
	p.reg.MustRegister(p.gw.Collector(), p.answers)
	p.gather = p.reg
	if p.shared != nil {
		p.reg.MustRegister(p.shared.Collector(), newOthersCollector(p))
	}
	if opts.LLMDMetrics {
		p.llmd = newLLMDMetrics(p)
		p.reg.MustRegister(p.llmd)
		p.gather = withoutFamilies(p.reg, llmdReplaces)
	}
	p.handler = p.gw.Handler(http.HandlerFunc(p.route))
	return p, nil
}

// GatewayConfig translates the proxy's configuration (llm-d's vocabulary)
// into the public flowhttp.GatewayConfig, without endpoints: what an
// embedder writes by hand.
func GatewayConfig(cfg Config, policy flowcontrol.CeilingPolicy) flowhttp.GatewayConfig {
	bands := make([]flowcontrol.BandConfig, len(cfg.Bands))
	for i, b := range cfg.Bands {
		// Fairness inside every band unless the file says otherwise
		// (flowhttp.DefaultBands'): round-robin between the callers'
		// identities.
		bands[i] = flowcontrol.BandConfig{Name: b.Name, Capacity: b.Capacity, MaxWait: b.MaxWait, MaxBytes: b.MaxBytes,
			Fairness: cmp.Or(b.Fairness, flowcontrol.FairnessRoundRobin), Ordering: b.Ordering, FlowCapacity: b.FlowCapacity}
	}
	sc := cfg.Saturation
	gc := flowhttp.GatewayConfig{
		Flow: flowcontrol.Config{Bands: bands, Policy: policy, Burst: cfg.Burst, Tick: cfg.Tick},
		Poller: saturation.PollerConfig{
			Interval: sc.ScrapeInterval,
			Metrics:  metricNames(sc.Engine),
			Scorer: saturation.Scorer{
				QueueDepthThreshold: sc.QueueDepthThreshold,
				KVUtilThreshold:     sc.KVCacheUtilThreshold,
				Staleness:           sc.MetricsStalenessThreshold,
			},
		},
		NoCredit: !sc.InFlightCredit,
		HTTP: flowhttp.Options{
			Objectives:       cfg.Objectives,
			DefaultObjective: cfg.Bands[cfg.DefaultBand].Name,
		},
	}
	if sc.Engine == EngineSGLang {
		gc.HTTP.Priority = flowhttp.ConventionSGLang
	}
	switch cfg.BodyPriority {
	case BodyPriorityIgnore:
		gc.HTTP.IgnoreBodyPriority = true
	case BodyPriorityStrip:
		gc.HTTP.ForwardPriority = flowhttp.PriorityStrip
	case BodyPrioritySet:
		gc.HTTP.ForwardPriority = flowhttp.PrioritySet
	}
	if h := cfg.CriticalKVHeadroom; h != nil {
		gc.CriticalKVHeadroom = *h
		gc.NoCriticalKVRouting = *h == 0
	}
	// Eviction's Grace is left to the gateway: the scrape interval (at
	// least flowcontrol.DefaultEvictionGrace), the sensor's lag.
	gc.Eviction.Enabled = cfg.Eviction
	return gc
}

// metricNames is the poller's metric names for a backend kind.
func metricNames(engine string) saturation.MetricNames {
	if engine == EngineSGLang {
		return saturation.SGLang()
	}
	return saturation.VLLM()
}

// newPolicy builds the configured policy: priority-holdback-policy from the
// ceilings the file's bands got, the others by name.
func newPolicy(r PolicyRef) (flowcontrol.CeilingPolicy, error) {
	if r.Type == flowcontrol.PriorityHoldbackPolicyName {
		return flowcontrol.NewPriorityHoldbackCeilings(r.Ceilings)
	}
	return flowcontrol.PolicyByName(r.Type, policyParams(r))
}

func policyParams(r PolicyRef) map[string]float64 {
	if r.Type == flowcontrol.StaticPolicyName {
		return map[string]float64{"threshold": r.Threshold}
	}
	return nil
}

// Start runs the gateway (dispatcher and metrics poller), the pod watch and
// the shared view's sync until Close.
func (p *Proxy) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return
	}
	p.started = true
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	// Running before Start returns: no request sees ErrNotRunning.
	_ = p.gw.Start(ctx) // a new gateway: it cannot be running or closed
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.watchPods(ctx) }()
	if p.shared != nil {
		// All its Redis I/O is here; the request path reads memory only.
		p.wg.Add(1)
		go func() { defer p.wg.Done(); _ = p.shared.Run(ctx) }()
	}
}

// Serve runs the proxy behind flowhttp's hardened server on ln until ctx is
// done, then shuts down gracefully within cfg.DrainTimeout (see
// flowhttp.Gateway.Serve) and closes the proxy.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener, cfg flowhttp.ServerConfig) error {
	p.Start()
	err := p.gw.Serve(ctx, ln, http.HandlerFunc(p.route), cfg)
	p.Close()
	return err
}

// watchPods copies the poller's per-pod verdict (usable or not) to the
// backends once per scrape interval, so that pick can pass over a backend
// whose metrics hang, fail or went stale (it is likely down or stuck)
// without reading the poller on the request path.
func (p *Proxy) watchPods(ctx context.Context) {
	t := time.NewTicker(p.cfg.Saturation.ScrapeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, r := range p.gw.Poller().Readings() {
				if b := p.byMetric[r.Endpoint]; b != nil {
					was := b.unusable.Swap(!r.Usable)
					// Say why a backend reads saturated, once per
					// change: a wrong engine's metric names, a
					// dead /metrics, a stale pod.
					switch {
					case !r.Usable && (!was || b.reason != r.Reason) && r.Reason != saturation.ReasonNotScraped:
						p.logf("proxy: backend %s reads saturated (%s): %v", b.label, r.Reason, r.Err)
					case r.Usable && was && b.reason != "":
						p.logf("proxy: backend %s usable again", b.label)
					}
					b.reason = r.Reason
				}
			}
		}
	}
}

// Drain is the first step of a graceful shutdown: every queued request is
// answered 503 shutting-down, and so is every request that arrives later.
// Requests already forwarded go on; call Close once they have finished (for
// example after http.Server.Shutdown returns).
func (p *Proxy) Drain() { p.gw.Drain() }

// Close drains and stops the gateway, the pod watch and the shared view's
// sync loop (which removes this replica's counts from Redis on its way out),
// then closes the view's Redis client. Idempotent.
func (p *Proxy) Close() {
	p.gw.Close()
	p.mu.Lock()
	if p.cancel != nil {
		p.cancel()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if p.shared != nil {
		p.closeShared.Do(func() { _ = p.shared.Close() })
	}
}

// Shared returns the in-flight view shared with the other replicas, or nil
// when sharing is off.
func (p *Proxy) Shared() *redisshare.InFlight { return p.shared }

// logfWriter turns a Logf into the io.Writer behind the shared view's
// slog logger: one call per line.
type logfWriter func(format string, args ...any)

func (w logfWriter) Write(b []byte) (int, error) {
	w("proxy: sharedInFlight: %s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Controller returns the flow controller (for Stats).
func (p *Proxy) Controller() *flowcontrol.Controller { return p.gw.Controller() }

// Gateway returns the public gateway the proxy is built on.
func (p *Proxy) Gateway() *flowhttp.Gateway { return p.gw }

// Poller returns the saturation poller (for its readings).
func (p *Proxy) Poller() *saturation.Poller { return p.gw.Poller() }

// Config returns the proxy's configuration.
func (p *Proxy) Config() Config { return p.cfg }

// Registry returns the Prometheus registry behind /metrics (with
// Options.LLMDMetrics, /metrics leaves out the families llm-d's names
// replace).
func (p *Proxy) Registry() *prometheus.Registry { return p.reg }

// Answers returns the proxy's count of finished gated requests, keyed
// "band code reason" (code 0: the client left before an answer).
func (p *Proxy) Answers() map[string]int {
	out := map[string]int{}
	fams, err := p.reg.Gather()
	if err != nil {
		return out
	}
	for _, f := range fams {
		if f.GetName() != "flowgate_proxy_responses_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out[l["band"]+" "+l["code"]+" "+l["reason"]] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

// Backends returns each backend (in Options.Backends order) as a choice
// made now would see it.
func (p *Proxy) Backends() []BackendState {
	out := make([]BackendState, len(p.backends))
	for i, b := range p.backends {
		out[i] = newBackendState(b.label, b.failedAt.Load(), b.unusable.Load())
	}
	return out
}

// InFlight returns the requests this replica forwarded to each backend and
// that have not finished (its own, without the other replicas').
func (p *Proxy) InFlight() []int64 {
	out := make([]int64, len(p.backends))
	for i, b := range p.backends {
		out[i] = b.own()
	}
	return out
}

// ServeHTTP is the gate in front of route: flowhttp gates every method but
// GET, HEAD and OPTIONS (any path); route serves GET /metrics and forwards
// everything else.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.handler.ServeHTTP(w, r) }

// route is the handler behind the gate.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" && r.Method == http.MethodGet {
		promhttp.HandlerFor(p.gather, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		return
	}
	p.forward(w, r)
}

// finished is flowhttp's OnFinish: one count per gated request.
func (p *Proxy) finished(r *http.Request, res flowhttp.Result) {
	code, reason := res.Status, res.Reason
	if reason == ReasonAborted {
		reason = ReasonBackendError // the stream was cut by the backend
	}
	if code == flowhttp.StatusClientClosed {
		code = 0
	}
	p.answer(res.Band, code, reason).Inc()
	if p.llmd != nil {
		p.llmd.observe(res)
	}
	if p.onFinish != nil {
		p.onFinish(res.Band, code, reason)
	}
}

// answer returns the answers counter of a band, status and reason. The
// common one, a forwarded 200, is looked up once per band and kept:
// WithLabelValues hashes the three labels and takes the vector's lock on
// every call. It is kept only once used, so that a band that never answered
// has no series (as with WithLabelValues).
func (p *Proxy) answer(band, code int, reason string) prometheus.Counter {
	if code != http.StatusOK || reason != ReasonForwarded {
		return p.answers.WithLabelValues(p.cfg.Bands[band].Name, strconv.Itoa(code), reason)
	}
	if c := p.okAnswers[band].Load(); c != nil {
		return *c
	}
	c := p.answers.WithLabelValues(p.cfg.Bands[band].Name, "200", ReasonForwarded)
	p.okAnswers[band].Store(&c) // a race stores the same child twice
	return c
}

// ReasonAborted is flowhttp's reason for a handler that panicked.
const ReasonAborted = flowhttp.ReasonAborted

// forward sends a request (gated and released, or ungated) to the
// least-loaded backend.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	band, gated := flowhttp.BandOf(w)
	if !gated {
		band = -1 // routed as every band but 0
	}
	b := p.pick(band)
	if b == nil {
		flowhttp.SetReason(w, ReasonNoBackend)
		flowhttp.WriteError(w, http.StatusServiceUnavailable, ReasonNoBackend, "no backend is configured", true)
		return
	}
	b.inc()
	// The gateway counts the request on its backend at once (the in-flight
	// credit, when on, moves the saturation now, not at the next scrape).
	// A request it retired (the backend reported it finished) has left b's
	// count already (retired).
	done := p.gw.Forward(w, b.label)
	defer func() {
		if !done() {
			b.dec()
		}
	}()
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		// A stream the backend cut (not the client) aborts the handler
		// from inside ServeHTTP: a failure of the backend too.
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler && r.Context().Err() == nil {
				b.failedAt.Store(time.Now().UnixNano())
				flowhttp.SetReason(w, ReasonBackendError)
			}
			panic(v)
		}
	}()
	b.rp.ServeHTTP(rec, r)
	if rec.code >= 500 || (rec.proxyErr && rec.code != 0) {
		b.failedAt.Store(time.Now().UnixNano())
	} else if rec.code != 0 {
		b.failedAt.Store(0)
	}
	// A client that leaves mid-response makes the copy fail, and the
	// reverse proxy panics with http.ErrAbortHandler (recovered above). A
	// context cancelled after a complete copy (the client closed as soon
	// as it had the last byte) is a forwarded answer.
	switch {
	case rec.proxyErr && rec.code == 0:
		flowhttp.SetReason(w, ReasonCancelled) // the client left before the backend answered
	case rec.proxyErr:
		flowhttp.SetReason(w, ReasonBackendError)
	}
}

// forwardBuffered gives the outbound request a fresh reader of the body
// flowhttp buffered (its priority rewritten or not), in place of httputil's wrapper of the
// inbound body. net/http sends an in-memory body in the same write as the
// headers, but it flushes the headers first for any other reader, and
// httputil's wrapper is one: a write syscall more per request, several per
// cent of a small request's CPU. The wrapper guards against the transport
// closing an inbound body still being received (100-continue), which a
// buffered body no longer is. A request without GetBody (ungated, or
// bodiless) keeps the wrapper.
func forwardBuffered(pr *httputil.ProxyRequest) {
	if pr.Out.Body == nil || pr.In.GetBody == nil {
		return
	}
	if body, err := pr.In.GetBody(); err == nil {
		pr.Out.Body = body
	}
}

// The canonical forms of the headers stripOwnHeaders removes: Header.Del
// canonicalises its argument on every call, an allocation per response for
// these lower-case names.
var (
	bandKey   = http.CanonicalHeaderKey(BandHeader)
	reasonKey = http.CanonicalHeaderKey(ReasonHeader)
)

// stripOwnHeaders removes a backend's copies of the headers the proxy sets,
// so that a backend's own 429 (another flowgate behind this one, say) is not
// mistaken for the proxy's.
func stripOwnHeaders(resp *http.Response) error {
	delete(resp.Header, bandKey)
	delete(resp.Header, reasonKey)
	return nil
}

// copyBufferSize is httputil.ReverseProxy's own copy buffer size.
const copyBufferSize = 32 << 10

// bufferPool is an httputil.BufferPool over a sync.Pool of arrays (a pool of
// slices would allocate a slice header on every Put).
type bufferPool struct{ pool sync.Pool }

// copyBuffers is the copy buffers every backend's reverse proxy shares.
var copyBuffers = &bufferPool{pool: sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}

// Get returns a copyBufferSize buffer.
func (b *bufferPool) Get() []byte { return b.pool.Get().(*[copyBufferSize]byte)[:] }

// Put takes back a buffer Get returned; anything else is dropped.
func (b *bufferPool) Put(buf []byte) {
	if len(buf) == copyBufferSize && cap(buf) == copyBufferSize {
		b.pool.Put((*[copyBufferSize]byte)(buf))
	}
}

// pick returns the backend with the fewest requests in flight (every
// replica's when the view is shared; ties broken round-robin), passing over backends that failed within EjectFor or whose
// metrics the poller cannot use — unless every backend is in that state —
// or nil if there is none. Among the backends not passed over, a request in
// band 0 is first kept to those the gateway's critical routing keeps
// (flowhttp.Router.Eligibility, one reading for the whole pick: those with
// the configured KV-cache headroom at their last reading, when some have it
// and others not, those with the lowest usage when none has it; on by
// default with bodyPriority set), as flowhttp.Router.LeastLoadedFor(0) does; a
// failed or unusable backend is never chosen for its headroom over one that
// is not. It tells Options.OnPick what it saw.
func (p *Proxy) pick(band int) *backend {
	n := len(p.backends)
	if n == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	var seen []BackendState // for onPick only
	if p.onPick != nil {
		seen = make([]BackendState, n)
	}
	el := p.gw.Router().Eligibility(band)
	start := int(p.rr.Add(1) % uint64(n))
	var best *backend
	bestAvoid, bestOut, bestAt := true, true, -1
	for i := 0; i < n; i++ {
		at := (start + i) % n
		b := p.backends[at]
		f, unusable := b.failedAt.Load(), b.unusable.Load()
		avoid := (f != 0 && now-f < int64(EjectFor)) || unusable
		out := !el.Keeps(b.label)
		if seen != nil {
			seen[at] = newBackendState(b.label, f, unusable)
		}
		switch {
		case best == nil,
			bestAvoid && !avoid,
			avoid == bestAvoid && bestOut && !out,
			avoid == bestAvoid && out == bestOut && b.load() < best.load():
			best, bestAvoid, bestOut, bestAt = b, avoid, out, at
		}
	}
	if p.onPick != nil {
		p.onPick(time.Unix(0, now), seen, bestAt)
	}
	return best
}

// retired takes out of its backend's count (the replicas' shared view
// included) a request the gateway retired: the backend reported it
// finished while its client still holds the answer (see
// flowhttp.Gateway.Forward). The request's done then skips it.
func (p *Proxy) retired(endpoint string) {
	for _, b := range p.backends {
		if b.label == endpoint {
			b.dec()
			return
		}
	}
}

// BackendErrorLog is the format of the line the proxy logs (Options.Logf)
// for each transport error it answers with 502 backend-error: the
// backend's host and the error.
const BackendErrorLog = "proxy: backend %s: %v"

// backendError is the reverse proxy's error handler: 502 backend-error,
// unless the client is gone (then nobody is listening).
func (p *Proxy) backendError(w http.ResponseWriter, r *http.Request, err error) {
	rec, _ := w.(*statusRecorder)
	if rec != nil {
		rec.proxyErr = true
	}
	if r.Context().Err() != nil {
		return // the client left; nobody to answer
	}
	p.logf(BackendErrorLog, r.URL.Host, err)
	flowhttp.WriteError(w, http.StatusBadGateway, ReasonBackendError, "the backend could not be reached or failed", true)
}

// statusRecorder remembers the status code written. Unwrap lets
// http.ResponseController (which the reverse proxy flushes through) reach
// the real writer's Flush.
type statusRecorder struct {
	http.ResponseWriter
	code     int
	proxyErr bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 && (code < 100 || code >= 200 || code == http.StatusSwitchingProtocols) {
		s.code = code // a 1xx (100 Continue, 103 Early Hints) is not the status
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// othersCollector exports, per endpoint, the other replicas' requests in
// flight as of the shared view's last sync: the one per-endpoint fact the
// proxy has beyond the Gateway's collector (flowgate_endpoint_*, which has
// this replica's own count, the scraped readings and the score).
type othersCollector struct {
	p      *Proxy
	others *prometheus.Desc
}

func newOthersCollector(p *Proxy) *othersCollector {
	return &othersCollector{p: p, others: prometheus.NewDesc("flowgate_endpoint_inflight_others",
		"The other gateway replicas' requests in flight to the endpoint, as of the shared view's last sync.", []string{"endpoint"}, nil)}
}

func (c *othersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.others }

func (c *othersCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.p.backends {
		if b.shared != nil {
			ch <- prometheus.MustNewConstMetric(c.others, prometheus.GaugeValue, float64(b.shared.Others()), b.label)
		}
	}
}
