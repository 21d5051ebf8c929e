package flowhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// runCtrl starts a controller of n open bands for one rapid check.
func runCtrl(t interface{ Fatal(...any) }, bands []flowcontrol.BandConfig) (*flowcontrol.Controller, *saturation.Value, func()) {
	pool := new(saturation.Value)
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: pool}})
	if err != nil {
		t.Fatal(err)
	}
	ran := c.Start(context.Background())
	return c, pool, func() { c.Close(); <-ran }
}

// The header → band mapping against a model: the value matches a band's
// name case-insensitively (the last such band), else "critical" → 0,
// "sheddable" → last, else the classifier, else the default band.
func TestPropertyHeaderToBand(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-zA-Z]{1,3}|critical|sheddable|CRITICAL`), 1, 5, rapid.ID[string]).Draw(t, "names")
		n := len(names)
		bands := make([]flowcontrol.BandConfig, n)
		for i, name := range names {
			bands[i] = flowcontrol.BandConfig{Name: name, Capacity: 4}
		}
		def := rapid.IntRange(-1, n-1).Draw(t, "default")         // -1: DefaultObjective unset
		classified := rapid.IntRange(-1, n).Draw(t, "classified") // -1: declines; n: out of range
		c, _, stop := runCtrl(t, bands)
		defer stop()
		defName, defBand := "", n-1 // unset: the last band
		if def >= 0 {
			defName = names[def]
			for i, name := range names { // the last band of that name, case-insensitively, as the objective map keeps
				if strings.EqualFold(name, defName) {
					defBand = i
				}
			}
		}
		h := flowhttp.Handler(c, ok, flowhttp.Options{TrustObjectiveHeader: true,
			DefaultObjective: defName,
			Classify: func(*http.Request, []byte) (int, bool) {
				return classified, classified >= 0
			},
		})
		for range 5 {
			v := rapid.OneOf(rapid.SampledFrom(names), rapid.StringMatching(`[a-zA-Z]{0,3}|critical|Sheddable|CRITICAL`)).Draw(t, "value")
			legacy := rapid.Bool().Draw(t, "legacy")
			want := -1
			for i, name := range names {
				if v != "" && strings.EqualFold(name, v) {
					want = i
				}
			}
			if want < 0 && v != "" {
				switch {
				case strings.EqualFold(v, "critical"):
					want = 0
				case strings.EqualFold(v, "sheddable"):
					want = n - 1
				}
			}
			fromHeader := want >= 0 // trusted: the header grants
			if want < 0 && classified >= 0 && classified < n {
				want = classified
			}
			if !fromHeader && want < defBand {
				want = defBand // Classify only lowers below the ceiling
			}
			if want < 0 {
				want = defBand
			}
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader("{}"))
			if legacy {
				req.Header.Set(flowhttp.LegacyObjectiveHeader, v)
			} else {
				req.Header.Set(flowhttp.ObjectiveHeader, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if got := rec.Header().Get(flowhttp.BandHeader); got != names[want] || rec.Code != 200 {
				t.Fatalf("names %q value %q: band %q (status %d), want band %d %q", names, v, got, rec.Code, want, names[want])
			}
		}
	})
}

// Every gated request ends in exactly one outcome, whatever the clients
// and the gates do, and the in-flight count returns to 0.
func TestPropertyOneOutcomeEach(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var mu sync.Mutex
		results := map[string]int{}
		capacity := rapid.IntRange(1, 4).Draw(t, "capacity")
		c, pool, stop := runCtrl(t, []flowcontrol.BandConfig{
			{Capacity: capacity},
			{Capacity: capacity, MaxWait: time.Duration(rapid.IntRange(1, 20).Draw(t, "maxWaitMs")) * time.Millisecond,
				MaxBytes: int64(rapid.IntRange(1, 64).Draw(t, "maxBytes"))},
		})
		defer stop()
		pool.Set(rapid.SampledFrom([]float64{0, 0.7, 1}).Draw(t, "saturation"))
		h := flowhttp.Handler(c, ok, flowhttp.Options{
			MaxBodyBytes: 56, // not exceeded: net/http lingers 500 ms on each connection it closes for a large body
			OnFinish: func(_ *http.Request, res flowhttp.Result) {
				mu.Lock()
				results[res.Reason]++
				mu.Unlock()
			},
		})
		var arrived atomic.Int64 // requests that reached the server
		srv := httptest.NewServer(counting(&arrived, h))
		defer srv.Close()
		k := rapid.IntRange(1, 12).Draw(t, "requests")
		var wg sync.WaitGroup
		for i := range k {
			obj := rapid.SampledFrom([]string{"critical", "sheddable", ""}).Draw(t, "objective")
			size := rapid.IntRange(0, 56).Draw(t, "size")
			cancelAfter := time.Duration(rapid.IntRange(0, 10).Draw(t, "cancelMs")) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if i%2 == 1 {
					time.AfterFunc(cancelAfter, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(strings.Repeat("x", size)))
				req.Header.Set(flowhttp.ObjectiveHeader, obj)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		srv.Close() // waits for every handler, cancelled clients' included
		total := 0
		for _, v := range results {
			total += v
		}
		if got := total; int64(got) != arrived.Load() {
			t.Fatalf("%d requests arrived, %d outcomes: %v", arrived.Load(), got, results)
		}
		if n := c.InFlight(); n != 0 {
			t.Fatalf("in flight %d at the end", n)
		}
		// A cancelled waiter's place is given back by the dispatcher's
		// goroutine, just after the waiter returned.
		waitFor(t, "queues empty", func() bool {
			for _, b := range c.Stats().Bands {
				if b.Queued != 0 {
					return false
				}
			}
			return true
		})
		st := c.Stats()
		var dispatched uint64
		for _, b := range st.Bands {
			dispatched += b.Dispatched
			if b.Queued != 0 {
				t.Fatalf("still queued: %+v", st)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		// Forwarded or cancelled mid-response: both were dispatched.
		if fw := results[flowhttp.ReasonForwarded]; uint64(fw) > dispatched {
			t.Fatalf("%d forwarded but %d dispatched: %v", fw, dispatched, results)
		}
	})
}
