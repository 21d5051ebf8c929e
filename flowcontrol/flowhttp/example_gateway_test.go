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
)

// A protected gateway in front of a model server: the host routes (here to
// the one endpoint) and tells Forward where each request went; everything
// else is the gateway's. The server reports 10 waiting requests, so the
// pool reads saturated: a critical request passes, one without an objective
// waits as sheddable and gives up after its 50 ms (503 expired).
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
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{model.URL}, Flow: flowcontrol.Config{Bands: bands}})
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
