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

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

func main() {
	configPath := flag.String("config", "", "optional YAML configuration (see examples/proxy/config.yaml)")
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	backends := flag.String("backends", "", "comma-separated base URLs of the model servers")
	llmdMetrics := flag.Bool("llm-d-metrics", false, "also export llm-d's flow-control metric names (llm_d_epp_flow_control_*) on /metrics")
	var sf serverFlags
	sf.register(flag.CommandLine)
	flag.Parse()
	if err := sf.validate(); err != nil {
		fatal(err)
	}

	cfg := gateway.DefaultConfig()
	if *configPath != "" {
		f, err := os.Open(*configPath)
		if err != nil {
			fatal(err)
		}
		cfg, err = gateway.ParseConfig(f)
		f.Close()
		if err != nil {
			fatal(err)
		}
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
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: urls,
		BodyGrace: sf.bodyGrace, MinBodyRate: sf.minBodyRate, BackendResponseHeaderTimeout: sf.backendRespHeader, LLMDMetrics: *llmdMetrics})
	if err != nil {
		fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fatal(err)
	}
	lim := newConnLimiter(ln, sf.maxConns, sf.reservedConns)
	srv := newServer(reserveForCritical(p.Critical, p), &sf)
	srv.ConnState = lim.connState
	p.Start()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim) }()
	log.Printf("proxy: listening on http://%s → %v (policy %s, %d bands, at most %d client connections, %d kept free)",
		ln.Addr(), urls, cfg.Policy.Type, len(cfg.Bands), sf.maxConns, sf.reservedConns)
	select {
	case err := <-served:
		p.Close()
		fatal(err)
	case <-ctx.Done():
	}
	// Graceful shutdown: stop accepting and answer what is queued with 503
	// at once, then wait for what is in flight, at most -drain-timeout.
	log.Printf("proxy: shutting down (at most %v)", sf.drainTimeout)
	p.Drain()
	if err := drain(srv, sf.drainTimeout); err != nil {
		log.Printf("proxy: shutdown: %v", err)
	}
	p.Close()
	log.Printf("proxy: stopped")
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
