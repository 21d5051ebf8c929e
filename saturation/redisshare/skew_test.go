package redisshare

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// newReplicaWith returns a replica built from opts (Logger and, unless set,
// Period/TTL/Timeout filled with newSyncedReplica's generous timing), its
// client closed in t.Cleanup.
func newReplicaWith(t *testing.T, opts Options) *replica {
	t.Helper()
	if opts.Period == 0 {
		opts.Period = 500 * time.Millisecond
	}
	if opts.TTL == 0 {
		opts.TTL = 4 * opts.Period
	}
	if opts.Timeout == 0 {
		opts.Timeout = opts.TTL / 4 // generous: syncs are driven by hand
	}
	return startReplica(t, opts)
}

// skewed is a clock offset from the real one by d.
func skewed(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// TestClockSkewDoesNotHideReplicas: three replicas whose clocks are right, 2
// minutes ahead and 2 minutes behind (the clock injected through
// Options.Now, the only clock a replica has besides Redis's) share one real
// redis-server. Each must see the other two and their counts, whatever
// order they sync in. When each replica scored the directory with its own
// clock, the one ahead trimmed the others (their scores were older than the
// directory's one-minute GC age on its clock) and saw no peers, and the one
// behind was trimmed by the others: invisible.
func TestClockSkewDoesNotHideReplicas(t *testing.T) {
	srv := startRedis(t)
	onTime := newReplicaWith(t, Options{Addr: srv.Addr(), ReplicaID: "on-time", Now: time.Now})
	ahead := newReplicaWith(t, Options{Addr: srv.Addr(), ReplicaID: "ahead", Now: skewed(2 * time.Minute)})
	behind := newReplicaWith(t, Options{Addr: srv.Addr(), ReplicaID: "behind", Now: skewed(-2 * time.Minute)})
	onTime.Add("x", 1)
	ahead.Add("x", 10)
	behind.Add("x", 100)
	all := []*replica{onTime, ahead, behind}
	// Two orders, three rounds each: a peer is read from the sync after the
	// one that first lists it, so two rounds suffice in any order.
	for _, order := range [][]*replica{all, {behind, ahead, onTime}} {
		for range 3 {
			syncAll(t, order...)
		}
		for _, r := range all {
			t.Logf("%s: %d peers, x = %d", r.ReplicaID(), r.Peers(), r.InFlight("x"))
		}
		for _, r := range all {
			require.Equal(t, 2, r.Peers(), "%s sees %d peers, want 2", r.ReplicaID(), r.Peers())
			require.Equal(t, int64(111), r.InFlight("x"), r.ReplicaID())
			require.Equal(t, Up, r.State(), r.ReplicaID())
		}
	}
	// The directory's scores are Redis's clock, not the writers'.
	raw := rawClient(t, srv.Addr())
	ctx := context.Background()
	redisNow, err := raw.Time(ctx).Result()
	require.NoError(t, err)
	for _, r := range all {
		score, err := raw.ZScore(ctx, r.members, r.ReplicaID()).Result()
		require.NoError(t, err, r.ReplicaID())
		age := redisNow.Sub(time.UnixMilli(int64(score)))
		require.True(t, age >= -time.Second && age < time.Minute, "%s's directory score is %v from Redis's clock", r.ReplicaID(), age)
	}
}

// rawClient is a plain client for inspecting Redis, closed in t.Cleanup.
func rawClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
