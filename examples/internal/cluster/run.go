package cluster

import (
	"fmt"
	"math"
	"time"

	"github.com/emirpasic/gods/v2/trees/binaryheap"

	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// Bands of the simulated gateway.
const (
	BandCritical  = 0
	BandSheddable = 1
	bands         = 2
)

type evKind uint8

const (
	evArrival evKind = iota // idx = gateway
	evTick                  // idx = gateway
	evScrape                // idx = gateway
	evKick                  // idx = replica: start a step if idle
	evStepEnd               // idx = replica
)

// event is a comparable value so it can live in a gods binary heap; seq breaks ties
// in insertion order, which makes the run deterministic.
type event struct {
	at   int64
	seq  uint64
	kind evKind
	idx  int32
}

func compareEvents(a, b event) int {
	switch {
	case a.at < b.at:
		return -1
	case a.at > b.at:
		return 1
	case a.seq < b.seq:
		return -1
	case a.seq > b.seq:
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
	vr       *vllm.Request // its own allocation: the replica keeps the pointer while reqs grows
}

type gateway struct {
	d        *flowcontrol.Dispatcher[int32]
	gen      *workload.Generator
	next     workload.Arrival
	hasNext  bool
	queued   [bands]int
	inflight []int64
	readings []saturation.Reading

	lastTick    int64 // index of the last tick Step ran (tick k is at k·Tick); -1 none
	tickPending bool

	accounted int64 // ticks < accounted are in regime/satSum
	regime    [3]uint64
	satSum    float64
	maxQueued int
}

type sim struct {
	cfg      Config
	now      int64
	base     time.Time
	seq      uint64
	events   *binaryheap.Heap[event]
	replicas []*vllm.Replica
	busy     []bool // a step is in flight
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
	err      error
}

func (s *sim) push(at int64, k evKind, idx int32) {
	s.seq++
	s.events.Push(event{at: at, seq: s.seq, kind: k, idx: idx})
}

func (s *sim) nowTime() time.Time { return s.base.Add(time.Duration(s.now)) }

// source is gateway g's saturation as the dispatcher reads it: the saturation package's
// pure Scorer over the last scraped metrics (plus, with Credit, the gateway's in-flight
// requests), evaluated at the virtual now.
type source struct {
	s *sim
	g *gateway
}

func (src source) Saturation() float64 { return src.s.scorer.Pool(src.g.readings, src.s.nowTime()) }

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
		events: binaryheap.NewWith(compareEvents),
		scorer: saturation.Scorer{InFlightCredit: cfg.Credit},
		tick:   int64(cfg.Tick),
		window: int64(cfg.Duration),
	}
	s.winTicks = (s.window + s.tick - 1) / s.tick
	if cfg.Policy == Static {
		s.policy = flowcontrol.NewStatic(flowcontrol.DefaultStaticThreshold)
	} else {
		s.policy = flowcontrol.NewSoftReflective()
	}
	for range cfg.Replicas {
		r, err := vllm.New(cfg.Replica)
		if err != nil {
			return nil, fmt.Errorf("cluster: Replica: %w", err)
		}
		s.replicas = append(s.replicas, r)
	}
	s.busy = make([]bool, cfg.Replicas)
	s.kicked = make([]bool, cfg.Replicas)
	for g := range cfg.Gateways {
		gen, err := workload.NewGenerator(cfg.Workload, cfg.QPS/float64(cfg.Gateways), cfg.CV, cfg.Seed, uint64(g))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		gw := &gateway{gen: gen, inflight: make([]int64, cfg.Replicas),
			readings: make([]saturation.Reading, cfg.Replicas), lastTick: -1}
		gi := int32(g)
		bandCfg := make([]flowcontrol.BandConfig, bands)
		for i := range bandCfg {
			bandCfg[i].Capacity = cfg.Capacity
		}
		d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int32]{
			Config: flowcontrol.Config{
				Bands:  bandCfg,
				Policy: s.policy,
				Source: source{s, gw},
				Burst:  cfg.Burst,
				Tick:   cfg.Tick,
				Now:    s.nowTime,
			},
			Dispatch: func(band int, id int32) { s.dispatch(gi, band, id) },
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		gw.d = d
		s.gws = append(s.gws, gw)
		gw.next = gen.Next()
		if int64(gw.next.At) < s.window {
			gw.hasNext = true
			s.arrivals++
			s.push(int64(gw.next.At), evArrival, gi)
		}
		// Gateways scrape out of phase, as independent proxies would.
		s.push(int64(cfg.Scrape)*int64(g)/int64(cfg.Gateways), evScrape, gi)
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
	for !s.events.Empty() {
		if s.arrivals == 0 && s.pending == 0 {
			return
		}
		e, _ := s.events.Pop()
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
		}
		if s.err != nil {
			return
		}
	}
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

// account counts the ticks with index < upTo (and inside the arrival window) in the
// regime the policy gives the sheddable band at the gateway's current saturation. The
// saturation is piecewise constant between events, so this is exact whether or not the
// dispatcher actually ran those ticks.
func (s *sim) account(g *gateway, upTo int64) {
	upTo = min(upTo, s.winTicks)
	if upTo <= g.accounted {
		return
	}
	sat := flowcontrol.Sanitize(source{s, g}.Saturation())
	n := upTo - g.accounted
	g.regime[regimeOf(s.policy.Gate(BandSheddable, bands, sat))] += uint64(n)
	g.satSum += sat * float64(n)
	g.accounted = upTo
}

// ticksBefore is the number of tick indices k with k·Tick < now.
func (s *sim) ticksBefore() int64 { return (s.now + s.tick - 1) / s.tick }

// catchUp brings a dormant gateway's dispatcher up to date before one of its inputs
// changes: the ticks it skipped (all at a saturation equal to the current one, since
// nothing changed in between) are replayed, at most CatchUp of them. On those ticks
// the dispatcher could not release anything (its bands were empty or blocked), so
// replaying only advances its per-band tick counts, which saturate in effect once they
// exceed any Every the policy returns below the cap.
func (s *sim) catchUp(g *gateway) {
	last := s.ticksBefore() - 1 // the last tick strictly before now
	s.account(g, last+1)
	if g.tickPending || last <= g.lastTick {
		return
	}
	n := min(last-g.lastTick, int64(s.cfg.CatchUp))
	for range n {
		g.d.Step()
	}
	g.lastTick = last
}

// canRelease reports whether some non-empty band has a gate that is not a hard block at
// the current saturation (asking the policy, not re-deriving it).
func (s *sim) canRelease(g *gateway) bool {
	sat := flowcontrol.Sanitize(source{s, g}.Saturation())
	for b := range bands {
		if g.queued[b] > 0 && s.policy.Gate(b, bands, sat).Every > 0 {
			return true
		}
	}
	return false
}

// schedule arms the gateway's next tick if it could release something; otherwise the
// gateway stays dormant until an input changes.
func (s *sim) schedule(g *gateway, gi int32) {
	if g.tickPending || (!s.cfg.noSkip && !s.canRelease(g)) {
		return
	}
	k := max(s.ticksBefore(), g.lastTick+1)
	g.tickPending = true
	s.push(k*s.tick, evTick, gi)
}

func (s *sim) arrive(g *gateway, gi int32) {
	a := g.next
	s.catchUp(g)
	id := int32(len(s.reqs))
	s.reqs = append(s.reqs, request{critical: a.Critical, gw: gi, replica: -1, arrive: s.now, dispatch: -1, first: -1, done: -1,
		vr: &vllm.Request{ID: uint64(id), Input: a.Input, Output: a.Output}})
	band := BandSheddable
	if a.Critical {
		band = BandCritical
	}
	if err := g.d.Enqueue(band, id); err == nil {
		g.queued[band]++
		s.pending++
		g.maxQueued = max(g.maxQueued, g.queued[0]+g.queued[1])
		// Run wakes on Enqueue and polls: an open band with burst left this tick
		// releases the item at once.
		g.d.Poll()
	} else {
		s.reqs[id].rejected = true
	}
	g.next = g.gen.Next()
	if int64(g.next.At) < s.window {
		s.push(int64(g.next.At), evArrival, gi)
	} else {
		g.hasNext = false
		s.arrivals--
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
	g.d.Step()
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
			KVUsage: m.KVCacheUsage, InFlight: g.inflight[r], At: at, OK: true}
	}
	s.push(s.now+int64(s.cfg.Scrape), evScrape, gi)
	s.schedule(g, gi)
}

// route picks the least loaded replica as this gateway sees it: the larger of the
// scraped waiting+running and its own in-flight count there (requests it sent that the
// metrics may not show yet); ties go to fewer own in-flight requests, then lower index.
func (s *sim) route(g *gateway) int {
	best, bestLoad, bestOwn := 0, math.Inf(1), int64(math.MaxInt64)
	for r := range s.replicas {
		rd := g.readings[r]
		load := max(rd.Waiting+rd.Running, float64(g.inflight[r]))
		if load < bestLoad || (load == bestLoad && g.inflight[r] < bestOwn) {
			best, bestLoad, bestOwn = r, load, g.inflight[r]
		}
	}
	return best
}

// dispatch is the Dispatcher's callback: the request goes to a replica now.
func (s *sim) dispatch(gi int32, band int, id int32) {
	g := s.gws[gi]
	g.queued[band]--
	q := &s.reqs[id]
	r := s.route(g)
	q.replica = int32(r)
	q.dispatch = s.now
	if err := s.replicas[r].Add(q.vr); err != nil {
		s.err = fmt.Errorf("cluster: request %d: %w", id, err)
		return
	}
	g.inflight[r]++
	g.readings[r].InFlight = g.inflight[r]
	if !s.busy[r] && !s.kicked[r] {
		// Start the step after this tick's releases, so requests released in the
		// same tick share it.
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
		case vllm.Finished:
			q.done = s.now
			s.pending--
			g := s.gws[q.gw]
			s.catchUp(g)
			g.inflight[r]--
			g.readings[r].InFlight = g.inflight[r]
			s.schedule(g, q.gw)
		}
	}
	s.begin(r)
}
