package redisshare_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/flowgate/flowgate/saturation/redisshare"
	"github.com/prometheus/client_golang/prometheus"
)

// A replica counts its own requests from the start; until its first sync
// succeeds (and whenever Redis fails for longer than TTL) the view is its own
// counts only. This example never contacts Redis.
func ExampleNew() {
	view, err := redisshare.New(redisshare.Options{
		Addr:      "127.0.0.1:6379",
		ReplicaID: "gateway-0",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer view.Close()
	backend := view.Endpoint("10.0.0.7:8000") // keep the handle: no lookup per request
	backend.Inc()
	backend.Inc()
	backend.Dec()
	fmt.Println(view.State(), backend.Own(), backend.Others(), view.InFlight("10.0.0.7:8000"))

	_, err = redisshare.New(redisshare.Options{Addr: "127.0.0.1:6379", ReplicaID: "gateway-0", Period: 10 * time.Millisecond, TTL: 20 * time.Millisecond})
	fmt.Println(errors.Is(err, redisshare.ErrInvalidConfig), err)
	// Output:
	// down 1 0 1
	// true redisshare: invalid configuration: Options.TTL must be >= 4 Periods (40ms), got 20ms
}

// How a proxy wires the shared view: Inc when it dispatches to a backend,
// Dec when the response is done, and the pool-wide count to pick the least
// loaded backend. Run needs a live Redis, so this example has no output.
func Example_proxy() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	host, _ := os.Hostname()
	view, err := redisshare.New(redisshare.Options{Addr: "redis:6379", ReplicaID: host})
	if err != nil {
		panic(err)
	}
	prometheus.MustRegister(view.Collector())
	done := make(chan error, 1)
	go func() { done <- view.Run(ctx) }()
	defer func() { stop(); <-done; _ = view.Close() }()

	backends := []*redisshare.Endpoint{view.Endpoint("10.0.0.7:8000"), view.Endpoint("10.0.0.8:8000")}
	pick := func() *redisshare.Endpoint { // least in-flight, pool-wide
		best := backends[0]
		for _, b := range backends[1:] {
			if b.InFlight() < best.InFlight() {
				best = b
			}
		}
		return best
	}
	http.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) {
		b := pick()
		b.Inc()
		defer b.Dec()
		// ... forward r to b.Name() and copy the response to w ...
	})
}
