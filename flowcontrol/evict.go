package flowcontrol

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Eviction defaults (EvictionConfig's zero values).
const (
	// DefaultEvictionThreshold is the pool saturation at and above which
	// an Evictor gives way to a band held at the gateway: a pool that
	// still has room serves it without anybody giving way.
	DefaultEvictionThreshold = 1.0
	// DefaultEvictionKVThreshold is the KV-cache usage at and above which
	// an endpoint gives way to a request held there. Eviction frees KV
	// cache: below this the held request waits for compute (a long
	// prefill, a full batch), which taking work back does not buy.
	DefaultEvictionKVThreshold = 0.9
	// DefaultEvictionStall is how long a released request may go without
	// its first byte before it counts as held.
	DefaultEvictionStall = 100 * time.Millisecond
	// DefaultEvictionGrace is the pause after a confirmed eviction before
	// the next on the same endpoint: saturation.DefaultInterval, one scrape,
	// so the freed capacity shows in the saturation before it is judged
	// again.
	DefaultEvictionGrace = 50 * time.Millisecond
	// DefaultEvictionConfirmTimeout is how long an endpoint waits for a
	// victim's confirmation before it may give way again.
	DefaultEvictionConfirmTimeout = 2 * time.Second
	// DefaultMaxEvictions is how many times one request may be evicted;
	// after that it is immune.
	DefaultMaxEvictions = 2
	// evictionRecheck is how often Evictor.Run looks again while a held
	// request waits only on the saturation (which notifies nobody).
	evictionRecheck = 10 * time.Millisecond
)

// EvictionConfig configures eviction (see Evictor). The zero value is
// eviction off; Enabled with every other field zero is the defaults.
type EvictionConfig struct {
	// Enabled turns eviction on (ControllerConfig.Eviction; NewEvictor
	// ignores it).
	Enabled bool
	// KVUsage reports an endpoint's KV-cache usage as last read, from 0
	// to 1 (vLLM's vllm:kv_cache_usage_perc); NaN means unknown. An
	// endpoint gives way to a request held there only while its usage is
	// at least KVThreshold. Required (flowhttp.Gateway sets it from its
	// poller; a host with one pool and no endpoints reads the pool's).
	KVUsage func(endpoint string) float64
	// KVThreshold is that usage; 0 means DefaultEvictionKVThreshold.
	KVThreshold float64
	// Threshold is the pool saturation at and above which the evictor
	// gives way to a band held at the gateway; 0 means
	// DefaultEvictionThreshold.
	Threshold float64
	// Stall is how long a tracked request may go without its first byte
	// (Tracked.Start) before it counts as held; 0 means
	// DefaultEvictionStall.
	Stall time.Duration
	// Grace is the pause after the server confirmed an eviction on an
	// endpoint (the victim's Tracked.Done) before the next eviction there.
	// Set it no shorter than the saturation source's scrape interval: a
	// shorter grace judges the pool before the freed capacity shows, and
	// evicts again for nothing. 0 means DefaultEvictionGrace.
	Grace time.Duration
	// ConfirmTimeout bounds the wait for a victim's Done: an endpoint
	// whose eviction is unconfirmed this long may give way again (a hung
	// stream must not stop eviction there). 0 means
	// DefaultEvictionConfirmTimeout.
	ConfirmTimeout time.Duration
	// MaxEvictions is how many times one request may be evicted before it
	// is immune; 0 means DefaultMaxEvictions.
	MaxEvictions int
	// Started lets the evictor take requests whose response has started
	// (Tracked.Start): their client sees the stream end with an error.
	// Off, a started response is never cut.
	Started bool
}

// evictorSetup is what an Evictor reads besides its EvictionConfig.
type evictorSetup struct {
	bands  int
	source SaturationSource
	held   func() int
	now    func() time.Time
}

// Evictor decides which released requests to take back, and when, so that
// a held request of a more critical band gets the capacity they occupy.
// Gating decides what leaves the gateway; an Evictor undoes what has left
// when the servers are full of less critical work that a more critical
// request now waits behind (a vLLM server without priority scheduling
// preempts nobody for a request waiting in its queue).
//
// The host tells it of every released request (Track), of its first byte
// to the client (Tracked.Start) and of its end (Tracked.Done), and gives
// the act: a function that cancels the request at its server. The evictor
// decides; the host acts and, for a victim whose response had not started,
// re-queues it (Controller.Requeue, Dispatcher.Requeue) so its client sees
// only a later first token.
//
// The rule, at each Check:
//
//   - It acts only for a request of a more critical band that is held:
//     tracked without a first byte for Stall, on an endpoint whose KV
//     cache is full (KVUsage at least KVThreshold: eviction frees memory,
//     not compute), or queued at the gateway behind a gate while the
//     pool's saturation is at least Threshold (NewEvictor's held band).
//     After it gives a held request a victim, that request waits another
//     Stall before it may call for the next.
//   - Victims are tracked requests of a less critical band than the held
//     one: on its endpoint, released there before it (a server serves its
//     queue in order, so what came after the held request is not in its
//     way), or anywhere, for a request held at the gateway; the least
//     critical band first, then the newest (the least work lost). A
//     request whose response has started is never a victim unless
//     Started; one evicted MaxEvictions times is immune.
//   - At most one eviction is in flight per endpoint (and one for the
//     gateway's queue): the next waits until the server confirmed the last
//     (its Tracked.Done) plus Grace, or, if no confirmation comes, for
//     ConfirmTimeout.
//
// An Evictor is safe for concurrent use. It calls the act outside its lock,
// on the goroutine running Check.
type Evictor struct {
	cfg   EvictionConfig
	setup evictorSetup
	wake  chan struct{}

	mu sync.Mutex
	// eps holds each endpoint's pacing and its tracked requests; order
	// lists the endpoints in a fixed order (by name), so a host on virtual
	// time replays the same acts in the same order.
	eps   map[string]*endpointState
	order []*endpointState
	// watch holds the tracked requests that may be held: not started, of
	// a band with a less critical one below it (Tracked.widx is the
	// position). Check and Next scan it, not every tracked request.
	watch []*Tracked
	// pool is the pacing of evictions for a request held at the gateway
	// (not on an endpoint): one at a time, paced like an endpoint's.
	pool    endpointState
	tracked int
	seq     uint64
	evicted []uint64 // per band
	immune  []uint64 // per band
	acts    []func() // Check's scratch
	// wakeAt is when Run's timer fires next (zero: Run sleeps until
	// nudged, or no Run).
	wakeAt time.Time
}

// endpointState is one endpoint's tracked requests and the pacing of its
// evictions.
type endpointState struct {
	name     string
	live     []*Tracked // released there and not Done; Tracked.idx is the position
	evicting int        // evictions not yet confirmed
	actAt    time.Time  // the last act
	until    time.Time  // no new eviction before (the last confirmation + Grace)
	// Check's scratch: the most critical band held there, and the newest
	// release of that band held (victims were released before it).
	held    int
	heldSeq uint64
}

// busy reports whether the endpoint (or the gateway's queue) may not give
// way now: an eviction in flight, unless its confirmation is overdue (a
// hung stream must not wedge it), or the grace after the last one.
func (st *endpointState) busy(now time.Time, confirm time.Duration) bool {
	return st.evicting > 0 && now.Sub(st.actAt) < confirm || now.Before(st.until)
}

// Tracked is one released request as an Evictor sees it. Its methods are
// safe for concurrent use.
type Tracked struct {
	e         *Evictor
	band      int
	ep        *endpointState
	at        time.Time // held from: released, or last given a victim
	seq       uint64
	act       func()
	idx       int // in ep.live, -1 when not live
	widx      int // in e.watch, -1 when not there
	started   bool
	evicting  bool // the act was called and Done has not come
	forPool   bool // the eviction was for a request held at the gateway
	evictions int
}

func NewEvictor(cfg EvictionConfig, bands int, source SaturationSource, held func() int, now func() time.Time) (*Evictor, error) {
	switch {
	case bands < 1 || bands > MaxBands:
		return nil, fmt.Errorf("%w: Eviction: bands %d must be in [1, %d]", ErrInvalidConfig, bands, MaxBands)
	case source == nil:
		return nil, fmt.Errorf("%w: Eviction: Source is nil", ErrInvalidConfig)
	case cfg.KVUsage == nil:
		return nil, fmt.Errorf("%w: Eviction.KVUsage is nil: eviction frees KV cache and must know where it is full", ErrInvalidConfig)
	case !(cfg.KVThreshold >= 0 && cfg.KVThreshold <= 1):
		return nil, fmt.Errorf("%w: Eviction.KVThreshold %v must be in [0, 1]", ErrInvalidConfig, cfg.KVThreshold)
	case cfg.Threshold < 0 || math.IsNaN(cfg.Threshold) || math.IsInf(cfg.Threshold, 0):
		return nil, fmt.Errorf("%w: Eviction.Threshold %v must be finite and >= 0", ErrInvalidConfig, cfg.Threshold)
	case cfg.Stall < 0:
		return nil, fmt.Errorf("%w: Eviction.Stall %v must be >= 0", ErrInvalidConfig, cfg.Stall)
	case cfg.Grace < 0:
		return nil, fmt.Errorf("%w: Eviction.Grace %v must be >= 0", ErrInvalidConfig, cfg.Grace)
	case cfg.ConfirmTimeout < 0:
		return nil, fmt.Errorf("%w: Eviction.ConfirmTimeout %v must be >= 0", ErrInvalidConfig, cfg.ConfirmTimeout)
	case cfg.MaxEvictions < 0:
		return nil, fmt.Errorf("%w: Eviction.MaxEvictions %d must be >= 0", ErrInvalidConfig, cfg.MaxEvictions)
	}
	cfg.Threshold = cmp.Or(cfg.Threshold, DefaultEvictionThreshold)
	cfg.KVThreshold = cmp.Or(cfg.KVThreshold, DefaultEvictionKVThreshold)
	cfg.Stall = cmp.Or(cfg.Stall, DefaultEvictionStall)
	cfg.Grace = cmp.Or(cfg.Grace, DefaultEvictionGrace)
	cfg.MaxEvictions = cmp.Or(cfg.MaxEvictions, DefaultMaxEvictions)
	cfg.ConfirmTimeout = cmp.Or(cfg.ConfirmTimeout, DefaultEvictionConfirmTimeout)
	if held == nil {
		held = func() int { return -1 }
	}
	if now == nil {
		now = time.Now
	}
	return &Evictor{
		cfg:     cfg,
		setup:   evictorSetup{bands: bands, source: source, held: held, now: now},
		wake:    make(chan struct{}, 1),
		eps:     make(map[string]*endpointState),
		evicted: make([]uint64, bands),
		immune:  make([]uint64, bands),
	}, nil
}

// Config returns the configuration with defaults applied.

// Config returns the configuration with defaults applied.
func (e *Evictor) Config() EvictionConfig { return e.cfg }

// Track records a request of band released to endpoint ("" for a host that
// does not know endpoints: one pool). act cancels it at its server; the
// evictor calls it at most once per Track or Again, and then waits for the
// request's Done as the server's confirmation. act must not block; it runs
// outside the evictor's lock, so it may call Done. A band outside
// [0, bands) is tracked as the least critical band.
func (e *Evictor) Track(band int, endpoint string, act func()) *Tracked {
	t := &Tracked{e: e, band: min(max(band, 0), e.setup.bands-1), idx: -1, widx: -1}
	t.Again(endpoint, act)
	return t
}

// Again records the request as released again (to endpoint, with a new
// act) after an eviction re-queued it. It keeps its eviction count.
func (t *Tracked) Again(endpoint string, act func()) {
	e := t.e
	e.mu.Lock()
	wake := false
	if t.idx < 0 {
		e.seq++
		t.act, t.at, t.seq = act, e.setup.now(), e.seq
		t.started, t.evicting = false, false
		t.ep = e.endpoint(endpoint)
		t.idx = len(t.ep.live)
		t.ep.live = append(t.ep.live, t)
		e.tracked++
		if t.band < e.setup.bands-1 {
			t.widx = len(e.watch)
			e.watch = append(e.watch, t)
			// Run needs to hear of it only if it would sleep past its
			// stall deadline: under load every Track would otherwise
			// cost it a wake-up and a scan.
			wake = e.wakeAt.IsZero() || e.wakeAt.After(t.at.Add(e.cfg.Stall))
		}
	}
	e.mu.Unlock()
	if wake {
		e.nudge()
	}
}

// endpoint returns name's state, created on first use. Under mu.
func (e *Evictor) endpoint(name string) *endpointState {
	st := e.eps[name]
	if st == nil {
		st = &endpointState{name: name}
		e.eps[name] = st
		i, _ := slices.BinarySearchFunc(e.order, name, func(s *endpointState, n string) int { return strings.Compare(s.name, n) })
		e.order = slices.Insert(e.order, i, st)
	}
	return st
}

// unwatch removes t from the watch list. Under mu.
func (e *Evictor) unwatch(t *Tracked) {
	if t.widx < 0 {
		return
	}
	last := len(e.watch) - 1
	e.watch[t.widx] = e.watch[last]
	e.watch[t.widx].widx = t.widx
	e.watch[last] = nil
	e.watch = e.watch[:last]
	t.widx = -1
}

// Start records the request's first byte to its client: it is no longer
// held and, unless EvictionConfig.Started, no longer a victim.
func (t *Tracked) Start() {
	t.e.mu.Lock()
	t.started = true
	t.e.unwatch(t)
	t.e.mu.Unlock()
}

// Done records that the request ended at its server, for any reason, and
// reports whether the evictor had taken it (its act was called): then this
// Done is the server's confirmation, and the endpoint's next eviction may
// come Grace later. Only the first Done after a Track or Again counts.
func (t *Tracked) Done() (evicted bool) {
	e := t.e
	e.mu.Lock()
	if t.idx >= 0 {
		st := t.ep
		last := len(st.live) - 1
		st.live[t.idx] = st.live[last]
		st.live[t.idx].idx = t.idx
		st.live[last] = nil
		st.live = st.live[:last]
		t.idx = -1
		e.tracked--
		e.unwatch(t)
		if t.evicting {
			evicted = true
			t.evicting = false
			until := e.setup.now().Add(e.cfg.Grace)
			st.evicting--
			st.until = until
			if t.forPool {
				e.pool.evicting--
				e.pool.until = until
			}
		}
	}
	e.mu.Unlock()
	if evicted {
		e.nudge()
	}
	return evicted
}

// Evictions reports how many times the request was evicted.
func (t *Tracked) Evictions() int {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	return t.evictions
}

// Band reports the request's band.
func (t *Tracked) Band() int { return t.band }

func (e *Evictor) nudge() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// victim reports whether v may be evicted for a request held at band h.
func (e *Evictor) victim(v *Tracked, h int) bool {
	return v.band > h && !v.evicting && v.evictions < e.cfg.MaxEvictions && (!v.started || e.cfg.Started)
}

// before reports whether a is a better victim than b: a less critical band,
// then the newer release.
func before(a, b *Tracked) bool {
	return a.band > b.band || a.band == b.band && a.seq > b.seq
}

// Check applies the rule (see Evictor) once, at the clock's now, calls the
// act of every request it takes, and returns how many it took.
func (e *Evictor) Check() int {
	held := e.setup.held()
	if held >= e.setup.bands-1 || held >= 0 && Sanitize(e.setup.source.Saturation()) < e.cfg.Threshold {
		held = -1 // nothing below it, or the pool has room
	}
	e.mu.Lock()
	now := e.setup.now()
	stall := now.Add(-e.cfg.Stall)
	// Endpoints with nothing tracked and nothing to pace are forgotten,
	// so a host whose endpoints come and go does not accumulate them.
	kept := e.order[:0]
	for _, st := range e.order {
		if len(st.live) == 0 && st.evicting == 0 && !now.Before(st.until) {
			delete(e.eps, st.name)
			continue
		}
		st.held = -1
		kept = append(kept, st)
	}
	clear(e.order[len(kept):])
	e.order = kept
	// The most critical band held per endpoint: a watched request without
	// its first byte for Stall; and the newest such release of that band.
	for _, t := range e.watch {
		if t.evicting || t.at.After(stall) {
			continue
		}
		st := t.ep
		if st.held < 0 || t.band < st.held || t.band == st.held && t.seq > st.heldSeq {
			st.held, st.heldSeq = t.band, t.seq
		}
	}
	// The acts are read under the lock: a concurrent Again replaces them.
	acts := e.acts[:0]
	for _, st := range e.order {
		if st.held < 0 || st.busy(now, e.cfg.ConfirmTimeout) {
			continue
		}
		if kv := e.cfg.KVUsage(st.name); !(kv >= e.cfg.KVThreshold) {
			continue // not full (or unknown): the held request waits for compute
		}
		var best *Tracked
		for _, v := range st.live {
			if v.seq < st.heldSeq && e.victim(v, st.held) && (best == nil || before(v, best)) {
				best = v
			}
		}
		if best != nil {
			e.take(best, false, now)
			acts = append(acts, best.act)
			// The requests held there wait another Stall before they
			// call for another victim: one eviction may be all they
			// need, and a request waiting for compute rather than
			// memory would otherwise take a victim every Grace.
			for _, t := range e.watch {
				if t.ep == st && t.band < best.band && !t.at.After(stall) {
					t.at = now
				}
			}
		}
	}
	if held >= 0 && !e.pool.busy(now, e.cfg.ConfirmTimeout) {
		var best *Tracked
		for _, st := range e.order {
			if st.busy(now, e.cfg.ConfirmTimeout) {
				continue // already giving way
			}
			for _, v := range st.live {
				if e.victim(v, held) && (best == nil || before(v, best)) {
					best = v
				}
			}
		}
		if best != nil {
			e.take(best, true, now)
			acts = append(acts, best.act)
		}
	}
	e.acts = acts
	e.mu.Unlock()
	for i, act := range acts {
		act()
		acts[i] = nil
	}
	return len(acts)
}

// Decline undoes the eviction whose act was just called, for an act that
// found nothing to cut (the request had finished, or its response had
// just started and EvictionConfig.Started is off): it is not counted, the
// request keeps its eviction count, and its endpoint may give way again at
// once (no confirmation to wait for, no grace). It does nothing unless the
// act was called and neither Done nor Decline has come since.
func (t *Tracked) Decline() {
	e := t.e
	e.mu.Lock()
	if t.evicting {
		if t.evictions == e.cfg.MaxEvictions {
			e.immune[t.band]--
		}
		t.evicting = false
		t.evictions--
		e.evicted[t.band]--
		t.ep.evicting--
		if t.forPool {
			e.pool.evicting--
		}
	}
	e.mu.Unlock()
	e.nudge()
}

// take marks v evicted, in flight on its endpoint (and for the gateway's
// queue, if forPool). Under mu.
func (e *Evictor) take(v *Tracked, forPool bool, now time.Time) {
	v.ep.evicting++
	v.ep.actAt = now
	if forPool {
		e.pool.evicting++
		e.pool.actAt = now
	}
	v.evicting, v.forPool = true, forPool
	v.evictions++
	e.evicted[v.band]++
	if v.evictions == e.cfg.MaxEvictions {
		e.immune[v.band]++
	}
}

// Next returns the earliest instant after which Check may decide
// differently with the saturation unchanged (a tracked request's stall
// deadline, an endpoint's grace end or confirmation deadline), or the zero
// time if nothing is pending.
func (e *Evictor) Next() time.Time {
	next, _ := e.next()
	return next
}

// next is Next, and whether a tracked request is held now (so that Run
// checks again soon: the KV usage or the saturation may turn).
func (e *Evictor) next() (next time.Time, holding bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	now := e.setup.now()
	for _, t := range e.watch {
		if t.evicting {
			continue
		}
		if d := t.at.Add(e.cfg.Stall); d.After(now) {
			earlier(d)
		} else {
			holding = true
		}
	}
	pace := func(st *endpointState) {
		if st.until.After(now) {
			earlier(st.until)
		}
		if d := st.actAt.Add(e.cfg.ConfirmTimeout); st.evicting > 0 && d.After(now) {
			earlier(d)
		}
	}
	pace(&e.pool)
	for _, st := range e.order {
		pace(st)
	}
	return next, holding
}

// Run checks on the real clock until ctx ends (it returns ctx.Err()): at
// each stall deadline and grace end (Next), after every confirmed eviction
// and every Track that Run would otherwise sleep past, and every 10 ms
// while a request is held but the saturation is below the threshold. A
// Controller with eviction enabled runs it beside its dispatcher; a host
// that steps its own clock calls Check instead.
func (e *Evictor) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// While Run decides how long to sleep, every Track nudges it
		// (wakeAt zero), so none is missed between Next and the sleep.
		e.mu.Lock()
		e.wakeAt = time.Time{}
		e.mu.Unlock()
		e.Check()
		wait := time.Duration(-1)
		next, holding := e.next()
		if h := e.setup.held(); holding || h >= 0 && h < e.setup.bands-1 {
			wait = evictionRecheck
		}
		if !next.IsZero() {
			if d := next.Sub(e.setup.now()); wait < 0 || d < wait {
				wait = max(d, 0)
			}
		}
		var fire <-chan time.Time
		var at time.Time
		if wait >= 0 {
			timer.Reset(wait)
			fire = timer.C
			at = e.setup.now().Add(wait)
		}
		e.mu.Lock()
		e.wakeAt = at
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.wake:
		case <-fire:
		}
	}
}

// EvictionStats is a snapshot of an Evictor.
type EvictionStats struct {
	// Tracked is the number of released requests tracked (not Done).
	Tracked int
	// Evicting is the number of evictions whose Done has not come.
	Evicting int
	// Evicted counts evictions per band; Immune counts the requests of
	// each band that reached MaxEvictions.
	Evicted, Immune []uint64
}

// Stats returns a snapshot.
func (e *Evictor) Stats() EvictionStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := EvictionStats{Tracked: e.tracked,
		Evicted: append([]uint64(nil), e.evicted...), Immune: append([]uint64(nil), e.immune...)}
	for _, s := range e.order {
		st.Evicting += s.evicting
	}
	return st
}
