package main

import (
	"flag"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/saturation/redisshare"
)

// TestParseConfigSharedInFlight: the section is optional (off by default),
// its period and TTL default to redisshare's, and every bad value is an
// error naming the field (and its line).
func TestParseConfigSharedInFlight(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader(""))
	require.NoError(t, err)
	require.False(t, cfg.Shared.Enabled())

	cfg, err = gateway.ParseConfig(strings.NewReader("sharedInFlight:\n  address: 127.0.0.1:6379\n  replicaId: gw-0\n"))
	require.NoError(t, err)
	require.Equal(t, gateway.SharedConfig{Address: "127.0.0.1:6379", ReplicaID: "gw-0",
		Period: redisshare.DefaultPeriod, TTL: redisshare.DefaultTTL}, cfg.Shared)

	cfg, err = gateway.ParseConfig(strings.NewReader("sharedInFlight: {address: 'redis:6379', period: 20ms, ttl: 2s}\n"))
	require.NoError(t, err, "the replica id may come from -replica-id")
	require.Equal(t, 20*time.Millisecond, cfg.Shared.Period)
	require.Equal(t, 2*time.Second, cfg.Shared.TTL)

	for _, c := range []struct{ src, want string }{
		{"sharedInFlight:\n  replicaId: a\n", "sharedInFlight.address"},
		{"sharedInFlight:\n  address: redis\n", "sharedInFlight.address (line 2)"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  period: 0s\n", "sharedInFlight.period (line 3)"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  period: 2m\n", "sharedInFlight.period (line 3)"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  ttl: -1s\n", "sharedInFlight.ttl (line 3)"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  period: 10ms\n  ttl: 30ms\n", "sharedInFlight.ttl (line 4)"},
		{"sharedInFlight:\n  address: 'redis:6379'\n  replicaId: '" + strings.Repeat("x", 257) + "'\n", "sharedInFlight.replicaId (line 3)"},
		{"sharedInFlight:\n  adress: 'redis:6379'\n", "sharedInFlight.adress (line 2)"},
	} {
		_, err := gateway.ParseConfig(strings.NewReader(c.src))
		require.Error(t, err, c.src)
		require.Contains(t, err.Error(), c.want, c.src)
	}
}

// TestParseConfigSampleShared: the sample's commented sharedInFlight
// section parses once uncommented.
func TestParseConfigSampleShared(t *testing.T) {
	data, err := os.ReadFile("config.yaml")
	require.NoError(t, err)
	src := string(data)
	i := strings.Index(src, "# sharedInFlight:")
	require.Positive(t, i)
	tail := regexp.MustCompile(`(?m)^# `).ReplaceAllString(src[i:], "")
	cfg, err := gateway.ParseConfig(strings.NewReader(src[:i] + tail))
	require.NoError(t, err)
	require.Equal(t, gateway.SharedConfig{Address: "redis:6379", ReplicaID: "gw-0", Period: 5 * time.Millisecond, TTL: time.Second}, cfg.Shared)
}

// TestSharedFlags: the flags override the file, and their errors name the
// flag.
func TestSharedFlags(t *testing.T) {
	parse := func(s *gateway.SharedConfig, args ...string) error {
		fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
		var f sharedFlags
		f.register(fs)
		require.NoError(t, fs.Parse(args))
		return f.apply(s)
	}
	var s gateway.SharedConfig
	require.NoError(t, parse(&s))
	require.False(t, s.Enabled())

	s = gateway.SharedConfig{}
	require.NoError(t, parse(&s, "-shared-redis", "127.0.0.1:6379", "-replica-id", "gw-1"))
	require.Equal(t, gateway.SharedConfig{Address: "127.0.0.1:6379", ReplicaID: "gw-1",
		Period: redisshare.DefaultPeriod, TTL: redisshare.DefaultTTL}, s)

	fromFile := gateway.SharedConfig{Address: "redis:6379", Period: 20 * time.Millisecond, TTL: 2 * time.Second}
	s = fromFile
	require.NoError(t, parse(&s, "-replica-id", "gw-2", "-shared-ttl", "500ms"))
	require.Equal(t, gateway.SharedConfig{Address: "redis:6379", ReplicaID: "gw-2", Period: 20 * time.Millisecond, TTL: 500 * time.Millisecond}, s)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-shared-redis", "127.0.0.1:6379"}, "-replica-id"},
		{[]string{"-shared-redis", "nohost", "-replica-id", "a"}, "-shared-redis"},
		{[]string{"-replica-id", "a"}, "need -shared-redis"},
		{[]string{"-shared-redis", "h:1", "-replica-id", "a", "-shared-period", "2m"}, "-shared-period"},
		{[]string{"-shared-redis", "h:1", "-replica-id", "a", "-shared-period", "-1s"}, "-shared-period"},
		{[]string{"-shared-redis", "h:1", "-replica-id", "a", "-shared-ttl", "10ms"}, "-shared-ttl"},
	} {
		s := gateway.SharedConfig{}
		err := parse(&s, c.args...)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}

// TestSharedInFlightSteersPick: two in-process proxies sharing a real
// redis-server. Replica a holds 4 requests on backend X; replica b, which
// sees X and Y, then sends its 4 to Y, because its pick compares own +
// others' counts (alone it would split them 2 and 2). b's /metrics shows
// the peer and the others' 4 on X.
func TestSharedInFlightSteersPick(t *testing.T) {
	rds := startRedis(t)
	release := make(chan struct{})
	var hitsX, hitsY atomic.Int64
	hold := func(hits *atomic.Int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
		}
	}
	x, y := newCustom(t, idleVLLM, hold(&hitsX)), newCustom(t, idleVLLM, hold(&hitsY))
	shared := func(id string) gateway.Config {
		cfg := gateway.DefaultConfig()
		cfg.Shared = gateway.SharedConfig{Address: rds.Addr(), ReplicaID: id}
		require.NoError(t, cfg.Shared.Validate(gateway.SharedFileFields))
		return cfg
	}
	a, asrv := runGateway(t, shared("a"), gateway.Options{}, true, x.srv.URL)
	b, bsrv := runGateway(t, shared("b"), gateway.Options{}, true, x.srv.URL, y.srv.URL)
	eventually(t, "the replicas see each other", func() bool { return a.Shared().Peers() == 1 && b.Shared().Peers() == 1 })
	// The poller reads both pods idle (runGateway), but b's choice reads
	// its copy of that verdict, taken once per scrape interval: one taken
	// before Y's first scrape passes Y over, and b would send everything
	// to X (seen once under load).
	eventually(t, "b's choice sees both backends usable", func() bool {
		for _, s := range b.Backends() {
			if s.Unusable || !s.FailedAt.IsZero() {
				return false
			}
		}
		return true
	})

	var wg sync.WaitGroup
	post := func(front string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, front+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
			req.Header.Set(gateway.ObjectiveHeader, "critical")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	defer func() { close(release); wg.Wait(); http.DefaultClient.CloseIdleConnections() }()
	for range 4 {
		post(asrv.URL)
	}
	eventually(t, "replica b sees a's 4 requests on X", func() bool {
		return hitsX.Load() == 4 && b.Shared().Endpoint(x.srv.URL).Others() == 4
	})
	for range 4 {
		post(bsrv.URL)
	}
	eventually(t, "b's 4 requests reach a backend", func() bool { return hitsX.Load()+hitsY.Load() == 8 })
	require.Equal(t, int64(4), hitsY.Load(), "b sent some of its requests to X, where a has 4 in flight")
	require.Equal(t, []int64{0, 4}, b.InFlight())

	resp, err := http.Get(bsrv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), `flowgate_shared_inflight_peers{replica="b"} 1`)
	require.Contains(t, string(body), `flowgate_endpoint_inflight_others{endpoint="`+x.srv.URL+`"} 4`)
}

// TestSharedInFlightWithoutRedis: a proxy whose Redis is not there starts,
// serves on its own counts (state down), and closes promptly.
func TestSharedInFlightWithoutRedis(t *testing.T) {
	var hits atomic.Int64
	be := newCustom(t, idleVLLM, func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})
	cfg := gateway.DefaultConfig()
	cfg.Shared = gateway.SharedConfig{Address: "127.0.0.1:" + strconv.Itoa(freeLoopbackPort(t)), ReplicaID: "alone"}
	p, srv := runGateway(t, cfg, gateway.Options{}, true, be.srv.URL)
	for range 5 {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, int64(5), hits.Load())
	require.Equal(t, redisshare.Down, p.Shared().State())
	http.DefaultClient.CloseIdleConnections()
	began := time.Now()
	p.Close()
	require.Less(t, time.Since(began), 2*time.Second, "Close waited on the missing Redis")
}
