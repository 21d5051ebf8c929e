// Command embed is the README's program: a protected inference gateway in
// front of vLLM servers, on flowgate's public API only (flowhttp.Gateway).
// Its routing, rt.Route, is the line a host replaces with its own.
// embed_test.go checks that the README shows this file from its package
// clause on, so the README's program is the one that compiles here.
//
//	go run ./examples/embed -backends http://127.0.0.1:8001,http://127.0.0.1:8002
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

var (
	addr     = flag.String("addr", "127.0.0.1:8000", "listen address")
	backends = flag.String("backends", "http://127.0.0.1:8001,http://127.0.0.1:8002", "vLLM base URLs")
	noCredit = flag.Bool("no-credit", false, "count a forwarded request as load only once /metrics shows it")
)

func main() {
	flag.Parse()
	// The gateway reads each server's /metrics, queues requests by band
	// and releases each band as the servers' load allows.
	cfg := flowhttp.GatewayConfig{Endpoints: strings.Split(*backends, ","), NoCredit: *noCredit}
	gw, err := flowhttp.NewGateway(cfg)
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(gw.Collector())
	rt := gw.Router()
	proxies := map[string]*httputil.ReverseProxy{}
	for _, b := range rt.Endpoints() {
		target, _ := url.Parse(b) // NewGateway checked it
		proxies[b] = httputil.NewSingleHostReverseProxy(target)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b := rt.Route(w)         // your routing: Route picks the least loaded server
		defer gw.Forward(w, b)() // counts as load on b until the answer is copied
		proxies[b].ServeHTTP(w, r)
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Serves mux behind the queues, with bounded timeouts, until SIGTERM;
	// then answers what is queued and drains what is in flight.
	if err := gw.ListenAndServe(ctx, *addr, mux, flowhttp.ServerConfig{}); err != nil {
		log.Fatal(err)
	}
}
