package flowhttp

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/saturation"
)

// Router is a Gateway's ready-made routing, for a host that has none of its
// own: it picks the endpoint a request goes to. A host with its own routing
// may ignore it, or ask it only which endpoints the critical routing keeps
// (Eligibility).
//
// The rule is the fewest requests this gateway has in flight (as counted by
// Gateway.Forward), among the endpoints whose metrics the poller could use
// at its last look (all of them if none could), ties broken round-robin.
// With the critical routing on (GatewayConfig.CriticalKVHeadroom), a band-0
// request is picked by the same rule among the endpoints with that share of
// their KV cache free, or the emptiest when none has it: a priority-scheduling
// server lets a critical request pass every queued one, but it still needs
// free KV blocks for its prompt.
//
// A Router is safe for concurrent use. Gateway.Router returns it; it has no
// other constructor.
type Router struct {
	bases    []string       // the endpoints' base URLs, in configuration order
	murls    []string       // metrics URLs, in endpoint order
	usable   []atomic.Bool  // the poller's verdict per endpoint, copied every interval (watch)
	rr       atomic.Uint64  // pick's round-robin counter
	index    map[string]int // base URL → its index in bases (and murls)
	byMetric map[string]int // metrics URL (the poller's name for it) → its index in bases
	headroom float64        // the critical routing's KV headroom; 0: off
	poller   *saturation.Poller
	kv       atomic.Pointer[kvView]
	kvMu     sync.Mutex              // held while a kvView is rebuilt, and for kvBuf
	kvBuf    []saturation.PodReading // the rebuild's snapshot, reused
}

// configure validates the endpoints' base URLs and records them with
// their metrics URLs (base joined with path), which it returns in the same
// order.
func (rt *Router) configure(endpoints []string, path string) ([]string, error) {
	rt.index, rt.byMetric = map[string]int{}, map[string]int{}
	urls := make([]string, 0, len(endpoints))
	for i, raw := range endpoints {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: Endpoints[%d] %q is not an http(s) base URL", ErrInvalidConfig, i, raw)
		}
		if _, dup := rt.index[raw]; dup {
			return nil, fmt.Errorf("%w: Endpoints[%d] %q is listed twice", ErrInvalidConfig, i, raw)
		}
		m := u.JoinPath(path).String()
		rt.index[raw] = len(rt.bases)
		rt.byMetric[m] = len(rt.bases)
		rt.bases = append(rt.bases, raw)
		urls = append(urls, m)
	}
	rt.murls = urls
	rt.usable = make([]atomic.Bool, len(urls))
	return urls, nil
}

// watch copies the poller's per-endpoint verdict (usable or not) every
// interval, so that a pick reads atomics, not the poller's lock.
func (rt *Router) watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for _, r := range rt.poller.Readings() {
			if i, ok := rt.byMetric[r.Endpoint]; ok {
				rt.usable[i].Store(r.Usable)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Endpoints returns the endpoints' base URLs (GatewayConfig.Endpoints), in
// configuration order: the names Route returns and Gateway.Forward takes.
func (rt *Router) Endpoints() []string { return append([]string(nil), rt.bases...) }

// Route picks the endpoint for the request w answers, from the handler
// Gateway.Handler wraps: LeastLoadedFor the band the request waited in
// (BandOf), or LeastLoaded for a request that was not gated. "" when there
// are no endpoints.
//
//	ep := gw.Router().Route(w)
//	defer gw.Forward(w, ep)()
func (rt *Router) Route(w http.ResponseWriter) string {
	if band, ok := BandOf(w); ok {
		return rt.LeastLoadedFor(band)
	}
	return rt.pick(nil)
}

// LeastLoaded picks by the Router's rule without the critical routing: every
// request alike. "" when there are no endpoints.
func (rt *Router) LeastLoaded() string { return rt.pick(nil) }

// LeastLoadedFor picks for a request in band: a band-0 request, with the
// critical routing on, among the endpoints Eligibility keeps; every other
// request as LeastLoaded does. "" when there are no endpoints.
func (rt *Router) LeastLoadedFor(band int) string {
	if band != 0 || rt.headroom == 0 {
		return rt.pick(nil)
	}
	return rt.pick(rt.kvKeep())
}

// Eligible reports whether the critical routing keeps endpoint for a request
// in band, as Eligibility(band).Keeps(endpoint) does; an endpoint the
// gateway does not know is kept. A host that asks once per endpoint may mix
// two readings in one pick: Eligibility answers for every endpoint from one
// reading.
func (rt *Router) Eligible(band int, endpoint string) bool {
	return rt.Eligibility(band).Keeps(endpoint)
}

// Eligibility returns the critical routing's verdict for a request in band,
// as of the last reading. It keeps every endpoint unless the routing is on
// and band is 0; then it rejects an endpoint whose reading is unusable or
// leaves less than the headroom free while another's leaves it, or, when
// none leaves it, less free than another's. A host with its own routing
// ranks the rejected endpoints after every other, as LeastLoadedFor does.
func (rt *Router) Eligibility(band int) Eligibility {
	if band != 0 || rt.headroom == 0 {
		return Eligibility{}
	}
	return Eligibility{index: rt.index, keep: rt.kvKeep()}
}

// CriticalKVHeadroom returns the critical routing's headroom
// (GatewayConfig.CriticalKVHeadroom with its default); 0 when the routing is
// off.
func (rt *Router) CriticalKVHeadroom() float64 { return rt.headroom }

// Eligibility is the critical routing's verdict for one pick, taken from one
// reading: Keeps answers for every endpoint alike, however many readings
// arrive meanwhile. It is cheap (no allocation) and meant to live for one
// routing decision:
//
//	el := gw.Router().Eligibility(band)
//	for _, ep := range candidates {
//		if !el.Keeps(ep) { /* rank it after the others */ }
//	}
type Eligibility struct {
	index map[string]int
	keep  []bool // nil: every endpoint is kept
}

// Keeps reports whether the verdict keeps endpoint (one of
// GatewayConfig.Endpoints, as written there); an endpoint the gateway does
// not know is kept. The zero Eligibility keeps every endpoint.
func (e Eligibility) Keeps(endpoint string) bool {
	if e.keep == nil {
		return true
	}
	i, ok := e.index[endpoint]
	return !ok || e.keep[i]
}

// pick is the Router's rule over the endpoints i with keep[i] (nil: all):
// usable first, then the fewest in flight, ties to the first met from the
// round-robin start (the counter advances on every pick, filtered or not).
func (rt *Router) pick(keep []bool) string {
	n := len(rt.bases)
	if n == 0 {
		return ""
	}
	start := int(rt.rr.Add(1) % uint64(n))
	best, bestLoad, bestUsable := -1, int64(0), false
	for k := range n {
		i := (start + k) % n
		if keep != nil && !keep[i] {
			continue
		}
		load, usable := rt.poller.InFlight(rt.murls[i]), rt.usable[i].Load()
		if best < 0 || usable && !bestUsable || usable == bestUsable && load < bestLoad {
			best, bestLoad, bestUsable = i, load, usable
		}
	}
	return rt.bases[best]
}

// kvView is the critical routing's filter as of one poller reading
// sequence: keep[i] for the endpoints with the headroom, or, when none has
// it, for those with the lowest KV usage; nil when that keeps all of them
// or no reading is usable (no filter).
type kvView struct {
	seq  uint64
	keep []bool
}

// kvKeep returns the critical routing's filter (nil: none), rebuilt from
// the poller's readings when a scrape result arrived since the last build
// (Poller.ReadingSeq), so a pick reads the last reading, not one an
// interval old. The rebuild is one snapshot of the poller's readings per
// new reading at most, into a buffer kept for it (BenchmarkCriticalPick),
// since in a large pool nearly every critical pick follows a new reading;
// a pick that finds another goroutine rebuilding
// uses the previous filter.
func (rt *Router) kvKeep() []bool {
	seq := rt.poller.ReadingSeq()
	v := rt.kv.Load()
	if v != nil && v.seq == seq {
		return v.keep
	}
	if !rt.kvMu.TryLock() {
		if v != nil {
			return v.keep
		}
		return nil
	}
	defer rt.kvMu.Unlock()
	if v = rt.kv.Load(); v != nil && v.seq == seq {
		return v.keep
	}
	n := len(rt.bases)
	keep, k := make([]bool, n), 0
	limit, lowest := 1-rt.headroom, math.Inf(1)
	rt.kvBuf = rt.poller.AppendReadings(rt.kvBuf[:0])
	readings := rt.kvBuf
	// at is the index of a reading's endpoint, ok only for a usable one.
	at := func(r *saturation.PodReading) (int, bool) {
		i, ok := rt.byMetric[r.Endpoint]
		return i, ok && r.OK && r.Usable
	}
	for j := range readings {
		r := &readings[j]
		i, ok := at(r)
		if !ok {
			continue
		}
		lowest = min(lowest, r.KVUsage)
		if !keep[i] && r.KVUsage <= limit {
			keep[i] = true
			k++
		}
	}
	if k == 0 {
		// No endpoint has the headroom: keep those with the most free,
		// not all of them. A critical prompt waits at the head of a full
		// replica's queue until enough blocks free, and a replica with
		// more free gets there sooner.
		for j := range readings {
			if i, ok := at(&readings[j]); ok && !keep[i] && readings[j].KVUsage == lowest {
				keep[i] = true
				k++
			}
		}
	}
	v = &kvView{seq: seq}
	if k > 0 && k < n {
		v.keep = keep
	}
	rt.kv.Store(v)
	return v.keep
}
