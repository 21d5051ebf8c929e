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

// Gate an existing handler: POSTs wait for their band's turn, GETs pass.
// The host's Identify grants the critical band to its operators' key; any
// other caller is held to the sheddable band, whatever header it sends.
func ExampleHandler() {
	var pool saturation.Value // the pool's saturation; a saturation.Poller in production
	bands := []flowcontrol.BandConfig{{Name: "critical", Capacity: 100}, {Name: "sheddable", Capacity: 1000}}
	ctrl, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: &pool}})
	if err != nil {
		log.Fatal(err)
	}
	ctrl.Start(context.Background())
	defer ctrl.Close()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "completed") })
	identify := func(r *http.Request) (flowhttp.Identity, bool) {
		if r.Header.Get("Authorization") == "Bearer ops-key" { // the host's own check
			return flowhttp.Identity{Ceiling: 0, Flow: "ops"}, true
		}
		return flowhttp.Identity{}, false
	}
	srv := httptest.NewServer(flowhttp.Handler(ctrl, api, flowhttp.Options{Identify: identify}))
	defer srv.Close()

	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	req.Header.Set("Authorization", "Bearer ops-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(resp.Header.Get(flowhttp.BandHeader), " ", string(body))
	// Output: critical completed
}

// Wrap an httputil.ReverseProxy: the slot is held until the proxied
// response (streamed or not) has been copied to the client.
func ExampleHandler_reverseProxy() {
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"choices":[{"text":"hello"}]}`)
	}))
	defer model.Close()

	var pool saturation.Value
	bands := []flowcontrol.BandConfig{{Name: "critical", Capacity: 100}, {Name: "sheddable", Capacity: 1000, MaxWait: time.Minute}}
	ctrl, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: &pool}})
	if err != nil {
		log.Fatal(err)
	}
	ctrl.Start(context.Background())
	defer ctrl.Close()
	target, _ := url.Parse(model.URL)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }}
	h := flowhttp.Handler(ctrl, rp, flowhttp.Options{})
	srv := httptest.NewServer(h)
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(resp.Header.Get(flowhttp.BandHeader), " ", string(body))
	// Output: sheddable {"choices":[{"text":"hello"}]}
}
