// Package redisshare shares the in-flight view between gateway replicas
// through Redis, so that several replicas in front of one backend pool route
// as if they were one.
//
// # The problem
//
// Each replica knows only the requests it dispatched itself. Routing by
// least in-flight (or by max(scraped load, own in-flight)) then herds: every
// replica sees the same backend as emptiest at the last metrics scrape and
// sends its next requests there, and the in-flight credit
// max(0, own in-flight − scraped) silently becomes 0. Pool-wide in-flight
// counts restore what one gateway sees (see saturation/redisshare/README.md).
//
// # What is shared, and what is not
//
// Only one number per backend endpoint and replica: how many requests this
// replica has dispatched to that endpoint and not yet seen finish. Queues,
// bands, the dispatcher and admission stay local to each replica: sharing
// them would put Redis on the request path, and the dispatcher needs only
// the pool's load to pace its bands, which is exactly what the shared counts
// (with the scraped metrics) give it.
//
// # The model
//
// The request path touches memory only. A replica keeps, per endpoint, its
// own live count (Endpoint.Inc on dispatch, Dec on done: one atomic add) and
// the other replicas' sum as last fetched. InFlight returns own + others:
// two atomic loads, no lock, no allocation, no network round trip. A stale
// others is at most one Period (plus one slow sync's duration) old while
// Redis answers.
//
// One background loop (Run) syncs every Period with one Lua script (EVALSHA),
// one round trip, which Redis runs atomically:
//
//	TIME                                             Redis's clock: <ms>
//	HGET  {prefix}:replica:<id> ""                   who wrote this id's hash last (duplicate ids)
//	DEL   {prefix}:replica:<id>                      replace, so endpoints no longer held vanish
//	HSET  {prefix}:replica:<id> "" "<ms> <instance>" ep1 n1 ...   non-zero own counts, plus a heartbeat
//	PEXPIRE {prefix}:replica:<id> TTL-Period         liveness: a dead replica's hash expires
//	ZADD  {prefix}:replicas <ms> <id>                the directory of replica ids
//	ZREMRANGEBYSCORE / PEXPIRE {prefix}:replicas     trim ids silent for max(1 min, 10 TTL)
//	ZREVRANGE {prefix}:replicas 0 MaxPeers           who to read: the latest publishers
//	HLEN, HGETALL {prefix}:replica:<peer> ...        the peers the previous sync listed (a hash
//	                                                 of more than MaxEndpoints fields is skipped)
//
// plus, only when the directory lists a replica the previous sync did not,
// a second round trip reading the new hashes, so a new replica's first
// publish is visible to every other within one Period. The view is then the
// per-endpoint sum over the peers' hashes that exist (a missing hash is a
// dead or departed replica); endpoints nobody else holds read 0. A peer's
// count is clamped to MaxPeerCount and names past MaxEndpoints are left
// out, so a replica with write access to Redis weighs at most one
// replica's worth per endpoint and cannot grow the others' views.
//
// Why this layout: nothing shared depends on a replica's clock. Liveness
// is Redis's key expiry, and the directory's scores and trim are Redis's
// TIME read inside the script, so a replica whose clock is minutes off
// still sees and is seen by every peer. The directory is a sorted set read in
// the same script instead of a SCAN (which costs O(keyspace) and several
// round trips, and sees one shard of a Cluster); the hash is rewritten whole
// inside the script, so a reader never sees half of it. All keys share the
// hash tag {prefix} and are passed as KEYS, so the script is legal on Redis
// Cluster. A Sentinel failover to a server whose clock differs moves the
// directory's scores by that difference; the one-minute GC age absorbs
// small ones, and a replica trimmed by a large one re-adds itself at its
// next sync.
//
// # Duplicate replica ids
//
// Two live instances started with one ReplicaID would overwrite one hash
// every period, and the pool would silently undercount one of them. The
// heartbeat field holds each instance's token (host/pid/random), and the
// script returns what it found there before rewriting: when an instance
// whose own write succeeded before finds another's token, that other wrote
// in between. Both instances report it from their next sync on (chosen over
// refusing the second: an instance cannot tell, at its first sync, a live
// duplicate from a dead predecessor whose hash has not expired yet — a
// restarted StatefulSet pod keeps its name — so refusing would refuse every
// quick restart): Sync returns an error wrapping ErrDuplicateReplicaID that
// names the other instance, one error line is logged when it starts and one
// when it ends, and flowgate_shared_inflight_duplicate_id reads 1. The view
// itself stays up (the exchange worked), and an instance leaving never
// deletes a hash the other wrote last.
//
// The Redis work per sync grows with replicas × endpoints, so the pool's
// load on Redis grows with the square of the replica count (the cost per
// sync is in saturation/redisshare/README.md).
//
// # Time bounds
//
//   - A replica that dies (kill -9, partition) stops counting in every view
//     within TTL of its last publish (its hash expires TTL−Period after it,
//     and every peer reads within one more Period). A replica whose Run
//     returns deletes its hash and leaves at once.
//   - A live replica survives TTL−2·Period without a successful publish (GC
//     pause, throttling, Redis timeouts).
//   - When syncs fail (Redis down, slow, restarted, stopped), the replica
//     keeps serving the others' last-fetched counts until they are older
//     than TTL, then falls back to its own counts at the first failed sync
//     after that: State reports Down, the gauge flowgate_shared_inflight_up
//     reads 0, and one log line records the transition (and one more when a
//     sync succeeds again). Every sync is bounded by Timeout; failed ones
//     are retried with a wait doubling from Period to min(100 ms, TTL/4),
//     reconnecting as needed, so recovery follows Redis's return within
//     that wait. Nothing on the request path waits for any of it.
//   - go-redis logs each failed dial through its process-wide logger
//     (redis.SetLogger); the host decides whether to keep those lines.
//   - After a Redis restart the keys are gone; each replica rewrites its own
//     within one Period, so for that Period a view may miss some peers.
//   - A stalled Redis (SIGSTOP, a long fork) still holds the scripts of
//     syncs that timed out, and runs them when it resumes, in any order
//     relative to newer ones: a replica's hash may briefly hold older
//     counts until its next sync rewrites it (one Period), and a replica
//     that left during the stall may reappear until its hash expires (TTL).
//
// DefaultPeriod, DefaultTTL and DefaultTimeout give their reasons.
//
// # Two windows
//
// Both follow from the TTL and both are deliberate; an operator should know
// their size (saturation/redisshare/README.md has them measured):
//
//   - Phantom load (fails closed). A killed replica deletes nothing, so its
//     in-flight requests stay in every survivor's view until Redis expires
//     its hash and the survivor syncs next: about TTL (at least
//     TTL − 2·Period) after its last publish. The survivors see more load than there is, so
//     their gates err closed (they dispatch less). A replica that stops
//     cleanly (Run returning) deletes its hash and leaves at the others'
//     next sync.
//   - Frozen view (fails open). While Redis stalls, every sync times out and
//     the replica serves the others' counts as last fetched (a peer's change
//     during the stall is not seen) until they are TTL old, then falls back
//     to its own counts at the first failed sync after that. After the
//     fallback the replica sees less load than there is, so its gate errs
//     open (each replica alone keeps its own dispatches in check, as
//     without sharing). When Redis answers again the view is shared again
//     at the next sync.
//
// # The sync timeout
//
// The timeout is a deadline, not a wait: a sync that answers fast takes no
// longer for a long timeout. What must fit in it is not the round trip but
// the scheduling delay of the gateway and of Redis on a busy node. What a
// longer one costs is how stale the view may get while one sync is slow and
// how long Run's leave may take on the way out. Failures are counted in
// flowgate_shared_inflight_sync_errors_total (timeouts also in
// …_sync_timeouts_total) against …_syncs_total, and
// …_sync_duration_seconds against …_sync_timeout_seconds shows how close
// successful syncs come to it.
//
// # The client
//
// Give Options.Addr (one server, host:port) or Options.Redis (go-redis's
// UniversalOptions: one server, Sentinel with MasterName, or Cluster; TLS,
// username, password, DB) and the package creates a client tuned for the job
// (timeouts from Timeout, no retries, two connections per server) and
// closes it in Close. ParseURL builds Options.Redis from a redis:// or
// rediss:// URL with go-redis's own parser for the mode (standalone,
// sentinel, cluster). Give Options.Client instead for what those cannot
// express; it must have ContextTimeoutEnabled, or a stalled Redis holds the
// loop for the client's socket timeout. The script needs Redis 3.2 or
// later (it calls redis.replicate_commands where that exists, so that its
// writes may follow TIME).
package redisshare
