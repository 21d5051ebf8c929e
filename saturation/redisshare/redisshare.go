package redisshare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrInvalidConfig is wrapped by every error New returns for bad Options;
// the message names the field.
var ErrInvalidConfig = errors.New("redisshare: invalid configuration")

// ErrRunning is returned by Run when the view is already running, and by
// Close while it is.
var ErrRunning = errors.New("redisshare: already running")

// ErrDuplicateReplicaID is wrapped by the error Sync returns when another
// live instance publishes under this replica's ReplicaID: both overwrite one
// hash, so the pool undercounts by one replica's requests until one of them
// is renamed. Each of the two reports it (Sync's error, one log line when it
// starts and one when it ends, the gauge flowgate_shared_inflight_duplicate_id
// and the counter flowgate_shared_inflight_duplicate_id_syncs_total); the
// sync itself succeeded, so the view stays up.
var ErrDuplicateReplicaID = errors.New("redisshare: duplicate replica id")

// Defaults of Options, each with its reason.
const (
	// DefaultPeriod is how often a replica publishes its counts and fetches
	// the others'. It is shorter than the gap between two arrivals at a
	// busy pool, so a dispatch is usually visible to every replica before
	// the next one anywhere, and shorter than the poller's metrics scrape
	// (saturation.DefaultInterval), so the shared view is the freshest
	// signal the router has. It costs one Redis round trip per replica per
	// period (two when a new replica appears).
	DefaultPeriod = 5 * time.Millisecond
	// DefaultTTL bounds how long a replica that stopped publishing (killed,
	// partitioned) keeps counting in the others' views, and how long a
	// replica serves the others' last-fetched counts when Redis is
	// unreachable before falling back to its own. It is many periods, so
	// a GC pause, a CPU-throttled container or a few timed-out syncs never
	// expire a live replica, while phantom load from a dead one lasts about
	// as long as one short request.
	DefaultTTL = time.Second
	// DefaultTimeout bounds one sync's round trips. It is not tied to
	// Period: syncs are serial, so a slow one only delays the next, and the
	// view stays up through failed ones for TTL anyway. It covers a loaded
	// node's scheduling delay, not just the round trip, so syncs on a busy
	// node do not fail (see saturation/redisshare/README.md).
	DefaultTimeout = 50 * time.Millisecond
	// DefaultPrefix is the Redis key prefix.
	DefaultPrefix = "flowgate:inflight"
	// DefaultMaxPeerCount is Options.MaxPeerCount's default: the
	// connections a gateway replica holds when it cannot read its
	// open-file limit (flowhttp.ServerConfig.MaxConns), each with at most
	// one request in flight.
	DefaultMaxPeerCount = 4096
	// DefaultMaxEndpoints is Options.MaxEndpoints' default, far above a
	// backend pool's size.
	DefaultMaxEndpoints = 1024
	// DefaultMaxPeers is Options.MaxPeers' default, far above a gateway's
	// replica count.
	DefaultMaxPeers = 256
)

// Options configures New. Set exactly one of Addr, Redis and Client, and
// ReplicaID.
type Options struct {
	// Addr is the Redis "host:port". New then creates and owns a client
	// tuned for this job (each sync bounded by its context deadline, no
	// retries: the next sync is the retry, at most two connections, no dial
	// circuit breaker in practice), and Close closes it.
	Addr string
	// Redis is the connection (one server, Sentinel with MasterName, or
	// Cluster; TLS, username, password, DB) of a client New creates and owns,
	// as Addr does. ParseURL builds it from a redis:// or rediss:// URL. New
	// works on a copy and overrides what this job needs tuned: the dial,
	// read and write timeouts, retries, pool sizes, ContextTimeoutEnabled,
	// client identity and maintenance notifications.
	Redis *redis.UniversalOptions
	// Client is an existing client, for settings Redis cannot express. The
	// caller owns it and closes it after Run returns. It must honour context
	// deadlines, or a stalled Redis stalls the sync loop for the client's
	// socket timeout: New rejects a *redis.Client,
	// *redis.ClusterClient or *redis.Ring whose ContextTimeoutEnabled is false.
	// All keys share one hash tag, so a Cluster keeps them on one shard.
	Client redis.UniversalClient
	// ReplicaID names this replica among all those sharing Prefix; it must be
	// unique (a pod name, a hostname plus a random suffix). Two live
	// replicas with one id overwrite each other's counts; both then report
	// it (ErrDuplicateReplicaID). Required; at most 256 bytes.
	ReplicaID string
	// Prefix scopes the keys: several independent pools can share one Redis
	// under different prefixes. It must not contain '{' or '}' (it becomes the
	// Cluster hash tag). Empty means DefaultPrefix.
	Prefix string
	// Period is the time between two syncs (publish own counts, fetch the
	// others'). 0 means DefaultPeriod.
	Period time.Duration
	// TTL is the longest a replica that stopped publishing keeps counting in
	// the others' views, and how long this replica serves the others'
	// last-fetched counts while Redis fails (dropped at the first failed
	// sync past TTL). At least 4 Periods, so a live replica survives a few
	// failed syncs. 0 means DefaultTTL.
	TTL time.Duration
	// Timeout bounds one sync's Redis calls together (its one or two round
	// trips, and a reconnection). Syncs are serial: one that takes longer
	// than Period delays the next rather than overlapping it. Must be
	// positive and at most TTL/4, so several syncs fit in a TTL. 0 means
	// DefaultTimeout, capped at TTL/4. While syncs fail, Run stretches the
	// wait between them, and the timeout with it when the wait grows
	// beyond it (see Run).
	Timeout time.Duration
	// Logger receives one line per transition between the shared view and
	// the fallback to own counts. Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for the staleness bookkeeping (the TTL of the
	// others' counts): only differences between two of its readings matter,
	// so its offset from other replicas' clocks does not. Nil means time.Now.
	// Everything shared runs on the Redis server's clock: key expiry, and
	// the directory of replicas, which a server-side script scores with
	// Redis's TIME.
	Now func() time.Time
	// MaxPeerCount is the most requests one other replica is believed to
	// hold in flight to one endpoint: a larger count read from Redis is
	// clamped to it (and counted in flowgate_shared_inflight_refused_total,
	// reason "count"), so one corrupt or hostile field weighs at most one
	// replica's worth. 0 means DefaultMaxPeerCount; at most MaxCount.
	MaxPeerCount int64
	// MaxEndpoints bounds the endpoint names the view holds: a name only
	// the other replicas publish is taken while fewer than MaxEndpoints
	// are known, and a peer's hash with more fields than that is not read
	// (reasons "name" and "hash"). The names this replica holds a handle
	// for (Endpoint) are always taken: make the backends' handles before
	// Run, so hostile names cannot crowd them out. 0 means
	// DefaultMaxEndpoints.
	MaxEndpoints int
	// MaxPeers bounds the other replicas read per sync: the MaxPeers that
	// published last (reason "peer" for each one left out). 0 means
	// DefaultMaxPeers.
	MaxPeers int
}

// State says whether the others' counts are being served.
type State int

const (
	// Down: InFlight serves this replica's own counts only, because no sync
	// has succeeded yet, the last success is older than TTL, or Run returned.
	Down State = iota
	// Up: InFlight serves own counts plus the others' from a sync younger
	// than TTL.
	Up
)

// String returns "down" or "up".
func (s State) String() string {
	if s == Up {
		return "up"
	}
	return "down"
}

// InFlight is the pool-wide in-flight view of one gateway replica: its own
// live counts per endpoint plus the other replicas' counts fetched from
// Redis. The request-path methods (Endpoint handles, Add, Inc, Dec,
// InFlight) touch memory only: atomic operations, and once an endpoint is
// known no lock and no allocation; never the network. Run does all Redis I/O in one
// background goroutine. Safe for concurrent use. Create it with New.
type InFlight struct {
	client     redis.UniversalClient
	ownClient  bool
	id         string
	key        string // this replica's hash: keyBase + id
	keyBase    string // "{prefix}:replica:"
	members    string // sorted set of replica ids, score = last publish (Redis's clock, ms)
	instance   string // this process's token in the heartbeat, to tell a duplicate id
	period     time.Duration
	ttl        time.Duration
	timeout    time.Duration
	expiry     time.Duration // PEXPIRE of the hash: TTL - Period (see New)
	gcAge      time.Duration // members older than this leave the sorted set
	maxBackoff time.Duration // longest wait between failed syncs
	log        *slog.Logger
	now        func() time.Time
	maxCount   int64 // Options.MaxPeerCount
	maxNames   int   // Options.MaxEndpoints
	maxPeers   int   // Options.MaxPeers

	// eps is copy-on-write: readers load the pointer and look up without a
	// lock; the rare insertion of a new endpoint copies the map under mu.
	// Endpoints are never removed, so a handle stays valid for the life of
	// the InFlight (memory grows with the number of distinct names ever
	// seen, which for a backend pool is its size).
	mu  sync.Mutex
	eps atomic.Pointer[map[string]*Endpoint]

	syncMu    sync.Mutex // one sync at a time; guards tr, known, published and dupWith
	tr        tracker
	known     []string // peer ids from the last sync's member list
	published bool     // a sync of this InFlight has succeeded: its hash was written
	dupWith   string   // the other instance seen under this id at the last sync, "" if none

	running atomic.Bool
	up      atomic.Bool
	peers   atomic.Int64

	syncs, syncErrors, badFields, underflows atomic.Int64
	syncTimeouts, dupSyncs                   atomic.Int64
	// refused counts what a sync did not take from Redis, by reason:
	// counts clamped, names, hashes, peers (refusedReasons' order).
	refused     [4]atomic.Int64
	dup         atomic.Bool
	syncSeconds histogram
}

// Endpoint is one backend endpoint's counts, a handle the request path keeps
// so it never looks the name up. Its methods are single atomic operations.
// Endpoint satisfies interface{ Inc(); Dec() }.
type Endpoint struct {
	name   string
	parent *InFlight
	// own is this replica's live count; the request path writes it. others
	// is the other replicas' sum from the last good sync; only the sync loop
	// writes it. They are separate atomics and read one after the other, so
	// InFlight may pair a newer own with an older others: harmless, others
	// is a period-old estimate by construction, and each load is whole.
	own    atomic.Int64
	others atomic.Int64
}

// New validates opts and returns a view in state Down with no counts. It
// does not contact Redis; Run (or Sync) does. Errors wrap ErrInvalidConfig
// and name the field.
func New(opts Options) (*InFlight, error) {
	bad := func(format string, a ...any) (*InFlight, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	set := 0
	for _, b := range []bool{opts.Addr != "", opts.Redis != nil, opts.Client != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		return bad("set exactly one of Options.Addr, Options.Redis and Options.Client")
	}
	if opts.Redis != nil && len(opts.Redis.Addrs) == 0 {
		return bad("Options.Redis.Addrs is empty")
	}
	if opts.Client != nil && !honoursContext(opts.Client) {
		return bad("Options.Client must have ContextTimeoutEnabled set, or a stalled Redis stalls the sync loop for the socket timeout")
	}
	if opts.ReplicaID == "" || len(opts.ReplicaID) > 256 {
		return bad("Options.ReplicaID must be 1 to 256 bytes, got %d", len(opts.ReplicaID))
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return bad("Options.Prefix must not contain '{' or '}', got %q", opts.Prefix)
	}
	if opts.Period == 0 {
		opts.Period = DefaultPeriod
	}
	if opts.Period < time.Millisecond {
		return bad("Options.Period must be >= 1ms, got %v", opts.Period)
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL < 4*opts.Period {
		return bad("Options.TTL must be >= 4 Periods (%v), got %v", 4*opts.Period, opts.TTL)
	}
	if opts.Timeout == 0 {
		opts.Timeout = min(DefaultTimeout, opts.TTL/4)
	}
	if opts.Timeout <= 0 || opts.Timeout > opts.TTL/4 {
		return bad("Options.Timeout must be > 0 and <= TTL/4 (%v), got %v", opts.TTL/4, opts.Timeout)
	}
	switch {
	case opts.MaxPeerCount == 0:
		opts.MaxPeerCount = DefaultMaxPeerCount
	case opts.MaxPeerCount < 0 || opts.MaxPeerCount > MaxCount:
		return bad("Options.MaxPeerCount must be in [0, %d], got %d", int64(MaxCount), opts.MaxPeerCount)
	}
	if opts.MaxEndpoints == 0 {
		opts.MaxEndpoints = DefaultMaxEndpoints
	}
	if opts.MaxPeers == 0 {
		opts.MaxPeers = DefaultMaxPeers
	}
	if opts.MaxEndpoints < 0 || opts.MaxPeers < 0 {
		return bad("Options.MaxEndpoints and MaxPeers must be ≥ 0, got %d and %d", opts.MaxEndpoints, opts.MaxPeers)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	tag := "{" + opts.Prefix + "}"
	s := &InFlight{
		client:   opts.Client,
		id:       opts.ReplicaID,
		key:      tag + ":replica:" + opts.ReplicaID,
		keyBase:  tag + ":replica:",
		members:  tag + ":replicas",
		instance: newInstance(),
		period:   opts.Period,
		ttl:      opts.TTL,
		timeout:  opts.Timeout,
		// A peer fetches every Period, so a hash that expires Period before
		// TTL has left every view within TTL of the writer's last publish
		// (plus one round trip). A live writer renews it every Period, so it
		// survives TTL - 2 Periods without a successful publish.
		expiry: opts.TTL - opts.Period,
		// The member list is only a directory (liveness is the hash's
		// expiry); ids leave it long after their hash has expired. Its
		// scores are Redis's clock, so replica clocks play no part; the
		// margin is for a Sentinel failover to a server whose clock differs.
		gcAge: max(time.Minute, 10*opts.TTL),
		// Failed syncs back off up to this: recovery after Redis returns
		// takes at most this long, and it leaves several retries within TTL.
		maxBackoff: max(opts.Period, min(100*time.Millisecond, opts.TTL/4)),
		log:        opts.Logger,
		now:        opts.Now,
		maxCount:   opts.MaxPeerCount,
		maxNames:   opts.MaxEndpoints,
		maxPeers:   opts.MaxPeers,
		tr:         tracker{ttl: opts.TTL},
	}
	if opts.Client == nil {
		u := &redis.UniversalOptions{Addrs: []string{opts.Addr}}
		if opts.Redis != nil {
			c := *opts.Redis // a copy: the caller's options are left as given
			u = &c
		}
		s.client = redis.NewUniversalClient(s.tune(u))
		s.ownClient = true
	}
	empty := map[string]*Endpoint{}
	s.eps.Store(&empty)
	return s, nil
}

// honoursContext reports whether c applies context deadlines to socket I/O,
// for the client types that say so; other implementations are trusted.
func honoursContext(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Endpoint returns the handle for name, creating it (at 0) on first use.
// Keep the handle: its methods skip the name lookup. The empty name is
// reserved (it counts locally but is never published).
func (s *InFlight) Endpoint(name string) *Endpoint {
	if e := (*s.eps.Load())[name]; e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.eps.Load()
	if e := old[name]; e != nil {
		return e
	}
	e := &Endpoint{name: name, parent: s}
	next := make(map[string]*Endpoint, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = e
	s.eps.Store(&next)
	return e
}

// Add changes this replica's count for endpoint by delta (see Endpoint.Add).
func (s *InFlight) Add(endpoint string, delta int64) { s.Endpoint(endpoint).Add(delta) }

// Inc records one request dispatched to endpoint by this replica.
func (s *InFlight) Inc(endpoint string) { s.Endpoint(endpoint).Add(1) }

// Dec records one request to endpoint finished (see Endpoint.Dec).
func (s *InFlight) Dec(endpoint string) { s.Endpoint(endpoint).Add(-1) }

// InFlight returns the pool-wide in-flight count for endpoint: this
// replica's live count plus the others' last-fetched sum (0 while Down).
// An unknown endpoint reads 0 and is not created.
func (s *InFlight) InFlight(endpoint string) int64 {
	if e := (*s.eps.Load())[endpoint]; e != nil {
		return e.InFlight()
	}
	return 0
}

// Endpoints returns the names known to this replica (its own and those
// fetched from the others), sorted.
func (s *InFlight) Endpoints() []string {
	m := *s.eps.Load()
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// State reports whether the others' counts are being served.
func (s *InFlight) State() State {
	if s.up.Load() {
		return Up
	}
	return Down
}

// Peers returns how many other live replicas the last good sync saw (0
// while Down).
func (s *InFlight) Peers() int { return int(s.peers.Load()) }

// Underflows returns how many decrements found the count too low and were
// clamped at 0: a caller finishing requests it never started.
func (s *InFlight) Underflows() int64 { return s.underflows.Load() }

// ReplicaID returns the id this replica publishes under.
func (s *InFlight) ReplicaID() string { return s.id }

// Name returns the endpoint's name.
func (e *Endpoint) Name() string { return e.name }

// Inc records one request dispatched to this endpoint by this replica.
func (e *Endpoint) Inc() { e.own.Add(1) }

// Dec records one request finished. A Dec at 0 is ignored and counted in
// Underflows: a negative count would be published and make the endpoint look
// emptier than it is to every replica.
func (e *Endpoint) Dec() { e.Add(-1) }

// Add changes this replica's count by delta, clamping at 0 (a clamp counts
// one underflow).
func (e *Endpoint) Add(delta int64) {
	if delta >= 0 {
		e.own.Add(delta)
		return
	}
	for {
		c := e.own.Load()
		n := c + delta
		if n < 0 {
			n = 0
		}
		if e.own.CompareAndSwap(c, n) {
			if c+delta < 0 {
				e.parent.underflows.Add(1)
			}
			return
		}
	}
}

// Own returns this replica's live count.
func (e *Endpoint) Own() int64 { return e.own.Load() }

// Others returns the other replicas' sum from the last good sync (0 while
// Down).
func (e *Endpoint) Others() int64 { return e.others.Load() }

// InFlight returns Own + Others: two atomic loads.
func (e *Endpoint) InFlight() int64 { return e.own.Load() + e.others.Load() }

// Run syncs every Period until ctx is done, then returns ctx.Err(). The
// first sync starts at once. Errors never stop it: while Redis fails it
// keeps retrying, reconnecting as needed, with the wait doubling from Period
// up to min(100 ms, TTL/4) (never below Period) and the timeout growing in
// proportion, and the view falls back to own counts once the last success is
// older than TTL. The first success restores Period and Timeout. On return it
// removes this replica's key (best effort, so the others drop it at once
// rather than after TTL) and drops the others' counts (state Down): nothing
// refreshes them any more. It fails with ErrRunning if already running.
func (s *InFlight) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	defer s.leave(ctx)
	t := time.NewTimer(0)
	defer t.Stop()
	wait, timeout := s.period, s.timeout
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		begin := time.Now()
		// Outcomes are in State, the log and the metrics. A duplicate id
		// is not a failed exchange: retrying sooner or later changes
		// nothing, so it keeps the period.
		if err := s.sync(ctx, timeout); err == nil || errors.Is(err, ErrDuplicateReplicaID) {
			wait, timeout = s.period, s.timeout
		} else {
			// Back off exponentially to maxBackoff: N replicas retrying
			// every 5 ms against a restarting Redis would be a reconnect
			// storm, and go-redis logs every failed dial. The timeout grows
			// with the wait once the wait exceeds it: a failed sync costs
			// the next one a dial and a handshake on top of the script,
			// and on a loaded machine a timeout sized for the steady state
			// could fail that every time.
			wait = min(2*wait, s.maxBackoff)
			timeout = s.timeoutFor(wait)
		}
		t.Reset(max(0, wait-time.Since(begin)))
	}
}

// timeoutFor is the sync timeout when the wait between syncs is wait:
// Timeout, or 4/5 of the wait when that is longer.
func (s *InFlight) timeoutFor(wait time.Duration) time.Duration {
	return max(s.timeout, wait*4/5)
}

// Close closes the client New created from Options.Addr (a caller's Client
// is left open). Call it after Run has returned; it fails with ErrRunning
// otherwise.
func (s *InFlight) Close() error {
	if s.running.Load() {
		return ErrRunning
	}
	if s.ownClient {
		return s.client.Close()
	}
	return nil
}

// leave deletes this replica's key and drops the shared view.
func (s *InFlight) leave(ctx context.Context) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	_ = leaveScript.Run(lctx, s.client, []string{s.key, s.members}, s.id, s.instance).Err()
	cancel()
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	changed := s.tr.stop()
	s.apply(nil)
	s.up.Store(false)
	s.peers.Store(0)
	if changed {
		s.log.Info("redisshare: shared in-flight view stopped; routing on this replica's own counts",
			"replica", s.id)
	}
}

// Sync runs one cycle now: publish this replica's counts, fetch the others',
// update the view. Run calls it every Period; tests and simulations may call
// it directly instead of Run. It returns the Redis error, if any; the view
// already reflects it (kept until stale beyond TTL, then dropped). After a
// successful exchange it returns an error wrapping ErrDuplicateReplicaID when
// another live instance publishes under this ReplicaID; the view is updated
// all the same.
func (s *InFlight) Sync(ctx context.Context) error { return s.sync(ctx, s.timeout) }

// sync is Sync with the Redis calls bounded by timeout.
func (s *InFlight) sync(ctx context.Context, timeout time.Duration) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	start := s.now()
	// The duration metric is real elapsed time, whatever clock the
	// staleness bookkeeping was given.
	began := time.Now()
	snaps, prevInstance, err := s.exchange(ctx, timeout)
	s.syncSeconds.observe(time.Since(began))
	s.syncs.Add(1)
	if err != nil {
		s.syncErrors.Add(1)
		if isTimeout(err) {
			s.syncTimeouts.Add(1)
		}
	}
	was := s.tr.lastOK
	others, up, changed := s.tr.observe(start, snaps, err)
	if err == nil || changed {
		s.apply(others)
	}
	s.up.Store(up)
	if err == nil {
		s.peers.Store(int64(len(snaps)))
	} else if !up {
		s.peers.Store(0)
	}
	switch {
	case changed && up:
		s.log.Info("redisshare: shared in-flight view up", "replica", s.id, "peers", len(snaps))
	case changed:
		s.log.Warn("redisshare: shared in-flight view down; routing on this replica's own counts",
			"replica", s.id, "err", err, "last_sync_age", start.Sub(was))
	}
	if err != nil {
		return err
	}
	return s.checkDuplicate(prevInstance)
}

// checkDuplicate judges what this sync's script found in this replica's
// hash before rewriting it. Another instance's token there, after a sync of
// this one has succeeded, means it wrote under this id in between: a live
// duplicate. Before this instance's first success the hash may be a dead
// predecessor's (a restarted pod keeps its name) that has not expired yet,
// so that is not judged; a live duplicate is caught one sync later, by
// both. A missing hash (expired during an outage, or Redis restarted) is
// not a duplicate either.
func (s *InFlight) checkDuplicate(prevInstance string) error {
	other := ""
	if s.published && prevInstance != "" && prevInstance != s.instance {
		other = prevInstance
	}
	s.published = true
	was := s.dupWith
	s.dupWith = other
	s.dup.Store(other != "")
	switch {
	case other != "" && was == "":
		s.log.Error("redisshare: duplicate replica id: another instance publishes under this id, so both overwrite one hash and the pool undercounts; give each replica a unique id",
			"replica", s.id, "instance", s.instance, "other_instance", other)
	case other == "" && was != "":
		s.log.Info("redisshare: duplicate replica id resolved: only this instance publishes under it",
			"replica", s.id, "instance", s.instance)
	}
	if other == "" {
		return nil
	}
	s.dupSyncs.Add(1)
	return fmt.Errorf("%w %q: instance %s also publishes under it (this one is %s)", ErrDuplicateReplicaID, s.id, other, s.instance)
}

// apply stores the others' sums into the endpoints: absent names read 0 (an
// endpoint nobody else holds goes to 0), names only the others know are
// created so InFlight finds them.
func (s *InFlight) apply(others map[string]int64) {
	m := *s.eps.Load()
	for name := range others {
		if m[name] == nil {
			s.Endpoint(name)
		}
	}
	for name, e := range *s.eps.Load() {
		e.others.Store(others[name])
	}
}

func (s *InFlight) peerKey(id string) string { return s.keyBase + id }
