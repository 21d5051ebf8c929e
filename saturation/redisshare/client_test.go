package redisshare

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/saturation/redisshare/redistest"
)

// TestParseURL: each mode goes through go-redis's own parser and lands in
// the UniversalOptions fields that select the client New builds; errors
// wrap ErrInvalidConfig and never repeat a password.
func TestParseURL(t *testing.T) {
	o, err := ParseURL("rediss://u:pw@redis.example:6380/2", "")
	require.NoError(t, err)
	require.Equal(t, []string{"redis.example:6380"}, o.Addrs)
	require.Equal(t, "u", o.Username)
	require.Equal(t, "pw", o.Password)
	require.Equal(t, 2, o.DB)
	require.NotNil(t, o.TLSConfig, "rediss:// is TLS")
	require.Equal(t, "redis.example", o.TLSConfig.ServerName)

	o, err = ParseURL("redis://redis", ModeStandalone)
	require.NoError(t, err)
	require.Equal(t, []string{"redis:6379"}, o.Addrs, "the default port")
	require.Nil(t, o.TLSConfig)
	c := redis.NewUniversalClient(o)
	_, single := c.(*redis.Client)
	require.True(t, single)
	require.NoError(t, c.Close())

	o, err = ParseURL("redis://s:spw@sent1:26379/1?addr=sent2:26379&master_name=mymaster&password=mpw", ModeSentinel)
	require.NoError(t, err)
	require.Equal(t, []string{"sent1:26379", "sent2:26379"}, o.Addrs)
	require.Equal(t, "mymaster", o.MasterName)
	require.Equal(t, "spw", o.SentinelPassword)
	require.Equal(t, "mpw", o.Password)
	require.Equal(t, 1, o.DB)

	o, err = ParseURL("redis://:pw@node1:7000?addr=node2:7000&addr=node3:7000", ModeCluster)
	require.NoError(t, err)
	require.Equal(t, []string{"node1:7000", "node2:7000", "node3:7000"}, o.Addrs)
	require.True(t, o.IsClusterMode)
	c = redis.NewUniversalClient(o)
	_, cluster := c.(*redis.ClusterClient)
	require.True(t, cluster)
	require.NoError(t, c.Close())
	// New tunes a Cluster client like any other (no network yet).
	v, err := New(Options{Redis: o, ReplicaID: "a"})
	require.NoError(t, err)
	require.True(t, v.client.(*redis.ClusterClient).Options().ContextTimeoutEnabled)
	require.Equal(t, -1, v.client.(*redis.ClusterClient).Options().MaxRetries)
	require.False(t, o.ContextTimeoutEnabled, "New works on a copy")
	require.NoError(t, v.Close())

	for _, c := range []struct{ url, mode, want string }{
		{"http://h:1", "", "invalid URL scheme"},
		{"redis://:s3cret@h:1/x", "", "invalid database number"},
		{"redis://:s3cret@h:1?bogus=1", "", "unexpected option: bogus"},
		{"redis://:s3cret@h:1", ModeSentinel, "master_name"},
		{"redis://h:1", "replicated", "mode must be"},
		{"redis://:s3cret@h:1/%zz", "", "invalid URL escape"},
	} {
		_, err := ParseURL(c.url, c.mode)
		require.ErrorIs(t, err, ErrInvalidConfig, c.url)
		require.Contains(t, err.Error(), c.want, c.url)
		require.NotContains(t, err.Error(), "s3cret", "the password leaked")
	}
}

// TestURLWithPasswordAndDB: a replica reaches a real redis-server that
// requires a password, through a URL naming a database; its keys land in
// that database; a wrong password fails the sync, visibly.
func TestURLWithPasswordAndDB(t *testing.T) {
	srv := redistest.StartWith(t, "--requirepass", "s3cret")
	port := srv.Addr()[strings.LastIndexByte(srv.Addr(), ':')+1:]
	o, err := ParseURL("redis://:s3cret@127.0.0.1:"+port+"/3", "")
	require.NoError(t, err)
	a := newReplicaWith(t, Options{Redis: o, ReplicaID: "a"})
	b := newReplicaWith(t, Options{Redis: o, ReplicaID: "b"})
	a.Add("x", 2)
	b.Add("x", 3)
	ctx := context.Background()
	// The first sync dials and authenticates; bounded, hang-only (a -race
	// run beside a CPU hog missed even the generous timeout once).
	for _, r := range []*replica{a, b} {
		require.Eventually(t, func() bool { return r.Sync(ctx) == nil }, 30*time.Second, time.Millisecond)
	}
	syncAll(t, a)
	require.Equal(t, int64(5), a.InFlight("x"))
	require.Equal(t, 1, a.Peers())

	raw := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "s3cret", DB: 3})
	defer raw.Close()
	n, err := raw.Exists(ctx, a.key).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the hash is in db 3")
	raw0 := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "s3cret"})
	defer raw0.Close()
	n, err = raw0.Exists(ctx, a.key).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing in db 0")

	wrong, err := ParseURL("redis://:nope@127.0.0.1:"+port+"/3", "")
	require.NoError(t, err)
	c := newReplicaWith(t, Options{Redis: wrong, ReplicaID: "c"})
	// Bounded, hang-only: on a starved machine a sync may time out before
	// the server's answer.
	require.Eventually(t, func() bool {
		err := c.Sync(ctx)
		return err != nil && strings.Contains(err.Error(), "WRONGPASS")
	}, 30*time.Second, time.Millisecond)
	require.Equal(t, Down, c.State())
	require.Positive(t, c.gauge(t, "flowgate_shared_inflight_sync_errors_total"))
	require.Zero(t, c.gauge(t, "flowgate_shared_inflight_syncs_total")-c.gauge(t, "flowgate_shared_inflight_sync_errors_total"),
		"every sync with the wrong password failed")
}
