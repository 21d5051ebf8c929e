// Command proxy is a reverse proxy that gates LLM requests with flowgate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

func main() {
	configPath := flag.String("config", "", "optional YAML configuration (see examples/proxy/config.yaml)")
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	backends := flag.String("backends", "", "comma-separated base URLs of the model servers")
	llmdMetrics := flag.Bool("llm-d-metrics", false, "serve llm-d's flow-control metric names (llm_d_epp_flow_control_*) on /metrics in place of flowgate's for the same four facts")
	apiKeysFile := flag.String("api-keys", "", "file of API keys, one per line: <key> <tenant> <ceiling band> [<fairness id>] (else $FLOWGATE_API_KEYS, entries separated by ';')")
	trustHeader := flag.Bool("trust-objective-header", false, "trust x-llm-d-inference-objective from callers without a key (llm-d's behaviour: only behind an authenticating front proxy)")
	stripLLMD := flag.Bool("strip-llm-d-headers", false, "remove x-llm-d-* and x-gateway-inference-* request headers at ingress and re-inject the objective and fairness id from the caller's API key")
	var sf serverFlags
	sf.register(flag.CommandLine)
	var sh sharedFlags
	sh.register(flag.CommandLine)
	flag.Parse()
	if err := sf.validate(); err != nil {
		fatal(err)
	}

	cfg := gateway.DefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = gateway.LoadConfig(*configPath); err != nil {
			fatal(err)
		}
	}
	if err := sh.apply(&cfg.Shared); err != nil {
		fatal(err)
	}
	if cfg.Shared.Enabled() {
		// go-redis logs every failed dial; the view logs one line per
		// transition to and from its fallback, which is what matters.
		redis.SetLogger(quietRedis{})
	}
	for _, w := range cfg.Warnings {
		log.Printf("proxy: config: %s", w)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var urls []string
	for _, b := range strings.Split(*backends, ",") {
		if b = strings.TrimSpace(b); b != "" {
			urls = append(urls, b)
		}
	}
	if len(urls) == 0 {
		fatal(errors.New("proxy: -backends is required"))
	}
	keys, err := apiKeys(*apiKeysFile)
	if err != nil {
		fatal(err)
	}
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: urls, BodyGrace: sf.bodyGrace, MinBodyRate: sf.minBodyRate,
		BodyIdleTimeout: sf.bodyIdle, MaxBodyMemory: sf.maxBodyMemory, BackendResponseHeaderTimeout: sf.backendRespHeader, LLMDMetrics: *llmdMetrics,
		APIKeys: keys, TrustObjectiveHeader: *trustHeader, StripLLMDHeaders: *stripLLMD})
	if err != nil {
		fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fatal(err)
	}
	if s := cfg.Shared; s.Enabled() {
		where := s.Address
		if s.URL != "" {
			// The servers and the mode, never the URL: it may hold a password.
			if o, err := s.RedisOptions(); err == nil {
				mode := s.Mode
				if mode == "" {
					mode = "standalone"
				}
				where = fmt.Sprintf("%s (%s, tls %v, db %d)", strings.Join(o.Addrs, ","), mode, o.TLSConfig != nil, o.DB)
			}
		}
		log.Printf("proxy: sharing in-flight counts through redis %s as replica %q (period %v, ttl %v)", where, s.ReplicaID, s.Period, s.TTL)
	}
	log.Printf("proxy: listening on http://%s → %v (policy %s, %d bands, at most %d client connections, %d kept free)",
		ln.Addr(), urls, cfg.Policy.Type, len(cfg.Bands), sf.maxConns, sf.reservedConns)
	// Graceful shutdown on SIGTERM: stop accepting and answer what is queued
	// with 503 at once, then wait for what is in flight, at most
	// -drain-timeout (flowhttp's Gateway.Serve).
	go func() {
		<-ctx.Done()
		log.Printf("proxy: shutting down (at most %v)", sf.drainTimeout)
	}()
	if err := p.Serve(ctx, ln, sf.config()); err != nil {
		if ctx.Err() == nil {
			fatal(err)
		}
		log.Printf("proxy: shutdown: %v", err)
	}
	log.Printf("proxy: stopped")
}

// apiKeys reads the API keys from path, else from $FLOWGATE_API_KEYS (nil
// if neither is set).
func apiKeys(path string) (map[string]gateway.Tenant, error) {
	text, ok := os.LookupEnv("FLOWGATE_API_KEYS")
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("proxy: -api-keys: %w", err)
		}
		text, ok = string(b), true
	}
	if !ok {
		return nil, nil
	}
	return gateway.ParseAPIKeys(text)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// sharedFlags override the configuration's sharedInFlight section.
type sharedFlags struct {
	redis     string
	mode      string
	replicaID string
	period    time.Duration
	ttl       time.Duration
}

func (f *sharedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.redis, "shared-redis", "", "Redis through which the replicas share their in-flight counts per backend: host:port (sharedInFlight.address) or a redis:// or rediss:// URL (sharedInFlight.url; a password here shows in ps, the file keeps it out); off by default")
	fs.StringVar(&f.mode, "shared-redis-mode", "", "how -shared-redis's URL is read: standalone (default), sentinel (master_name=, addr= for more Sentinels) or cluster (addr= for more nodes); sharedInFlight.mode")
	fs.StringVar(&f.replicaID, "replica-id", "", "this replica's name among those sharing the Redis, unique (a pod name; sharedInFlight.replicaId)")
	fs.DurationVar(&f.period, "shared-period", 0, "how often to publish own counts and fetch the others' (0: the file's, or 5ms)")
	fs.DurationVar(&f.ttl, "shared-ttl", 0, "how long a silent replica keeps counting, and how long Redis may fail before own counts only (0: the file's, or 1s)")
}

// sharedFlagNames names the flags in validation errors; a field the file
// can also set names both.
var sharedFlagNames = gateway.SharedFieldNames{Address: "-shared-redis", URL: "-shared-redis", Mode: "-shared-redis-mode", ReplicaID: "-replica-id",
	Period: "-shared-period", TTL: "-shared-ttl"}

// apply lays the flags over the file's settings and validates the result.
func (f *sharedFlags) apply(s *gateway.SharedConfig) error {
	if f.period < 0 || f.ttl < 0 {
		return fmt.Errorf("proxy: -shared-period and -shared-ttl must be ≥ 0, got %v and %v", f.period, f.ttl)
	}
	if f.redis != "" {
		// The flag replaces the file's connection whichever form it has.
		s.Address, s.URL = "", ""
		if strings.Contains(f.redis, "://") {
			s.URL = f.redis
		} else {
			s.Address = f.redis
		}
	}
	if f.mode != "" {
		s.Mode = f.mode
	}
	if f.replicaID != "" {
		s.ReplicaID = f.replicaID
	}
	if f.period != 0 {
		s.Period = f.period
	}
	if f.ttl != 0 {
		s.TTL = f.ttl
	}
	if !s.Enabled() && (f.replicaID != "" || f.period != 0 || f.ttl != 0 || f.mode != "") {
		return errors.New("proxy: -replica-id, -shared-period, -shared-ttl and -shared-redis-mode need -shared-redis (or sharedInFlight.address or url)")
	}
	if err := s.Validate(sharedFlagNames); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	return nil
}

// quietRedis drops go-redis's own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
