package redisshare

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// tune overrides, on u, what the sync loop needs of its client whatever the
// deployment: each sync bounded by its context deadline, no retries (the
// next sync is the retry), at most two connections per server, no dial
// circuit breaker in practice, no client identity or maintenance
// notifications (extra round trips and goroutines for nothing here).
func (s *InFlight) tune(u *redis.UniversalOptions) *redis.UniversalOptions {
	// Each sync's context deadline is what bounds it (Timeout, grown with
	// the backoff while syncs fail); the socket timeouts only need to allow
	// the largest of those.
	sock := s.timeoutFor(s.maxBackoff)
	u.DialTimeout = sock
	u.DialerRetries = 1
	u.ReadTimeout = sock
	u.WriteTimeout = sock
	u.PoolTimeout = sock
	u.ContextTimeoutEnabled = true
	u.MaxRetries = -1
	// Syncs are serial, so one connection is in use at a time (two while
	// Run leaves). PoolSize is large only because go-redis also uses it as
	// the threshold of its dial circuit breaker: after PoolSize failed dials
	// it fails fast and probes once a second, which would delay recovery
	// after a Redis restart by up to 1 s. 1000 failed dials is 5 s of
	// refused connections at 5 ms.
	u.PoolSize = 1000
	u.MaxActiveConns = 2
	u.MaxConcurrentDials = 1
	u.DisableIdentity = true
	u.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return u
}

// Modes of a Redis URL (ParseURL): which of go-redis's parsers reads it.
const (
	// ModeStandalone is one server: redis.ParseURL, as
	// redis://[user:password@]host[:port][/db] or rediss:// for TLS.
	ModeStandalone = "standalone"
	// ModeSentinel is a Sentinel-monitored master: redis.ParseFailoverURL,
	// the URL naming a Sentinel, more as addr=host:port parameters, and the
	// master as master_name=NAME (required). The URL's user and password
	// are the Sentinels'; the master's are the username and password
	// parameters.
	ModeSentinel = "sentinel"
	// ModeCluster is a Redis Cluster: redis.ParseClusterURL, the URL naming
	// one node and more as addr=host:port parameters. All of this
	// package's keys share one hash tag, so they live on one shard.
	ModeCluster = "cluster"
)

// ParseURL reads a Redis URL with go-redis's parser for mode ("" is
// ModeStandalone) and returns it as Options.Redis. Timeouts, retries and
// pool sizes the URL may set are overridden by New (see Options.Redis).
// Errors wrap ErrInvalidConfig; they never repeat the URL, which may hold a
// password.
func ParseURL(rawURL, mode string) (*redis.UniversalOptions, error) {
	bad := func(err error) (*redis.UniversalOptions, error) {
		return nil, fmt.Errorf("%w: Redis URL (%s): %v", ErrInvalidConfig, cmpMode(mode), redactErr(err, rawURL))
	}
	switch mode {
	case "", ModeStandalone:
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return bad(err)
		}
		return &redis.UniversalOptions{
			Addrs: []string{o.Addr}, ClientName: o.ClientName, DB: o.DB, Protocol: o.Protocol,
			Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		}, nil
	case ModeSentinel:
		o, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return bad(err)
		}
		if o.MasterName == "" {
			return bad(fmt.Errorf("sentinel mode needs the master_name parameter"))
		}
		return &redis.UniversalOptions{
			Addrs: o.SentinelAddrs, MasterName: o.MasterName, ClientName: o.ClientName, DB: o.DB, Protocol: o.Protocol,
			Username: o.Username, Password: o.Password, SentinelUsername: o.SentinelUsername,
			SentinelPassword: o.SentinelPassword, TLSConfig: o.TLSConfig,
		}, nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return bad(err)
		}
		return &redis.UniversalOptions{
			Addrs: o.Addrs, IsClusterMode: true, ClientName: o.ClientName, Protocol: o.Protocol,
			Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		}, nil
	default:
		return nil, fmt.Errorf("%w: Redis URL mode must be %s, %s or %s, got %q", ErrInvalidConfig,
			ModeStandalone, ModeSentinel, ModeCluster, mode)
	}
}

func cmpMode(mode string) string {
	if mode == "" {
		return ModeStandalone
	}
	return mode
}

// redactErr keeps a parser's error from echoing a password: net/url's
// errors quote the whole URL, and a password may be a query parameter.
func redactErr(err error, rawURL string) error {
	msg := strings.ReplaceAll(err.Error(), rawURL, "<the URL>")
	if u, perr := url.Parse(rawURL); perr == nil {
		secrets := []string{u.Query().Get("password"), u.Query().Get("sentinel_password")}
		if u.User != nil {
			p, _ := u.User.Password()
			secrets = append(secrets, p)
		}
		for _, p := range secrets {
			if p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
	}
	return errors.New(msg)
}
