package flowhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// inFlightShare is the saturation of a backend that serves limit requests at
// once: the controller's released requests over limit; 1 (full) while held.
type inFlightShare struct {
	c     *flowcontrol.Controller
	limit float64
	held  atomic.Bool
}

func (s *inFlightShare) Saturation() float64 {
	if s.held.Load() {
		return 1
	}
	return float64(s.c.InFlight()) / s.limit
}

// criticalWaits runs a backend of limit slots, each request taking service,
// behind a gateway whose bands are bands (band 0 gated like any, so that
// critical requests queue), queues flood critical requests from tenant "a"
// and then victim critical requests from tenant "b" while the backend reads
// full, and opens it. It returns b's waits from the opening to their
// release, sorted: every request's wait, with all of them queued at once.
// It runs in a testing/synctest bubble: the controller's ticks, the service
// time and the waits are on the bubble's fake clock, so the figures do not
// depend on how busy the machine is.
func criticalWaits(t *testing.T, bands []flowcontrol.BandConfig, flood, victim, limit int, service time.Duration) (waits []time.Duration) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) { waits = criticalWaitsIn(t, bands, flood, victim, limit, service) })
	return waits
}

func criticalWaitsIn(t *testing.T, bands []flowcontrol.BandConfig, flood, victim, limit int, service time.Duration) []time.Duration {
	t.Helper()
	src := &inFlightShare{limit: float64(limit)}
	src.held.Store(true)
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands: bands, Source: src, Policy: flowcontrol.NewStatic(1), BlockCritical: true}})
	if err != nil {
		t.Fatal(err)
	}
	src.c = c
	ran := c.Start(context.Background())
	defer func() { c.Close(); <-ran }()
	var mu sync.Mutex
	var waits []time.Duration
	var opened time.Time // written before the gate opens, read after
	next := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "b" {
			mu.Lock()
			waits = append(waits, time.Since(opened))
			mu.Unlock()
		}
		time.Sleep(service)
	})
	h := flowhttp.Handler(c, next, flowhttp.Options{
		// Every tenant may use the critical band; the client's own
		// fairness id is ignored.
		Identify: func(r *http.Request) (flowhttp.Identity, bool) {
			return flowhttp.Identity{Ceiling: 0, Flow: r.Header.Get("X-Tenant")}, true
		},
	})
	send := func(wg *sync.WaitGroup, tenant string, n int) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`))
				req.Header.Set("X-Tenant", tenant)
				req.Header.Set(flowhttp.FairnessIDHeader, tenant+string(rune('0'+i%10))) // ignored: an identity exists
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
		}
	}
	var wg sync.WaitGroup
	send(&wg, "a", flood)
	waitFor(t, "the flood queued", func() bool { return c.Stats().Bands[0].Queued == flood })
	send(&wg, "b", victim)
	waitFor(t, "every request queued", func() bool { return c.Stats().Bands[0].Queued == flood+victim })
	opened = time.Now()
	src.held.Store(false)
	wg.Wait()
	slices.Sort(waits)
	return waits
}

// p99 is the nearest-rank 99th percentile of sorted waits.
func p99(sorted []time.Duration) time.Duration {
	return sorted[(len(sorted)*99+99)/100-1]
}

// One tenant's flood of critical requests adds no more than its fair share
// to another critical tenant's wait: with the default bands (round-robin
// between identities), tenant b's 20 requests wait as long beside a's 300
// as beside a's 20 (a tenant like b), about twice their wait alone (b has
// half the backend instead of all of it). With fcfs they wait behind the
// whole flood.
func TestCriticalFloodFairness(t *testing.T) {
	const victim, limit, service = 20, 4, 10 * time.Millisecond
	bands := flowhttp.DefaultBands()
	alone := p99(criticalWaits(t, bands, 0, victim, limit, service))
	equal := p99(criticalWaits(t, bands, victim, victim, limit, service))
	flooded := p99(criticalWaits(t, bands, 300, victim, limit, service))
	t.Logf("tenant b's p99 wait: alone %v, beside 20 of a's %v, beside 300 of a's %v", alone, equal, flooded)
	if flooded > 2*equal+5*time.Millisecond {
		t.Errorf("flooded p99 %v over twice the p99 beside an equal tenant (%v)", flooded, equal)
	}
	if flooded > 3*alone {
		t.Errorf("flooded p99 %v over three times the p99 alone (%v)", flooded, alone)
	}
	fcfs := flowhttp.DefaultBands()
	for i := range fcfs {
		fcfs[i].Fairness = flowcontrol.FairnessFCFS
	}
	t.Logf("with fcfs bands, beside 300 of a's: %v", p99(criticalWaits(t, fcfs, 300, victim, limit, service)))
}
