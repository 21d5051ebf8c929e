// Command proxy is a reverse proxy that gates LLM requests with flowgate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

func main() {
	configPath := flag.String("config", "", "optional YAML configuration (see examples/proxy/config.yaml)")
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	backends := flag.String("backends", "", "comma-separated base URLs of the model servers")
	flag.Parse()

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
	p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: urls})
	if err != nil {
		fatal(err)
	}
	p.Start()
	srv := &http.Server{Addr: *addr, Handler: p, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	log.Printf("proxy: listening on http://%s → %v (policy %s, %d bands)", *addr, urls, cfg.Policy.Type, len(cfg.Bands))
	select {
	case err := <-served:
		p.Close()
		fatal(err)
	case <-ctx.Done():
	}
	// Graceful shutdown: stop accepting and answer what is queued with 503
	// at once, then wait for what is in flight.
	log.Printf("proxy: shutting down")
	p.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Printf("proxy: shutdown: %v", err)
	}
	p.Close()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
