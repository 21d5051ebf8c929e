package redisshare

import (
	"errors"
	"strconv"
	"time"
)

// This file is the pure core of the shared view: parsing what a peer stored
// in Redis, summing the peers, and the staleness bookkeeping that decides
// whether the sum may still be served. It does no I/O and reads no clock, so
// the property tests drive it with injected time.

// heartbeatField is the hash field every replica writes on each publish, so a
// replica with nothing in flight still has a live key and counts as a peer.
// Its value is the writer's clock in Unix milliseconds, for humans reading
// Redis; liveness never depends on it (Redis's own key expiry decides, on
// Redis's clock, so clock skew between replicas cannot keep a dead one alive).
// The empty endpoint name is therefore reserved: it counts locally but is
// never published.
const heartbeatField = ""

// MaxCount is the largest per-endpoint count a peer may publish. A field
// above it (or negative, or not a decimal integer) is a corrupt or hostile
// value: it is ignored rather than allowed to dominate or overflow the sum.
const MaxCount = 1 << 32

var errBadCount = errors.New("redisshare: bad count")

// parseCount parses one count as stored by formatCount: a base-10 integer in
// [0, MaxCount], no sign, no spaces, no leading zeros beyond "0" itself.
// Strictness is cheap here and makes the stored form canonical, so a value
// that round-trips is exactly one a replica could have written.
func parseCount(s string) (int64, error) {
	if s == "" || len(s) > 10 || s[0] == '+' || s[0] == '-' || (s[0] == '0' && len(s) > 1) {
		return 0, errBadCount
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > MaxCount {
		return 0, errBadCount
	}
	return n, nil
}

// formatCount is the stored form of a count.
func formatCount(n int64) string { return strconv.FormatInt(n, 10) }

// parseSnapshot turns one peer's hash (field = endpoint, value = count, plus
// the heartbeat) into counts. Bad fields are skipped and counted in bad; zero
// counts are dropped (a writer never stores them, and dropping keeps the
// merged view sparse).
func parseSnapshot(h map[string]string) (counts map[string]int64, bad int) {
	counts = make(map[string]int64, len(h))
	for ep, v := range h {
		if ep == heartbeatField {
			continue
		}
		n, err := parseCount(v)
		if err != nil {
			bad++
			continue
		}
		if n > 0 {
			counts[ep] = n
		}
	}
	return counts, bad
}

// merge sums the peers' counts per endpoint. The caller passes only the
// other replicas (its own counts are served live from memory, never from
// Redis, so they are never stale and never counted twice). Each term is at
// most MaxCount, so the sum cannot overflow for fewer than 2^31 peers.
func merge(peers []map[string]int64) map[string]int64 {
	out := make(map[string]int64)
	for _, p := range peers {
		for ep, n := range p {
			out[ep] += n
		}
	}
	return out
}

// tracker is the staleness bookkeeping. The others' sum from the last good
// sync is served until it is older than ttl; after that the replica falls
// back to its own counts (others = 0) and reports itself down. A single
// failed sync does not drop the view: a value a few periods old is far better
// than none, and flapping between shared and local routing would itself herd.
type tracker struct {
	ttl    time.Duration
	lastOK time.Time // start of the last successful sync; zero before the first
	up     bool
	others map[string]int64 // what is being served; nil when down
}

// observe records the outcome of one sync that started at now. snaps is the
// peers' counts when err is nil. It returns the view to serve (nil means all
// zero), whether the view is up, and whether up changed.
//
// Freshness is measured from the start of the sync: the data read is at
// least that fresh, so this errs on the side of dropping stale data early.
func (t *tracker) observe(now time.Time, snaps []map[string]int64, err error) (others map[string]int64, up, changed bool) {
	was := t.up
	switch {
	case err == nil:
		t.lastOK = now
		t.others = merge(snaps)
		t.up = true
	case t.up && now.Sub(t.lastOK) > t.ttl:
		t.others = nil
		t.up = false
	}
	return t.others, t.up, t.up != was
}

// stop records that syncing stopped (Run returned): nothing will refresh the
// view any more, so it is dropped at once rather than served stale.
func (t *tracker) stop() (changed bool) {
	was := t.up
	t.others, t.up = nil, false
	return was
}
