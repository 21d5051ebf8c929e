package flowhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// A protected gateway in front of a model server: the host routes (here to
// the one endpoint) and tells Forward where each request went; everything
// else is the gateway's. The server reports 10 waiting requests, so the
// pool reads saturated: a critical request passes, one without an objective
// waits as sheddable and gives up after its 50 ms (503 expired). The gateway
// trusts the objective header, as behind an authenticating front proxy that
// sets it.
func ExampleNewGateway() {
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting 10\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.5\n")
			return
		}
		fmt.Fprint(w, `{"choices":[{"text":"hello"}]}`)
	}))
	defer model.Close()

	bands := flowhttp.DefaultBands()
	bands[1].MaxWait = 50 * time.Millisecond
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{model.URL}, Flow: flowcontrol.Config{Bands: bands},
		HTTP: flowhttp.Options{TrustObjectiveHeader: true}})
	if err != nil {
		log.Fatal(err)
	}
	target, _ := url.Parse(model.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer gw.Forward(w, model.URL)()
		rp.ServeHTTP(w, r)
	})
	if err := gw.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer gw.Close()
	srv := httptest.NewServer(gw.Handler(next))
	defer srv.Close()
	// Before its first scrape an endpoint reads saturated too (score 1):
	// the output does not depend on when the scrape lands.

	for _, objective := range []string{"critical", ""} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
		if objective != "" {
			req.Header.Set(flowhttp.ObjectiveHeader, objective)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %d %q\n", resp.Header.Get(flowhttp.BandHeader), resp.StatusCode, resp.Header.Get(flowhttp.DroppedReasonHeader))
	}
	// Output:
	// critical 200 ""
	// sheddable 503 "expired"
}

// Routing with the critical routing on: the model servers schedule by
// priority (ForwardPriority PrioritySet writes each request's band into its
// body), so a critical request goes to a server with room in its KV cache.
// Server a reports its cache 97 % full, b 30 %: every critical request goes
// to b, whatever the in-flight counts say.
func ExampleRouter_Route() {
	server := func(kv string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc "+kv+"\n")
				return
			}
			fmt.Fprint(w, `{"choices":[{"text":"hello"}]}`)
		}))
	}
	a, b := server("0.97"), server("0.3")
	defer a.Close()
	defer b.Close()
	name := map[string]string{a.URL: "a", b.URL: "b"}

	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{a.URL, b.URL},
		// Behind an authenticating front proxy that sets the objective.
		HTTP: flowhttp.Options{ForwardPriority: flowhttp.PrioritySet, TrustObjectiveHeader: true},
		// Readings good for a minute: the output does not depend on how
		// busy the machine running the example is.
		Poller: saturation.PollerConfig{Scorer: saturation.Scorer{Staleness: time.Minute}}})
	if err != nil {
		log.Fatal(err)
	}
	rt := gw.Router()
	proxies := map[string]*httputil.ReverseProxy{}
	for _, ep := range rt.Endpoints() {
		target, _ := url.Parse(ep)
		proxies[ep] = httputil.NewSingleHostReverseProxy(target)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep := rt.Route(w) // by the request's band (BandOf)
		band, _ := flowhttp.BandOf(w)
		fmt.Printf("band %d → %s\n", band, name[ep])
		defer gw.Forward(w, ep)()
		proxies[ep].ServeHTTP(w, r)
	})
	if err := gw.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer gw.Close()
	// Scrape now rather than wait for the poller's first round.
	if err := gw.Poller().Scrape(context.Background()); err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler(next))
	defer srv.Close()

	fmt.Println("headroom", rt.CriticalKVHeadroom())
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
		req.Header.Set(flowhttp.ObjectiveHeader, "critical")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Output:
	// headroom 0.1
	// band 0 → b
	// band 0 → b
	// band 0 → b
}

// A host with its own routing asks for the critical routing's verdict once
// per pick (one reading for every endpoint) and ranks the endpoints it
// rejects last. Both servers here are above the 10 % headroom line (97 %
// and 95 % full), so band 0 is kept to the one with the most free, b;
// every other band is routed as the host likes.
func ExampleRouter_Eligibility() {
	metrics := func(kv string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc "+kv+"\n")
		}))
	}
	a, b := metrics("0.97"), metrics("0.95")
	defer a.Close()
	defer b.Close()
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{a.URL, b.URL},
		HTTP:   flowhttp.Options{ForwardPriority: flowhttp.PrioritySet, TrustObjectiveHeader: true},
		Poller: saturation.PollerConfig{Scorer: saturation.Scorer{Staleness: time.Minute}}})
	if err != nil {
		log.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Poller().Scrape(context.Background()); err != nil {
		log.Fatal(err)
	}
	for band := range 2 {
		el := gw.Router().Eligibility(band)
		fmt.Printf("band %d: a %v, b %v\n", band, el.Keeps(a.URL), el.Keeps(b.URL))
	}
	// Output:
	// band 0: a false, b true
	// band 1: a true, b true
}
