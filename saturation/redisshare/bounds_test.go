package redisshare

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// hostile writes what a replica with write access to Redis could: a peer
// hash with the given fields, listed in the directory.
func hostile(t *testing.T, raw *redis.Client, id string, fields ...any) {
	t.Helper()
	ctx := context.Background()
	key := "{" + DefaultPrefix + "}:replica:" + id
	for i := 0; i < len(fields); i += 20000 {
		require.NoError(t, raw.HSet(ctx, key, fields[i:min(i+20000, len(fields))]...).Err())
	}
	require.NoError(t, raw.ZAdd(ctx, "{"+DefaultPrefix+"}:replicas", redis.Z{Score: float64(time.Now().UnixMilli()), Member: id}).Err())
}

func boundedReplica(t *testing.T, addr, id string) *replica {
	return startReplica(t, Options{Addr: addr, ReplicaID: id, Period: 250 * time.Millisecond, TTL: 4 * time.Second, Timeout: time.Second})
}

// A peer's count of 2^32 (the most parseCount takes) weighed 2^32 requests
// on every replica (pool saturation 8.6e8); it is clamped to what one
// replica can hold, and counted.
func TestPeerCountClampedToOneReplica(t *testing.T) {
	srv := startRedis(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	a := boundedReplica(t, srv.Addr(), "a")
	hostile(t, raw, "evil", "", "1", "x", strconv.FormatInt(MaxCount, 10), "y", "7")
	syncAll(t, a, a)
	require.Equal(t, int64(DefaultMaxPeerCount), a.InFlight("x"))
	require.Equal(t, int64(7), a.InFlight("y"))
	require.GreaterOrEqual(t, a.Refused("count"), int64(1))
	require.Equal(t, float64(a.Refused("count")), a.gauge(t, "flowgate_shared_inflight_refused_total"), `reason="count" sorts first`)
}

// A peer hash of 200k endpoint names is not read (before, each became an
// endpoint of every replica's view, for good); names past MaxEndpoints from
// many small hashes are refused, the replica's own names kept; the view
// stays up with the real counts.
func TestPeerNamesBounded(t *testing.T) {
	srv := startRedis(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	a, b := boundedReplica(t, srv.Addr(), "a"), boundedReplica(t, srv.Addr(), "b")
	a.Endpoint("x") // a gateway holds its backends' handles
	b.Add("x", 3)
	syncAll(t, b)
	fields := []any{"", "1"}
	for i := range 200_000 {
		fields = append(fields, fmt.Sprintf("ep-%d", i), "1")
	}
	hostile(t, raw, "wide", fields...)
	for i := range 3 {
		f := []any{"", "1"}
		for j := range 500 {
			f = append(f, fmt.Sprintf("n%d-%d", i, j), "1")
		}
		hostile(t, raw, fmt.Sprintf("narrow%d", i), f...)
	}
	start := time.Now()
	syncAll(t, a, a)
	t.Logf("two syncs in %v; %d endpoints known", time.Since(start), len(a.Endpoints()))
	require.Equal(t, Up, a.State())
	require.Equal(t, int64(3), a.InFlight("x"))
	require.LessOrEqual(t, len(a.Endpoints()), DefaultMaxEndpoints)
	require.GreaterOrEqual(t, a.Refused("hash"), int64(1))
	require.GreaterOrEqual(t, a.Refused("name"), int64(3*500+1-DefaultMaxEndpoints))
}

// 20k fake replica ids in the directory: a sync reads the MaxPeers that
// published last, not all of them.
func TestPeersBounded(t *testing.T) {
	srv := startRedis(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	now := float64(time.Now().UnixMilli())
	const fakes = 20_000
	_, err := raw.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range fakes {
			id := fmt.Sprintf("fake-%d", i)
			p.HSet(ctx, "{"+DefaultPrefix+"}:replica:"+id, "", "1", "z", "1")
			p.ZAdd(ctx, "{"+DefaultPrefix+"}:replicas", redis.Z{Score: now - 1000, Member: id})
		}
		return nil
	})
	require.NoError(t, err)
	a, b := boundedReplica(t, srv.Addr(), "a"), boundedReplica(t, srv.Addr(), "b")
	b.Add("x", 3)
	syncAll(t, b)
	start := time.Now()
	syncAll(t, a, a)
	t.Logf("two syncs in %v; %d peers", time.Since(start), a.Peers())
	require.Equal(t, Up, a.State())
	require.Equal(t, int64(3), a.InFlight("x"), "the replica that published last is read")
	require.LessOrEqual(t, a.Peers(), DefaultMaxPeers)
	require.LessOrEqual(t, a.InFlight("z"), int64(DefaultMaxPeers))
	require.GreaterOrEqual(t, a.Refused("peer"), int64(fakes+1-DefaultMaxPeers))
}
