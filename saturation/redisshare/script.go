package redisshare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncScript is one sync's writes and reads, run by Redis in one round trip
// and atomically (a reader never sees half of a hash). Everything that
// involves time runs on Redis's clock (TIME), so replica clocks play no
// part: the directory's scores and its trim, like the key expiry.
//
//	KEYS[1]   this replica's hash        ARGV[1] replica id
//	KEYS[2]   the directory (sorted set) ARGV[2] this instance's token
//	KEYS[3..] the peers' hashes to read  ARGV[3] hash expiry (ms)
//	                                     ARGV[4] directory GC age (ms)
//	                                     ARGV[5] most ids listed (MaxPeers + 1: this one)
//	                                     ARGV[6] most fields read per hash
//	                                     ARGV[7..] endpoint, count pairs
//
// It returns {previous heartbeat or "", directory ids (the most recent
// publishers first), {peer hash...}, directory size, hashes not read}: a
// hash with more than ARGV[6] fields is answered empty. The
// heartbeat field "" holds "<Redis ms> <instance token>": the token read
// before the rewrite tells whether another instance wrote under this id
// since this one's last sync. All keys share one hash tag, so the script is
// legal on Redis Cluster. redis.replicate_commands lets Redis 3.2–4 accept
// writes after TIME (Redis 5 and later replicate effects anyway).
var syncScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowStr = string.format('%d', now)
local prev = redis.call('HGET', KEYS[1], '')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '', nowStr .. ' ' .. ARGV[2])
for i = 7, #ARGV, 400 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 399, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], nowStr, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', now - tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local dir = redis.call('ZREVRANGE', KEYS[2], 0, tonumber(ARGV[5]) - 1)
local ndir = redis.call('ZCARD', KEYS[2])
local hashes, big = {}, 0
local most = tonumber(ARGV[6])
` + readHashes(3) + `return {prev or '', dir, hashes, ndir, big}
`)

// readScript reads the hashes KEYS, each only if it has at most ARGV[1]
// fields (else it is answered empty), and returns {{hash...}, hashes not
// read}: the second round trip of a sync that found new peers.
var readScript = redis.NewScript(`
local hashes, big = {}, 0
local most = tonumber(ARGV[1])
` + readHashes(1) + `return {hashes, big}
`)

// leaveScript deletes this replica's hash and directory entry, unless
// another instance wrote the hash last (a duplicate id): deleting it would
// take a live replica's counts out of every view. KEYS as syncScript's;
// ARGV[1] the id, ARGV[2] the instance token.
var leaveScript = redis.NewScript(`
local hb = redis.call('HGET', KEYS[1], '')
if hb and string.sub(hb, -string.len(ARGV[2]) - 1) ~= ' ' .. ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
`)

// newInstance is this process's token in the heartbeat: host, pid and 48
// random bits, so that a duplicate id's log line says where the other one
// runs, and two instances in one process (tests) still differ.
func newInstance() string {
	host, _ := os.Hostname()
	if len(host) > 64 {
		host = host[:64]
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' {
			return '_'
		}
		return r
	}, host)
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// heartbeatInstance is the instance token of a heartbeat value ("" for none;
// the whole value for a writer that stored only its clock, as versions
// before the token did).
func heartbeatInstance(hb string) string {
	if _, inst, ok := strings.Cut(hb, " "); ok {
		return inst
	}
	return hb
}

// exchange is one sync's Redis traffic: syncScript (one round trip) plus,
// only when the directory lists peers the previous sync did not, a second
// round trip reading their hashes, so a new replica is visible within one
// period of its first publish. Both share one timeout. prevInstance is the
// instance that wrote this replica's hash before this sync ("" if none).
func (s *InFlight) exchange(ctx context.Context, timeout time.Duration) (snaps []map[string]int64, prevInstance string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	known := s.known
	keys := make([]string, 0, 2+len(known))
	keys = append(keys, s.key, s.members)
	for _, id := range known {
		keys = append(keys, s.peerKey(id))
	}
	// Fields per hash: the endpoints and the heartbeat.
	mostFields := s.maxNames + 1
	args := []any{s.id, s.instance, s.expiry.Milliseconds(), s.gcAge.Milliseconds(), s.maxPeers + 1, mostFields}
	for name, e := range *s.eps.Load() {
		if n := e.own.Load(); n > 0 && name != heartbeatField {
			args = append(args, name, formatCount(min(n, MaxCount)))
		}
	}
	res, err := syncScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return nil, "", err
	}
	if len(res) != 5 {
		return nil, "", fmt.Errorf("redisshare: sync script answered %d values, want 5", len(res))
	}
	prev, _ := res[0].(string)
	ids := stringsOf(res[1])
	if n, _ := res[3].(int64); n > int64(len(ids)) {
		s.refused[refusedPeer].Add(n - int64(len(ids)))
	}
	big, _ := res[4].(int64)
	// The names this sync takes: those this replica knows, and new ones
	// while fewer than maxNames are known.
	local := *s.eps.Load()
	taken := map[string]bool{}
	room := s.maxNames - len(local)
	add := func(h map[string]string) {
		if len(h) == 0 { // expired (dead), deleted (left) or too large
			return
		}
		counts, bad := parseSnapshot(h)
		s.badFields.Add(int64(bad))
		for name, n := range counts {
			if local[name] == nil && !taken[name] {
				if room <= 0 {
					delete(counts, name)
					s.refused[refusedName].Add(1)
					continue
				}
				taken[name] = true
				room--
			}
			if n > s.maxCount {
				counts[name] = s.maxCount
				s.refused[refusedCount].Add(1)
			}
		}
		snaps = append(snaps, counts)
	}
	hashes, _ := res[2].([]any)
	for _, h := range hashes {
		add(pairsOf(h))
	}
	var fresh []string
	next := make([]string, 0, len(ids))
	for _, id := range ids {
		if id == s.id {
			continue
		}
		next = append(next, id)
		if !slices.Contains(known, id) {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) > 0 {
		keys := make([]string, len(fresh))
		for i, id := range fresh {
			keys[i] = s.peerKey(id)
		}
		more, err := readScript.Run(ctx, s.client, keys, mostFields).Slice()
		if err != nil {
			// Keep s.known: the fresh ids are retried next sync.
			return nil, "", err
		}
		if len(more) != 2 {
			return nil, "", fmt.Errorf("redisshare: read script answered %d values, want 2", len(more))
		}
		hashes, _ := more[0].([]any)
		for _, h := range hashes {
			add(pairsOf(h))
		}
		n, _ := more[1].(int64)
		big += n
	}
	s.refused[refusedHash].Add(big)
	s.known = next
	return snaps, heartbeatInstance(prev), nil
}

// stringsOf is a script's array of strings (non-strings skipped).
func stringsOf(v any) []string {
	a, _ := v.([]any)
	out := make([]string, 0, len(a))
	for _, x := range a {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// pairsOf is an HGETALL as a script returns it (a flat field, value array).
func pairsOf(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		m[k] = val
	}
	return m
}

// isTimeout reports whether a sync failed on its deadline (rather than a
// refused connection or an error answer).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// syncBuckets are the upper bounds of the sync duration histogram, in
// seconds: from a loopback round trip to past the longest backoff timeout.
var syncBuckets = []float64{0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024}

// histogram is a lock-free fixed-bucket histogram for the collector.
type histogram struct {
	counts [13]atomic.Int64 // len(syncBuckets)+1: the last is +Inf
	sumNs  atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	sec := d.Seconds()
	i, _ := slices.BinarySearch(syncBuckets, sec)
	h.counts[i].Add(1)
	h.sumNs.Add(int64(d))
}

// snapshot returns the cumulative bucket counts, the count and the sum.
func (h *histogram) snapshot() (buckets map[float64]uint64, count uint64, sum float64) {
	buckets = make(map[float64]uint64, len(syncBuckets))
	var c uint64
	for i, ub := range syncBuckets {
		c += uint64(h.counts[i].Load())
		buckets[ub] = c
	}
	c += uint64(h.counts[len(syncBuckets)].Load())
	return buckets, c, float64(h.sumNs.Load()) / 1e9
}

// readHashes is the Lua loop both scripts read peers' hashes with: from
// KEYS[first] on, each hash of at most most fields into hashes, a larger one
// answered empty and counted in big (its owner is refused, not read).
func readHashes(first int) string {
	return "for i = " + strconv.Itoa(first) + `, #KEYS do
  if redis.call('HLEN', KEYS[i]) > most then
    hashes[#hashes + 1] = {}
    big = big + 1
  else
    hashes[#hashes + 1] = redis.call('HGETALL', KEYS[i])
  end
end
`
}
