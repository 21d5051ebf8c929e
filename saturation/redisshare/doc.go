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
// max(0, own in-flight − scraped) silently becomes 0. In the simulator,
// codegen@16 critical TTFT p99 goes from 1.0 s with one gateway to 8–9 s with
// 2–8 independent ones; pool-wide in-flight counts bring it back.
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
// two atomic loads, no lock, no allocation, no network round trip (see
// BenchmarkInFlightRead). A stale others is at most one Period old while
// Redis answers.
//
// One background loop (Run) syncs every Period with one MULTI/EXEC
// transaction, one round trip:
//
//	DEL   {prefix}:replica:<id>                      replace, so endpoints no longer held vanish
//	HSET  {prefix}:replica:<id> "" <ms> ep1 n1 ...   non-zero own counts, plus a heartbeat field
//	PEXPIRE {prefix}:replica:<id> TTL-Period         liveness: a dead replica's hash expires
//	ZADD  {prefix}:replicas <ms> <id>                the directory of replica ids
//	ZREMRANGEBYSCORE / PEXPIRE {prefix}:replicas     trim ids silent for max(1 min, 10 TTL)
//	ZRANGE {prefix}:replicas 0 -1                    who to read
//	HGETALL {prefix}:replica:<peer> ...              the peers the previous sync listed
//
// plus, only when the directory lists a replica the previous sync did not,
// a second round trip reading the new hashes, so a new replica's first
// publish is visible to every other within one Period. The view is then the
// per-endpoint sum over the peers' hashes that exist (a missing hash is a
// dead or departed replica); endpoints nobody else holds read 0.
//
// Why this layout: liveness is Redis's key expiry, on the Redis server's
// clock, so clock skew between replicas cannot keep a dead replica counting;
// the directory is a sorted set read in the same transaction instead of a
// SCAN (which costs O(keyspace) and several round trips, and sees one shard
// of a Cluster); the hash is rewritten whole inside MULTI, so a reader never
// sees half of it. All keys share the hash tag {prefix}, so the transaction
// is legal on Redis Cluster.
//
// The Redis work per sync grows with replicas × endpoints, so the pool's
// load on Redis grows with the square of the replica count. Measured on the
// shared 2-core dev machine (BenchmarkSync, loopback, 10 runs): one sync
// seeing 7 peers of 4 endpoints each takes 114–172 µs and costs the server
// 45–68 µs of CPU, so 8 replicas at the default 5 ms keep about 8–11 % of
// one Redis core busy (2–3 % at 20 ms).
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
//     than TTL, then falls back to its own counts (at the first failed sync
//     after that, so within TTL + min(100 ms, TTL/4)): State reports Down, the
//     gauge flowgate_shared_inflight_up reads 0, and one log line records
//     the transition (and one more when a sync succeeds again). Every sync
//     is bounded by Timeout (< Period); failed ones are retried with a wait
//     doubling from Period to min(100 ms, TTL/4), reconnecting as needed,
//     so recovery follows Redis's return within that wait. Nothing on the
//     request path waits for any of it.
//   - go-redis logs each failed dial through its process-wide logger
//     (redis.SetLogger); the host decides whether to keep those lines.
//   - After a Redis restart the keys are gone; each replica rewrites its own
//     within one Period, so for that Period a view may miss some peers.
//   - A stalled Redis (SIGSTOP, a long fork) still holds the transactions
//     of syncs that timed out, and runs them when it resumes, in any order
//     relative to newer ones: a replica's hash may briefly hold older
//     counts until its next sync rewrites it (one Period), and a replica
//     that left during the stall may reappear until its hash expires (TTL).
//
// The defaults (Period 5 ms, TTL 1 s) are argued at DefaultPeriod and
// DefaultTTL.
//
// # The client
//
// Give Options.Addr and the package creates a client tuned for the job
// (timeouts equal to Timeout, no retries, two connections) and closes it in
// Close. Give Options.Client instead for TLS, auth, Sentinel or Cluster; it
// must have ContextTimeoutEnabled, or a stalled Redis holds the loop for the
// client's socket timeout.
package redisshare
