package redisshare

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// dupLines counts the replica's duplicate-id log lines: started, resolved.
func dupLines(r *replica) (started, resolved int) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	for _, m := range r.log.msgs {
		switch {
		case strings.HasPrefix(m, "redisshare: duplicate replica id:"):
			started++
		case strings.HasPrefix(m, "redisshare: duplicate replica id resolved"):
			resolved++
		}
	}
	return started, resolved
}

// TestDuplicateReplicaIDBothReport: two live replicas started with one id,
// against a real redis-server, syncs driven by hand. Both report the
// conflict (Sync's error, the gauge, one log line each however long it
// lasts) from their first sync after the other wrote; the view stays up;
// once one stops, the other reports it resolved after one more sync.
// Before, both silently overwrote one hash every period.
func TestDuplicateReplicaIDBothReport(t *testing.T) {
	srv := startRedis(t)
	a, b := newSyncedReplica(t, srv.Addr(), "gw-0"), newSyncedReplica(t, srv.Addr(), "gw-0")
	peer := newSyncedReplica(t, srv.Addr(), "gw-1")
	peer.Add("x", 5)
	ctx := context.Background()
	require.NoError(t, peer.Sync(ctx))
	require.NoError(t, a.Sync(ctx))
	// b's first sync finds a's hash, but cannot tell a live duplicate from
	// a dead predecessor whose hash has not expired: it does not judge.
	require.NoError(t, b.Sync(ctx))
	for range 3 {
		for _, r := range []*replica{a, b} {
			err := r.Sync(ctx)
			require.ErrorIs(t, err, ErrDuplicateReplicaID, r.instance)
			require.Contains(t, err.Error(), `"gw-0"`)
			other := a.instance
			if r == a {
				other = b.instance
			}
			require.Contains(t, err.Error(), other, "the error names the other instance")
			require.Equal(t, 1.0, r.gauge(t, "flowgate_shared_inflight_duplicate_id"))
			require.Equal(t, Up, r.State(), "the exchange worked: the view stays up")
			require.Equal(t, int64(5), r.InFlight("x"))
		}
	}
	for _, r := range []*replica{a, b} {
		require.Equal(t, 3.0, r.gauge(t, "flowgate_shared_inflight_duplicate_id_syncs_total"))
		require.Zero(t, r.gauge(t, "flowgate_shared_inflight_sync_errors_total"), "a duplicate is not a failed sync")
		started, resolved := dupLines(r)
		require.Equal(t, [2]int{1, 0}, [2]int{started, resolved}, "one log line when it starts")
	}
	// The peer sees one replica under the id (the hash is whoever wrote last).
	require.NoError(t, peer.Sync(ctx))
	require.Equal(t, 1, peer.Peers())

	// b stops syncing: a's next sync still finds b's write, the one after
	// finds its own and clears.
	require.ErrorIs(t, a.Sync(ctx), ErrDuplicateReplicaID)
	require.NoError(t, a.Sync(ctx))
	require.Equal(t, 0.0, a.gauge(t, "flowgate_shared_inflight_duplicate_id"))
	started, resolved := dupLines(a)
	require.Equal(t, [2]int{1, 1}, [2]int{started, resolved})
}

// TestRestartedReplicaIsNotADuplicate: a replica that died without leaving
// (its hash not yet expired) and its successor under the same id, as a
// restarted StatefulSet pod keeps its name: the successor reports nothing.
func TestRestartedReplicaIsNotADuplicate(t *testing.T) {
	srv := startRedis(t)
	dead := newSyncedReplica(t, srv.Addr(), "gw-0")
	dead.Add("x", 3)
	ctx := context.Background()
	require.NoError(t, dead.Sync(ctx)) // and never again: killed
	next := newSyncedReplica(t, srv.Addr(), "gw-0")
	for range 3 {
		require.NoError(t, next.Sync(ctx))
	}
	require.Equal(t, 0.0, next.gauge(t, "flowgate_shared_inflight_duplicate_id"))
	started, _ := dupLines(next)
	require.Zero(t, started)
}

// TestDuplicateLeavingKeepsTheOthersHash: a duplicate that stops must not
// delete the hash the other live instance wrote last (that would take its
// counts out of every view); the last writer's leaving deletes it.
func TestDuplicateLeavingKeepsTheOthersHash(t *testing.T) {
	srv := startRedis(t)
	a, b := newSyncedReplica(t, srv.Addr(), "gw-0"), newSyncedReplica(t, srv.Addr(), "gw-0")
	ctx := context.Background()
	require.NoError(t, a.Sync(ctx))
	require.NoError(t, b.Sync(ctx)) // b wrote last
	raw := rawClient(t, srv.Addr())
	a.leave(ctx)
	n, err := raw.Exists(ctx, a.key).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "a deleted the hash b wrote")
	_, err = raw.ZScore(ctx, a.members, "gw-0").Result()
	require.NoError(t, err, "a removed the id b still publishes under")
	b.leave(ctx)
	n, err = raw.Exists(ctx, a.key).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the last writer's leaving deletes the hash")
}
