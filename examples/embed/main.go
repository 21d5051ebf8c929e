// Command embed is the README's embedding example: a protected inference
// gateway in front of vLLM servers, written against flowgate's public API
// only (flowhttp.Gateway). Its routing, the least-loaded endpoint (for a
// critical request, with -backend-priority, among those with room in their
// KV cache: flowhttp.Router.Route), is the one line a host would replace
// with its own.
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
	backends = flag.String("backends", "http://127.0.0.1:8001,http://127.0.0.1:8002", "the model servers' base URLs, comma-separated")
	noCredit = flag.Bool("no-credit", false, "turn the in-flight credit off (to measure what it does)")
	priority = flag.Bool("backend-priority", false, "the servers run --scheduling-policy priority: write each request's band into its body, route critical ones by KV headroom")
)

func main() {
	flag.Parse()
	cfg := flowhttp.GatewayConfig{Endpoints: strings.Split(*backends, ","), NoCredit: *noCredit}
	if *priority {
		cfg.HTTP.ForwardPriority = flowhttp.PrioritySet // and the critical routing on (Route)
	}
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
		b := rt.Route(w)         // the host's routing: least loaded, critical by KV room
		defer gw.Forward(w, b)() // counted on b until the answer is copied
		proxies[b].ServeHTTP(w, r)
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := gw.ListenAndServe(ctx, *addr, mux, flowhttp.ServerConfig{}); err != nil {
		log.Fatal(err)
	}
}
