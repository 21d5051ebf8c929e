package main

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/saturation/redisshare"
	"github.com/flowgate/flowgate/saturation/redisshare/redistest"
)

// TestParseConfigSharedURL: sharedInFlight takes a Redis URL (redis://,
// rediss://, password, db) read by go-redis's parser for its mode
// (standalone, sentinel, cluster) beside the old address key; every bad
// combination is an error naming the key and its line, and none repeats
// the password.
func TestParseConfigSharedURL(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader("sharedInFlight:\n  url: 'rediss://:pw@redis.example:6380/2'\n  replicaId: gw-0\n"))
	require.NoError(t, err)
	require.True(t, cfg.Shared.Enabled())
	o, err := cfg.Shared.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, []string{"redis.example:6380"}, o.Addrs)
	require.Equal(t, "pw", o.Password)
	require.Equal(t, 2, o.DB)
	require.NotNil(t, o.TLSConfig)

	cfg, err = gateway.ParseConfig(strings.NewReader("sharedInFlight:\n  url: 'redis://s1:26379?addr=s2:26379&master_name=main'\n  mode: sentinel\n  replicaId: gw-0\n"))
	require.NoError(t, err)
	o, err = cfg.Shared.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, "main", o.MasterName)
	require.Equal(t, []string{"s1:26379", "s2:26379"}, o.Addrs)

	cfg, err = gateway.ParseConfig(strings.NewReader("sharedInFlight: {url: 'redis://n1:7000?addr=n2:7000', mode: cluster}\n"))
	require.NoError(t, err)
	o, err = cfg.Shared.RedisOptions()
	require.NoError(t, err)
	require.True(t, o.IsClusterMode)

	cfg, err = gateway.ParseConfig(strings.NewReader("sharedInFlight: {address: 'redis:6379'}\n"))
	require.NoError(t, err, "the address key still works")
	o, err = cfg.Shared.RedisOptions()
	require.NoError(t, err)
	require.Equal(t, []string{"redis:6379"}, o.Addrs)

	for _, c := range []struct{ src, want string }{
		{"sharedInFlight:\n  address: 'redis:6379'\n  url: 'redis://redis'\n", "sharedInFlight.url (line 3)"},
		{"sharedInFlight:\n  url: 'http://:s3cret@redis'\n", "sharedInFlight.url (line 2): Redis URL (standalone): redis: invalid URL scheme: http"},
		{"sharedInFlight:\n  url: 'redis://:s3cret@redis/x'\n", "sharedInFlight.url (line 2)"},
		{"sharedInFlight:\n  url: 'redis://:s3cret@redis?dial_timeout=x'\n", "sharedInFlight.url (line 2)"},
		{"sharedInFlight:\n  url: 'redis://:s3cret@redis'\n  mode: replicated\n", "sharedInFlight.mode (line 3)"},
		{"sharedInFlight:\n  url: 'redis://:s3cret@redis'\n  mode: sentinel\n", "master_name"},
		{"sharedInFlight:\n  address: 'redis://redis:6379'\n", "sharedInFlight.address (line 2): a URL; give it as sharedInFlight.url"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  mode: cluster\n", "sharedInFlight.mode (line 3)"},
		{"sharedInFlight:\n  ur: 'redis://redis'\n", "sharedInFlight.ur (line 2): unknown field"},
		{"sharedInFlight:\n  mode: cluster\n", "sharedInFlight.address"},
	} {
		_, err := gateway.ParseConfig(strings.NewReader(c.src))
		require.Error(t, err, c.src)
		require.Contains(t, err.Error(), c.want, c.src)
		require.NotContains(t, err.Error(), "s3cret", "the password leaked: %v", err)
	}
}

// TestSharedFlagsURL: -shared-redis takes a URL as well as a host:port and
// replaces the file's connection either way; -shared-redis-mode sets how
// the URL is read.
func TestSharedFlagsURL(t *testing.T) {
	parse := func(s *gateway.SharedConfig, args ...string) error {
		fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
		var f sharedFlags
		f.register(fs)
		require.NoError(t, fs.Parse(args))
		return f.apply(s)
	}
	s := gateway.SharedConfig{Address: "redis:6379"}
	require.NoError(t, parse(&s, "-shared-redis", "redis://:pw@other:6380/1", "-replica-id", "gw-0"))
	require.Equal(t, "", s.Address)
	require.Equal(t, "redis://:pw@other:6380/1", s.URL)

	s = gateway.SharedConfig{URL: "redis://a:1"}
	require.NoError(t, parse(&s, "-shared-redis", "b:2", "-replica-id", "gw-0"))
	require.Equal(t, gateway.SharedConfig{Address: "b:2", ReplicaID: "gw-0", Period: redisshare.DefaultPeriod, TTL: redisshare.DefaultTTL}, s)

	s = gateway.SharedConfig{}
	require.NoError(t, parse(&s, "-shared-redis", "redis://n1:7000?addr=n2:7000", "-shared-redis-mode", "cluster", "-replica-id", "gw-0"))
	require.Equal(t, redisshare.ModeCluster, s.Mode)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-shared-redis", "redis://:s3cret@h/x", "-replica-id", "a"}, "-shared-redis: Redis URL"},
		{[]string{"-shared-redis", "redis://h", "-replica-id", "a", "-shared-redis-mode", "ring"}, "-shared-redis-mode"},
		{[]string{"-shared-redis", "h:1", "-replica-id", "a", "-shared-redis-mode", "cluster"}, "-shared-redis-mode"},
		{[]string{"-shared-redis-mode", "cluster"}, "need -shared-redis"},
	} {
		s := gateway.SharedConfig{}
		err := parse(&s, c.args...)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error(), c.want, "%v", c.args)
		require.NotContains(t, err.Error(), "s3cret")
	}
}

// TestSharedInFlightThroughURL: an in-process proxy configured with a URL
// (password, database) reaches a real redis-server that requires the
// password, and shares its view with a peer in that database.
func TestSharedInFlightThroughURL(t *testing.T) {
	rds := redistest.StartWith(t, "--requirepass", "s3cret")
	url := "redis://:s3cret@" + rds.Addr() + "/4"
	be := newCustom(t, idleVLLM, nil)
	cfg := gateway.DefaultConfig()
	cfg.Shared = gateway.SharedConfig{URL: url, ReplicaID: "a"}
	require.NoError(t, cfg.Shared.Validate(gateway.SharedFileFields))
	p, _ := runGateway(t, cfg, gateway.Options{}, true, be.srv.URL)

	o, err := redisshare.ParseURL(url, "")
	require.NoError(t, err)
	peer, err := redisshare.New(redisshare.Options{Redis: o, ReplicaID: "b", Period: 100 * time.Millisecond})
	require.NoError(t, err)
	defer peer.Close()
	peer.Add(be.srv.URL, 3)
	eventually(t, "the proxy sees its peer's 3 requests through the URL", func() bool {
		_ = peer.Sync(context.Background())
		return p.Shared().State() == redisshare.Up && p.Shared().Peers() == 1 && p.Shared().Endpoint(be.srv.URL).Others() == 3
	})
}
