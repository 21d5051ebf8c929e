package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/llmd"
	"github.com/flowgate/flowgate/saturation"
)

// Bands of the simulated gateway.
const (
	BandCritical  = 0
	BandSheddable = 1
	bands         = 2
)

type evKind uint8

// Event kinds, in the order events at the same instant are handled (see compareEvents).
const (
	evStepEnd evKind = iota // idx = replica: a step's effects land first
	evTimeout               // idx = gateway: the client of its oldest pending request gives up
	evScrape                // idx = gateway
	evSweep                 // idx = gateway: llm-d's 1 s expiry sweep
	evArrival               // idx = gateway
	evTick                  // idx = gateway
	evEvict                 // idx = gateway: its Evictor checks, after the instant's releases and before the replicas start their steps
	evKick                  // idx = replica: start a step if idle, after the instant's releases
	evSync                  // idx = gateway: the shared in-flight view is refreshed (SharedInFlight)
)

// event is one scheduled happening of the run.
type event struct {
	at   int64
	seq  uint64
	kind evKind
	idx  int32
}

// compareEvents is the simulator's total order of events: by time, then kind (the
// order of the evKind constants), then index (gateway, replica or request), then
// insertion sequence. Ties between gateways therefore never depend on the order in
// which their events happened to be pushed, and the run is deterministic. An evEvict
// comes after the instant's ticks (it sees their dispatches) and before its kicks (a
// victim's KV is free before its replica schedules the next step).
func compareEvents(a, b event) int {
	switch {
	case a.at != b.at:
		return cmpInt(a.at, b.at)
	case a.kind != b.kind:
		return cmpInt(int64(a.kind), int64(b.kind))
	case a.idx != b.idx:
		return cmpInt(int64(a.idx), int64(b.idx))
	}
	return cmpInt(int64(a.seq), int64(b.seq))
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

type request struct {
	critical bool
	gw       int32
	replica  int32
	arrive   int64
	dispatch int64
	first    int64         // -1 until the first token
	done     int64         // -1 until finished
	rejected bool          // the gateway refused it (queue full)
	shed     bool          // the admission stage shed it (Config.Admission)
	tenantB  bool          // tenant B's (Config.Tenants)
	timedOut bool          // its client gave up before it completed
	cut      bool          // evicted after its response started (Config.Eviction.Started): it ended as failed
	vr       *vllm.Request // its own allocation: the replica keeps the pointer while reqs grows
	// tr is the request as its gateway's Evictor tracks it (Config.Evict), from
	// its first dispatch; act is its eviction (s.evict), made once.
	tr  *flowcontrol.Tracked
	act func()
}

type gateway struct {
	d        *flowcontrol.Dispatcher[int32] // Static, SoftReflective
	l        *llmd.Dispatcher[int32]        // LLMDStatic, LLMDSoftReflective
	llmdSoft *llmd.SoftReflective
	admit    *flowcontrol.Probabilistic // Config.Admission
	ev       *flowcontrol.Evictor       // Config.Evict
	// evictAt is the instant of the evEvict armed (evictArmed); an evEvict at
	// another instant was superseded by an earlier one, which re-armed from
	// Evictor.Next, and does nothing.
	evictAt    int64
	evictArmed bool
	gen        *workload.Generator
	next       workload.Arrival
	hasNext    bool
	queued     [bands]int
	inflight   []int64 // this gateway's own requests in flight, per replica
	others     []int64 // the other gateways' in flight per replica, as last synced (SharedInFlight)
	// syncPending: an evSync is pushed for this instant (SharedInFlightExact)
	syncPending bool
	readings    []saturation.Reading
	// rr is RoutingInFlight's tie-breaker: the proxy's and LeastLoaded's
	// round-robin counter, advanced once per routing decision.
	rr uint64

	lastTick    int64 // index of the last tick Step ran (tick k is at k·Tick); -1 none
	tickPending bool

	direct int // requests dispatched on arrival (None, Floor)
	// readVer counts changes of readings; satCache holds the saturation computed at
	// satVer, valid until the virtual time satUntil (see source.Saturation).
	readVer, satVer uint64
	scrapes         uint64 // scrape rounds, the reading sequence
	satCache        float64
	satUntil        int64
	satOK           bool
	// clients[clientHead:] are this gateway's requests whose client timeout has not
	// fired yet, in arrival (= deadline) order; one evTimeout is armed for the head.
	clients    []int32
	clientHead int
	accounted  int64 // ticks < accounted are in regime/satSum
	regime     [3]uint64
	satSum     float64
	maxQueued  int
}

type sim struct {
	cfg      Config
	now      int64
	base     time.Time
	seq      uint64
	events   eventHeap
	replicas []*vllm.Replica
	busy     []bool // a step is in flight
	among    []bool // routeKV's filter: the replicas with the KV headroom free
	critKV   bool   // critical requests are routed by routeKV (Config.CriticalRouting)
	kicked   []bool // an evKick is pending
	gws      []*gateway
	reqs     []request
	scorer   saturation.Scorer
	policy   flowcontrol.CeilingPolicy
	tick     int64
	window   int64
	winTicks int64
	evbuf    []vllm.Event
	pending  int // requests not yet finished (arrived or to arrive)
	arrivals int // arrival streams still open
	steps    uint64
	preempts uint64
	total    []int64    // in flight per replica over every gateway
	tenants  *rand.Rand // draws each arrival's tenant (Config.Tenants)
	// medianCost is the workload's median cost (input + output tokens), the
	// boundary between Config.LongShort's tenants.
	medianCost int
	// tokens[t] sums the cost of tenant t's (0 A, 1 B) sheddable requests
	// dispatched in the middle half of the arrival window (Config.LongShort).
	tokens [2]float64
	err    error
	// signal holds what the anticipating saturation signal and the step-time
	// bound read (signal.go).
	signal signalState
	// llmdCeilings are LLMDPriorityHoldback's fixed ceilings, for regime.
	llmdCeilings []float64
	// eps are the replicas' endpoint names for the Evictor: their indices.
	eps []string
	// evc holds the eviction counts (Config.Evict).
	evc evictCounts
}

// evictCounts are the eviction's counts over the run.
type evictCounts struct {
	evictions, requeued, cut, idle int
	wastedPrefill, wastedDecode    int64
}

func (s *sim) push(at int64, k evKind, idx int32) {
	s.seq++
	s.events.push(event{at: at, seq: s.seq, kind: k, idx: idx})
}

func (s *sim) nowTime() time.Time { return s.base.Add(time.Duration(s.now)) }

// source is gateway g's saturation as the dispatcher reads it: the saturation package's
// pure Scorer over the last scraped metrics (plus, with Credit, the gateway's in-flight
// requests), evaluated at the virtual now.
type source struct {
	s *sim
	g *gateway
}

// admitSource is the admission stage's saturation: the pool score of the gateway's
// readings by the reference formula, without in-flight credit.
type admitSource struct {
	s *sim
	g *gateway
}

func (a admitSource) Saturation() float64 {
	return saturation.Scorer{}.Pool(a.g.readings, a.s.nowTime())
}

// The value is cached: it is a pure function of the readings and of which of them are
// stale (now − At > Staleness), so it is recomputed only after the readings change
// (readVer) or once the virtual clock passes the first reading's staleness deadline.
func (src source) Saturation() float64 {
	g, s := src.g, src.s
	if g.satOK && g.satVer == g.readVer && s.now <= g.satUntil {
		return g.satCache
	}
	var v float64
	switch {
	case s.cfg.MaxOverReplicas && s.cfg.flowgate():
		v = s.scorer.PoolMax(g.readings, s.nowTime()) // a host's own scoring
	case s.cfg.PlainController && s.cfg.flowgate():
		var released int64
		for _, n := range g.inflight {
			released += n
		}
		v = s.scorer.PoolReleased(g.readings, s.nowTime(), released)
	default:
		// With the credit this is what the Gateway's poller reads too: its live
		// credit is Scorer.Pool's exact one (saturation/credit.go).
		v = s.scorer.Pool(g.readings, s.nowTime())
	}
	g.satCache, g.satVer, g.satOK = v, g.readVer, true
	stale := s.scorer.Staleness
	if stale < saturation.MinStaleness || stale > saturation.MaxStaleness {
		stale = saturation.DefaultStaleness
	}
	g.satUntil = math.MaxInt64
	for i := range g.readings {
		if rd := &g.readings[i]; rd.OK && !rd.At.IsZero() {
			g.satUntil = min(g.satUntil, int64(rd.At.Sub(s.base))+int64(stale))
		}
	}
	return v
}

// Run runs one experiment and returns its result.
func Run(cfg Config) (Result, error) {
	s, err := run(cfg)
	if err != nil {
		return Result{}, err
	}
	return s.result(), nil
}

func run(cfg Config) (*sim, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &sim{
		cfg:    cfg,
		base:   time.Unix(0, 0).UTC(),
		scorer: saturation.Scorer{InFlightCredit: cfg.Credit && cfg.flowgate() && !cfg.PlainController}, // llm-d parity has no credit
		tick:   int64(cfg.Tick),
		window: int64(cfg.Duration),
	}
	s.winTicks = (s.window + s.tick - 1) / s.tick
	if cfg.flowgate() {
		// The saturation options are flowgate's; the llm-d baselines keep the
		// reference score (their detector's formula).
		s.scorer.QueueDepthThreshold, s.scorer.KVUtilThreshold = cfg.QueueThreshold, cfg.KVThreshold
		s.scorer.Projection, s.scorer.PromptTokenThreshold = cfg.Projection, cfg.PromptTokens
	}
	if cfg.Policy == Static || cfg.Policy == StaticBlockCritical {
		s.policy = flowcontrol.NewStatic(flowcontrol.DefaultStaticThreshold)
	} else if cfg.Policy == SoftReflective {
		s.policy = flowcontrol.NewSoftReflective()
	} else if cfg.Policy == PriorityHoldback {
		c, err := cfg.Holdback.BandCeilings(bandPriorities)
		if err == nil {
			s.policy, err = flowcontrol.NewPriorityHoldbackCeilings(c)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: Holdback: %v", ErrInvalidConfig, err)
		}
	} else if cfg.Policy == LLMDPriorityHoldback {
		c, err := cfg.Holdback.BandCeilings(bandPriorities)
		if err != nil {
			return nil, fmt.Errorf("%w: Holdback: %v", ErrInvalidConfig, err)
		}
		s.llmdCeilings = c
	}
	if cfg.policy != nil && cfg.flowgate() {
		s.policy = cfg.policy
	}
	cfg.Replica.PriorityScheduling = cfg.BackendPriority
	for range cfg.Replicas {
		r, err := vllm.New(cfg.Replica)
		if err != nil {
			return nil, fmt.Errorf("cluster: Replica: %w", err)
		}
		s.replicas = append(s.replicas, r)
	}
	s.cfg.Replica = cfg.Replica
	s.busy = make([]bool, cfg.Replicas)
	s.among = make([]bool, cfg.Replicas)
	s.critKV = cfg.flowgate() && (cfg.CriticalRouting == CriticalRoutingKV || cfg.CriticalRouting == CriticalRoutingKVWithPriority && cfg.BackendPriority)
	if cfg.Tenants > 0 {
		s.tenants = rand.New(rand.NewPCG(cfg.Seed, 0x7e4a47))
	}
	if cfg.LongShort {
		m, err := medianCost(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		s.medianCost = m
	}
	s.total = make([]int64, cfg.Replicas)
	s.signal.init(cfg.Replicas)
	s.kicked = make([]bool, cfg.Replicas)
	for r := range cfg.Replicas {
		s.eps = append(s.eps, strconv.Itoa(r))
	}
	for g := range cfg.Gateways {
		gen, err := workload.NewGenerator(cfg.Workload, cfg.QPS/float64(cfg.Gateways), cfg.CV, cfg.Seed, uint64(g))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		gw := &gateway{gen: gen, inflight: make([]int64, cfg.Replicas), others: make([]int64, cfg.Replicas),
			readings: make([]saturation.Reading, cfg.Replicas), lastTick: -1}
		gi := int32(g)
		if cfg.Admission {
			// llm-d's probabilistic admitter, scoring the gateway's scraped
			// readings with the reference formula (no in-flight credit, as
			// llm-d's admitter does), with its own seeded stream.
			a, err := flowcontrol.NewProbabilistic(flowcontrol.ProbabilisticConfig{
				Source: admitSource{s, gw}, Rand: rand.NewPCG(cfg.Seed, 0xad00+uint64(g))})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
			}
			gw.admit = a
		}
		if err := s.newGatewayQueue(gw, gi); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if cfg.Evict {
			held := func() int { return -1 } // None, the Floor: nothing queued at the gateway
			if gw.d != nil {
				held = gw.d.Held
			}
			ecfg := cfg.Eviction
			// A replica's KV-cache usage as the gateway last scraped it
			// (the endpoints are replica indices).
			ecfg.KVUsage = func(ep string) float64 {
				r, err := strconv.Atoi(ep)
				if err != nil || r < 0 || r >= len(gw.readings) {
					return math.NaN()
				}
				return gw.readings[r].KVUsage
			}
			ev, err := flowcontrol.NewEvictor(ecfg, bands, source{s, gw}, held, s.nowTime)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
			}
			gw.ev = ev
		}
		s.gws = append(s.gws, gw)
		gw.next = gen.Next()
		if int64(gw.next.At) < s.window {
			gw.hasNext = true
			s.arrivals++
			s.push(int64(gw.next.At), evArrival, gi)
		}
		// Gateways scrape out of phase, as independent proxies would.
		s.push(int64(cfg.Scrape)*int64(g)/int64(cfg.Gateways), evScrape, gi)
		if cfg.SharedInFlight > 0 && !cfg.SharedInFlightExact {
			// Replicas sync out of phase too.
			s.push(int64(cfg.SharedInFlight)*int64(g)/int64(cfg.Gateways), evSync, gi)
		}
		if gw.l != nil {
			s.push(int64(llmd.CleanupInterval), evSweep, gi)
		}
		if cfg.noSkip {
			s.schedule(gw, gi)
		}
	}
	s.loop()
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

func (s *sim) loop() {
	limit := s.window + int64(s.cfg.DrainLimit)
	for !s.events.empty() {
		if s.arrivals == 0 && s.pending == 0 && !s.anyBusy() {
			return // (a busy replica may still hold requests aborted in its step)
		}
		e := s.events.pop()
		if e.at > limit {
			return
		}
		s.now = e.at
		switch e.kind {
		case evArrival:
			s.arrive(s.gws[e.idx], e.idx)
		case evTick:
			s.onTick(s.gws[e.idx], e.idx)
		case evScrape:
			s.scrape(s.gws[e.idx], e.idx)
		case evKick:
			s.kicked[e.idx] = false
			s.begin(int(e.idx))
		case evStepEnd:
			s.stepEnd(int(e.idx))
		case evTimeout:
			s.timeouts(s.gws[e.idx], e.idx)
		case evSweep:
			s.sweep(s.gws[e.idx], e.idx)
		case evSync:
			s.sync(s.gws[e.idx], e.idx)
		case evEvict:
			s.onEvict(s.gws[e.idx], e.idx, e.at)
		}
		if s.err != nil {
			return
		}
		if s.cfg.onEventHook != nil {
			s.cfg.onEventHook(s)
		}
	}
}

// newGatewayQueue builds gateway gi's flow control for the configured policy: the
// library's Dispatcher (flowgate's policies) or llmd.Dispatcher (llm-d parity); None and
// Floor have none. The only place the simulator constructs a dispatcher.
func (s *sim) newGatewayQueue(gw *gateway, gi int32) error {
	cfg := s.cfg
	abandoned := func(id int32) bool { return s.reqs[id].timedOut }
	onDrop := func(band int, _ int32, _ error) { gw.queued[band]-- } // only abandoned items are dropped
	switch {
	case cfg.flowgate():
		bandCfg := make([]flowcontrol.BandConfig, bands)
		for i := range bandCfg {
			bandCfg[i].Capacity = cfg.Capacity
			bandCfg[i].Fairness = cfg.Fairness
		}
		d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int32]{
			Config: flowcontrol.Config{
				Bands:  bandCfg,
				Policy: s.policy,
				Source: source{s, gw},
				Burst:  cfg.Burst,
				Tick:   cfg.Tick,
				Now:    s.nowTime,
				// llm-d's meaning of a ceiling: band 0 gated too.
				BlockCritical: cfg.Policy == StaticBlockCritical,
			},
			Dispatch:  func(band int, id int32) { s.dispatch(gi, band, id) },
			OnDrop:    onDrop,
			Abandoned: abandoned,
		})
		gw.d = d
		return err
	case cfg.llmd():
		var p llmd.UsageLimitPolicy = llmd.NewStatic(llmd.DefaultThreshold)
		switch cfg.Policy {
		case LLMDSoftReflective:
			gw.llmdSoft = llmd.NewSoftReflective()
			p = gw.llmdSoft
		case LLMDPriorityHoldback:
			h, err := llmd.NewPriorityHoldback(cfg.Holdback, bandPriorities)
			if err != nil {
				return err
			}
			p = h
		}
		band := flowcontrol.BandConfig{Capacity: cfg.Capacity, MaxWait: cfg.LLMDTTL}
		l, err := llmd.NewDispatcher(llmd.DispatcherConfig[int32]{
			Bands:     []flowcontrol.BandConfig{band, band},
			Policy:    p,
			Source:    source{s, gw},
			Dispatch:  func(band int, id int32) { s.dispatch(gi, band, id) },
			OnDrop:    onDrop,
			Abandoned: abandoned,
			Now:       s.nowTime,
		})
		gw.l = l
		return err
	}
	return nil
}

func (s *sim) anyBusy() bool {
	for _, b := range s.busy {
		if b {
			return true
		}
	}
	return false
}

// regimeOf classifies the sheddable band's gate: 0 dead zone (every tick), 1
// proportional (one tick in Every > 1), 2 hard block (Every 0).
func regimeOf(g flowcontrol.Gate) int {
	switch {
	case g.Every == 1:
		return 0
	case g.Every > 1:
		return 1
	}
	return 2
}

// regime classifies the sheddable band at saturation sat under the run's policy: for
// flowgate's policies from the policy's Gate; for llm-d parity 0 below its reflective
// ceiling (or the static threshold), 1 in the duty cycle, 2 halted; for None and
// Floor always 0.
func (s *sim) regime(sat float64) int {
	switch s.cfg.Policy {
	case Static, SoftReflective, PriorityHoldback, StaticBlockCritical:
		return regimeOf(s.policy.Gate(BandSheddable, bands, sat))
	case LLMDPriorityHoldback:
		if sat >= s.llmdCeilings[BandSheddable] {
			return 2
		}
	case LLMDStatic:
		if sat >= llmd.DefaultThreshold {
			return 2
		}
	case LLMDSoftReflective:
		switch {
		case sat >= 1:
			return 2
		case sat >= 1-sat: // band 1's reflective ceiling with two bands
			return 1
		}
	}
	return 0
}

// account counts the ticks with index < upTo (and inside the arrival window) in the
// regime the sheddable band is in at the gateway's current saturation. The
// saturation is piecewise constant between events, so this is exact whether or not the
// dispatcher actually ran those ticks.
func (s *sim) account(g *gateway, upTo int64) {
	upTo = min(upTo, s.winTicks)
	if upTo <= g.accounted {
		return
	}
	sat := flowcontrol.Sanitize(source{s, g}.Saturation())
	n := upTo - g.accounted
	g.regime[s.regime(sat)] += uint64(n)
	g.satSum += sat * float64(n)
	g.accounted = upTo
}

// ticksBefore is the number of tick indices k with k·Tick < now.
func (s *sim) ticksBefore() int64 { return (s.now + s.tick - 1) / s.tick }

// catchUp brings a dormant gateway's dispatcher up to date before one of its inputs
// changes: the ticks it skipped (all at a saturation equal to the current one, since
// nothing changed in between) are replayed. For flowgate's Dispatcher at most CatchUp
// of them are stepped: on those ticks it could not release anything (its bands were
// empty or blocked), so replaying only advances its per-band tick counts, which
// saturate in effect once they exceed any Every the policy returns below the cap. For
// llm-d parity llmd.Dispatcher.Skip replays them exactly (the shared duty-cycle counter
// advances by their number).
func (s *sim) catchUp(g *gateway) { s.catchUpTo(g, s.ticksBefore()-1) } // the last tick strictly before now

// catchUpTo is catchUp through tick last.
func (s *sim) catchUpTo(g *gateway, last int64) {
	s.account(g, last+1)
	if g.tickPending || last <= g.lastTick {
		return
	}
	switch {
	case g.d != nil:
		n := min(last-g.lastTick, int64(s.cfg.CatchUp))
		for range n {
			g.d.Step()
		}
	case g.l != nil:
		g.l.Skip(last - g.lastTick)
	}
	g.lastTick = last
}

// canRelease reports whether a tick could change anything: for flowgate's Dispatcher,
// some non-empty band has a gate that is not a hard block at the current saturation
// (asking the policy, not re-deriving it); for llm-d parity, some band holds an item
// and band 0 is not halted (an idle or halted cycle only advances the duty-cycle
// counter, which Skip replays).
func (s *sim) canRelease(g *gateway) bool {
	switch {
	case g.d != nil:
		sat := flowcontrol.Sanitize(source{s, g}.Saturation())
		for b := range bands {
			// Band 0 is never gated unless BlockCritical (the
			// dispatcher's critical guarantee).
			critical := b == 0 && s.cfg.Policy != StaticBlockCritical
			if g.queued[b] > 0 && (critical || s.policy.Gate(b, bands, sat).Every > 0) {
				return true
			}
		}
	case g.l != nil:
		return !g.l.Empty() && !g.l.Halted()
	}
	return false
}

// schedule arms the gateway's next tick if it could release something; otherwise the
// gateway stays dormant until an input changes.
func (s *sim) schedule(g *gateway, gi int32) {
	if g.d == nil && g.l == nil {
		return // no flow control, no ticks
	}
	if g.tickPending || (!s.cfg.noSkip && !s.canRelease(g)) {
		return
	}
	k := max(s.ticksBefore(), g.lastTick+1)
	g.tickPending = true
	s.push(k*s.tick, evTick, gi)
}

func (s *sim) arrive(g *gateway, gi int32) {
	a := g.next
	s.nextArrival(g, gi)
	if s.cfg.Policy == Floor && !a.Critical {
		return // the floor: the same critical arrivals, no sheddable traffic
	}
	tenantB := false
	switch {
	case s.tenants != nil:
		// Drawn for every arrival, so that B's arrivals are the same with
		// and without A. Critical traffic is B's alone: A is the noisy
		// neighbour of the sheddable band.
		tenantB = s.tenants.Float64() < 1/(1+s.cfg.Tenants) || a.Critical
		if s.cfg.TenantBAlone && !tenantB {
			return
		}
	case s.cfg.LongShort:
		tenantB = a.Input+a.Output <= s.medianCost
	}
	s.catchUp(g)
	id := int32(len(s.reqs))
	prio := 1
	if a.Critical {
		prio = 0
	}
	s.reqs = append(s.reqs, request{critical: a.Critical, gw: gi, replica: -1, arrive: s.now, dispatch: -1, first: -1, done: -1,
		tenantB: tenantB, vr: &vllm.Request{ID: uint64(id), Input: a.Input, Output: a.Output, Priority: prio}})
	band := BandSheddable
	if a.Critical {
		band = BandCritical
	}
	if g.admit != nil && !g.admit.Admit(band, bands) {
		s.reqs[id].shed = true // refused before any queue: it ends here
		return
	}
	if s.cfg.ClientTimeout > 0 {
		// Deadlines are arrival + a constant, so each gateway's are in arrival order:
		// a FIFO per gateway with one event armed for its head keeps the heap small.
		g.clients = append(g.clients, id)
		if len(g.clients)-g.clientHead == 1 {
			s.push(s.now+int64(s.cfg.ClientTimeout), evTimeout, gi)
		}
	}
	switch {
	case g.d == nil && g.l == nil:
		g.queued[band]++
		s.pending++
		g.direct++
		s.dispatch(gi, band, id)
	case g.d != nil:
		if err := s.enqueue(g, band, id, a); err != nil {
			s.reqs[id].rejected = true
			break
		}
		s.enqueued(g, band)
		// Run wakes on Enqueue and polls: an open band with burst left this tick
		// releases the item at once.
		g.d.Flush()
	default:
		if err := g.l.Enqueue(band, id); err != nil {
			s.reqs[id].rejected = true
			break
		}
		s.enqueued(g, band)
		// llm-d runs a dispatch cycle after every enqueue.
		g.l.Cycle()
	}
	s.schedule(g, gi)
}

// medianCost returns the median cost (input + output tokens) of cfg's workload: the
// median of 10,001 draws from a generator with a stream of its own, so the boundary
// between Config.LongShort's tenants is the same for every seed.
func medianCost(cfg Config) (int, error) {
	gen, err := workload.NewGenerator(cfg.Workload, 1, cfg.CV, 0x10e6, 0x5407)
	if err != nil {
		return 0, err
	}
	costs := make([]int, 10001)
	for i := range costs {
		a := gen.Next()
		costs[i] = a.Input + a.Output
	}
	slices.Sort(costs)
	return costs[len(costs)/2], nil
}

// enqueue hands request id to flowgate's dispatcher: with tenants, as an item of its
// tenant's flow at its token cost.
func (s *sim) enqueue(g *gateway, band int, id int32, a workload.Arrival) error {
	if s.tenants == nil && !s.cfg.LongShort {
		return g.d.Enqueue(band, id)
	}
	flow := "A"
	if s.reqs[id].tenantB {
		flow = "B"
	}
	return g.d.EnqueueFlow(band, flow, float64(a.Input+a.Output), time.Time{}, id)
}

func (s *sim) enqueued(g *gateway, band int) {
	g.queued[band]++
	s.pending++
	g.maxQueued = max(g.maxQueued, g.queued[0]+g.queued[1])
}

// nextArrival draws the gateway's next arrival and schedules it, or closes its stream
// at the end of the window.
func (s *sim) nextArrival(g *gateway, gi int32) {
	g.next = g.gen.Next()
	if int64(g.next.At) < s.window {
		s.push(int64(g.next.At), evArrival, gi)
	} else {
		g.hasNext = false
		s.arrivals--
	}
}

// timeouts fires the client timeouts of gateway gi that are due now, in arrival order,
// and arms the next one (skipping requests that completed meanwhile).
func (s *sim) timeouts(g *gateway, gi int32) {
	to := int64(s.cfg.ClientTimeout)
	for g.clientHead < len(g.clients) {
		id := g.clients[g.clientHead]
		q := &s.reqs[id]
		if q.done >= 0 || q.rejected || q.cut {
			g.clientHead++
			continue
		}
		if q.arrive+to > s.now {
			s.push(q.arrive+to, evTimeout, gi)
			break
		}
		g.clientHead++
		s.timeout(id)
	}
	if g.clientHead > 4096 && 2*g.clientHead > len(g.clients) {
		g.clients = append(g.clients[:0], g.clients[g.clientHead:]...)
		g.clientHead = 0
	}
}

// timeout is request id's client giving up: unless it completed, it is aborted where it
// is — in its gateway's queue (the dispatcher drops it: flowgate's at once through
// Abandon, llm-d's when a cycle reaches it or at the next sweep) or at its replica
// (its KV blocks are freed).
func (s *sim) timeout(id int32) {
	q := &s.reqs[id]
	if q.done >= 0 || q.rejected || q.timedOut || q.cut {
		return
	}
	q.timedOut = true
	s.pending--
	g := s.gws[q.gw]
	s.catchUp(g)
	band := BandSheddable
	if q.critical {
		band = BandCritical
	}
	if q.dispatch < 0 {
		switch {
		case g.d != nil:
			g.d.Abandon(band)
			g.d.Flush() // Run polls at once after Abandon
		case g.l != nil:
			g.l.Abandon(band)
		}
	} else {
		r := q.replica
		s.replicas[r].Abort(q.vr)
		s.moveInflight(q.gw, int(r), -1)
		s.kick(int(r))
		if q.tr != nil {
			q.tr.Done()
		}
	}
	s.schedule(g, q.gw)
}

// sweep is llm-d's 1 s expiry sweep on gateway gi.
func (s *sim) sweep(g *gateway, gi int32) {
	s.catchUp(g)
	g.l.Sweep()
	if s.arrivals > 0 || s.pending > 0 {
		s.push(s.now+int64(llmd.CleanupInterval), evSweep, gi)
	}
	s.schedule(g, gi)
}

func (s *sim) onTick(g *gateway, gi int32) {
	g.tickPending = false
	k := s.now / s.tick
	s.account(g, k+1)
	var sat float64
	if s.cfg.onTick != nil {
		sat = flowcontrol.Sanitize(source{s, g}.Saturation())
	}
	if g.d != nil {
		g.d.Step()
	} else {
		g.l.Cycle()
	}
	g.lastTick = k
	if s.cfg.onTick != nil {
		s.cfg.onTick(s, g, sat)
	}
	s.schedule(g, gi)
}

func (s *sim) scrape(g *gateway, gi int32) {
	s.catchUp(g)
	at := s.nowTime()
	for r, rep := range s.replicas {
		m := rep.Metrics()
		g.readings[r] = saturation.Reading{Waiting: float64(m.Waiting), Running: float64(m.Running),
			KVUsage: m.KVCacheUsage, InFlight: s.seen(g, r), At: at, OK: true}
		g.readings[r].PromptMean, g.readings[r].OutputMean = s.signal.means(r)
		g.readings[r].KVCapacity = float64(s.cfg.Replica.TotalBlocks * s.cfg.Replica.BlockSize)
	}
	g.readVer++
	g.scrapes++
	s.push(s.now+int64(s.cfg.Scrape), evScrape, gi)
	s.schedule(g, gi)
	if g.ev != nil {
		s.armEvict(g, gi, s.now) // the saturation changed
	}
}

// route picks the replica for gateway g's next request by the configured routing.
func (s *sim) route(g *gateway) int { return s.routeAmong(g, nil) }

// routeAmong is route over the replicas r with among[r] (nil: all of them).
func (s *sim) routeAmong(g *gateway, among []bool) int {
	if s.cfg.Routing == RoutingInFlight {
		return s.routeInFlight(g, among)
	}
	return s.routeScrape(g, among)
}

// routeKV (CriticalRoutingKV) filters, then routes, as flowhttp.Router.LeastLoadedFor(0)
// does: the gateway's Routing decides among the replicas with at least
// Config.CriticalKVHeadroom of their KV cache free at gateway g's last scrape (1 −
// vllm:kv_cache_usage_perc) or, when none has it, among those with the lowest usage;
// among all, as route does, when that keeps all.
func (s *sim) routeKV(g *gateway) int {
	limit, lowest := 1-s.cfg.CriticalKVHeadroom, math.Inf(1)
	n := 0
	for r := range s.replicas {
		kv := g.readings[r].KVUsage
		lowest = min(lowest, kv)
		s.among[r] = kv <= limit
		if s.among[r] {
			n++
		}
	}
	if n == 0 {
		for r := range s.replicas {
			s.among[r] = g.readings[r].KVUsage == lowest
			if s.among[r] {
				n++
			}
		}
	}
	if n == len(s.replicas) {
		return s.route(g)
	}
	return s.routeAmong(g, s.among)
}

// routeScrape (RoutingScrape) picks the least loaded replica as this gateway sees it:
// the larger of the scraped waiting+running and the in-flight count it sees there (its
// own requests that the metrics may not show yet, plus the other gateways' with a
// shared view); ties go to fewer own in-flight requests, then lower index.
func (s *sim) routeScrape(g *gateway, among []bool) int {
	best, bestLoad, bestOwn := 0, math.Inf(1), int64(math.MaxInt64)
	for r := range s.replicas {
		if among != nil && !among[r] {
			continue
		}
		rd := g.readings[r]
		load := max(rd.Waiting+rd.Running, float64(s.seen(g, r)))
		if load < bestLoad || (load == bestLoad && g.inflight[r] < bestOwn) {
			best, bestLoad, bestOwn = r, load, g.inflight[r]
		}
	}
	return best
}

// routeInFlight (RoutingInFlight) is the example proxy's pick and
// flowhttp.Router.LeastLoaded, step for step: the counter advances first and the
// scan starts at counter mod N, so a gateway's first pick scans from replica 1; the
// first replica in that cyclic order with strictly the fewest requests in flight as
// this gateway sees them (seen: own, plus the others' as last synced) wins. The
// proxy's other preferences — over backends that failed within the last second or
// whose metrics the poller cannot use — never apply here: simulated replicas do not
// fail and every scrape succeeds.
func (s *sim) routeInFlight(g *gateway, among []bool) int {
	n := len(s.replicas)
	g.rr++
	start := int(g.rr % uint64(n))
	best, bestLoad := -1, int64(0)
	for k := range n {
		r := (start + k) % n
		if among != nil && !among[r] {
			continue
		}
		if load := s.seen(g, r); best < 0 || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best
}

// dispatch is the Dispatcher's callback: the request goes to a replica now.
func (s *sim) dispatch(gi int32, band int, id int32) {
	g := s.gws[gi]
	g.queued[band]--
	q := &s.reqs[id]
	var r int
	if q.critical && s.critKV {
		r = s.routeKV(g)
	} else {
		r = s.route(g)
	}
	if s.cfg.onRoute != nil {
		s.cfg.onRoute(s, g, r, id)
	}
	q.replica = int32(r)
	q.dispatch = s.now
	if s.cfg.LongShort && !q.critical && s.now >= s.window/4 && s.now < 3*s.window/4 {
		t := 0
		if q.tenantB {
			t = 1
		}
		s.tokens[t] += float64(q.vr.Input + q.vr.Output)
	}
	if err := s.replicas[r].Add(q.vr); err != nil {
		s.err = fmt.Errorf("cluster: request %d: %w", id, err)
		return
	}
	s.moveInflight(gi, r, 1)
	s.kick(r)
	if g.ev != nil {
		if q.tr == nil {
			q.act = func() { s.evict(id) }
			q.tr = g.ev.Track(band, s.eps[r], q.act)
		} else {
			q.tr.Again(s.eps[r], q.act)
		}
		// Not from here: a Dispatch callback must not re-queue (Requeue takes
		// the tick lock), and the instant's other releases come first.
		s.armEvict(g, gi, s.now)
	}
}

// seen is the in-flight count on replica r that gateway g sees: its own, plus, with a
// shared view, the other gateways' (exact, or as of the last sync).
func (s *sim) seen(g *gateway, r int) int64 {
	if s.cfg.SharedInFlightExact || s.cfg.SharedInFlight > 0 {
		return g.inflight[r] + g.others[r]
	}
	return g.inflight[r]
}

// moveInflight changes gateway gi's in-flight count on replica r by delta and every
// view of it: the gateway's own reading and, with an exact shared view, every other
// gateway's (each brought up to date first, as for any change of its inputs).
func (s *sim) moveInflight(gi int32, r int, delta int64) {
	g := s.gws[gi]
	g.inflight[r] += delta
	s.total[r] += delta
	g.readings[r].InFlight = s.seen(g, r)
	g.readVer++
	if !s.cfg.SharedInFlightExact {
		return
	}
	// The others see it at the end of this instant (an evSync after every tick of
	// the instant), so that a gateway's tick at this instant reads the same view
	// whether it ran or was skipped.
	for oi, o := range s.gws {
		if int32(oi) != gi && !o.syncPending {
			o.syncPending = true
			s.push(s.now, evSync, int32(oi))
		}
	}
}

// sync refreshes gateway gi's copy of the other gateways' in-flight counts, as a
// replica of the shared view (saturation/redisshare) does every period.
func (s *sim) sync(g *gateway, gi int32) {
	// evSync comes after every tick of its instant: a tick at this very instant
	// has run (or, skipped, is replayed now) with the old view.
	s.catchUpTo(g, s.now/s.tick)
	for r := range s.replicas {
		g.others[r] = s.total[r] - g.inflight[r]
		g.readings[r].InFlight = s.seen(g, r)
	}
	g.readVer++
	g.syncPending = false
	if !s.cfg.SharedInFlightExact && (s.pending > 0 || s.arrivals > 0) {
		s.push(s.now+int64(s.cfg.SharedInFlight), evSync, gi)
	}
	s.schedule(g, gi)
}

// kick starts replica r's next step after this instant's releases (so requests released
// at the same instant share it), unless it is busy or already kicked.
func (s *sim) kick(r int) {
	if !s.busy[r] && !s.kicked[r] {
		s.kicked[r] = true
		s.push(s.now, evKick, int32(r))
	}
}

func (s *sim) begin(r int) {
	if s.busy[r] {
		return
	}
	d, evs, ok := s.replicas[r].Begin(s.evbuf[:0])
	for _, e := range evs {
		if e.Kind == vllm.Preempted {
			s.preempts++
		}
	}
	s.evbuf = evs
	if ok {
		if s.now < s.window {
			s.signal.steps.add(s.replicas[r].LastBatch().Requests, d.Seconds())
		}
		s.busy[r] = true
		s.push(s.now+int64(d), evStepEnd, int32(r))
	}
}

func (s *sim) stepEnd(r int) {
	s.busy[r] = false
	s.steps++
	evs := s.replicas[r].Finish(s.evbuf[:0])
	s.evbuf = evs
	for _, e := range evs {
		q := &s.reqs[e.Req.ID]
		switch e.Kind {
		case vllm.FirstToken:
			q.first = s.now
			if q.tr != nil && s.streams(q.critical) {
				q.tr.Start()
			}
		case vllm.Finished:
			q.done = s.now
			s.pending--
			if q.tr != nil {
				q.tr.Done()
			}
			s.signal.finished(r, q.vr)
			g := s.gws[q.gw]
			s.catchUp(g)
			s.moveInflight(q.gw, r, -1)
			s.schedule(g, q.gw)
		}
	}
	s.begin(r)
}
