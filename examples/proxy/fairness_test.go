package main

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// A band's fairness, ordering and per-flow capacity come from flowgate's keys
// or from llm-d's policy references (a plugin's name or a policy type), the
// template's apply to bands that set none, and bad or contradicting values are
// refused naming the field.
func TestParseConfigFairness(t *testing.T) {
	parse := func(src string) (gateway.Config, error) { return gateway.ParseConfig(strings.NewReader(src)) }
	cfg, err := parse(`
plugins:
- {name: rr, type: round-robin-fairness-policy}
- {name: deadline, type: slo-deadline-ordering-policy}
- type: program-aware-fairness
flowControl:
  defaultPriorityBand: {fairnessPolicyRef: rr}
  priorityBands:
  - {priority: 10, name: critical}
  - {priority: 0, name: standard, fairnessPolicyRef: program-aware-fairness, orderingPolicyRef: deadline}
  - {priority: -1, name: batch, fairness: fair-share, fairnessPolicyRef: program-aware-fairness, ordering: edf, flowCapacity: 3}
  - {priority: -2, name: bulk, fairness: fcfs}
`)
	require.NoError(t, err)
	type q struct{ fairness, ordering string }
	var got []q
	for _, b := range cfg.Bands {
		got = append(got, q{b.Fairness, b.Ordering})
	}
	require.Equal(t, []q{
		{flowcontrol.FairnessRoundRobin, ""}, // the template's plugin, by name
		{flowcontrol.FairnessShare, flowcontrol.OrderingEDF},
		{flowcontrol.FairnessShare, flowcontrol.OrderingEDF},
		{flowcontrol.FairnessFCFS, ""},
	}, got)
	require.Equal(t, []int{0, 0, 3, 0}, []int{cfg.Bands[0].FlowCapacity, cfg.Bands[1].FlowCapacity,
		cfg.Bands[2].FlowCapacity, cfg.Bands[3].FlowCapacity})
	warnings := strings.Join(cfg.Warnings, "\n")

	// Without priorityBands, flowgate's default bands take the template's.
	def, err := parse("flowControl:\n  defaultPriorityBand: {fairness: fair-share, ordering: edf, flowCapacity: 7}\n")
	require.NoError(t, err)
	for _, b := range def.Bands {
		require.Equal(t, [3]any{flowcontrol.FairnessShare, flowcontrol.OrderingEDF, 7}, [3]any{b.Fairness, b.Ordering, b.FlowCapacity}, b.Name)
	}
	require.Contains(t, warnings, `flowControl.priorityBands[1].fairnessPolicyRef (line 10): "program-aware-fairness" is approximated by flowgate's fair-share`)

	for _, tc := range []struct{ name, src, want string }{
		{"unknown fairness ref", "flowControl:\n  priorityBands:\n    - {priority: 1, fairnessPolicyRef: lottery}\n",
			`flowControl.priorityBands[0].fairnessPolicyRef (line 3): "lottery" is neither a declared plugin of, nor one of, the types`},
		{"fairness ref to an ordering plugin", "plugins:\n- {name: o, type: edf-ordering-policy}\nflowControl:\n  priorityBands:\n    - {priority: 1, fairnessPolicyRef: o}\n",
			`fairnessPolicyRef (line 5): "o" is neither`},
		{"unknown fairness", "flowControl:\n  priorityBands:\n    - {priority: 1, fairness: lottery}\n",
			`flowControl.priorityBands[0].fairness (line 3): "lottery" must be one of fair-share, fcfs, round-robin`},
		{"unknown ordering", "flowControl:\n  priorityBands:\n    - {priority: 1, ordering: lifo}\n",
			`ordering (line 3): "lifo" must be one of edf, fcfs`},
		{"contradiction", "flowControl:\n  priorityBands:\n    - {priority: 1, fairness: fcfs, fairnessPolicyRef: round-robin-fairness-policy}\n",
			`fairness (line 3): "fcfs" contradicts fairnessPolicyRef "round-robin-fairness-policy" (round-robin): give one`},
		{"negative flow capacity", "flowControl:\n  priorityBands:\n    - {priority: 1, flowCapacity: -1}\n",
			`flowCapacity (line 3): must be in [0, 4194304], got`},
		{"flow capacity on an fcfs band", "flowControl:\n  priorityBands:\n    - {name: a, priority: 1, flowCapacity: 2}\n",
			`flowControl.priorityBands[0].flowCapacity (line 3): band "a": a per-flow capacity needs fairness round-robin or fair-share (the band has "fcfs")`},
		{"flow capacity above capacity", "flowControl:\n  priorityBands:\n    - {name: a, priority: 1, capacity: 4, fairness: round-robin, flowCapacity: 5}\n",
			`band "a": 5 exceeds the band's capacity 4`},
		{"template flow capacity on default bands", "flowControl:\n  defaultPriorityBand: {flowCapacity: 2}\n",
			`flowControl.defaultPriorityBand.flowCapacity (line 2): band "critical": a per-flow capacity needs fairness`},
		{"template key", "flowControl:\n  defaultPriorityBand: {fairness: lottery}\n",
			`flowControl.defaultPriorityBand.fairness (line 2): "lottery" must be one of`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(tc.src)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Through the proxy, a blocked round-robin band with FlowCapacity 1 holds one
// request per tenant (the fairness-id header): a tenant's second request gets
// 429 flow-full at once while another tenant's still queues, and each queued
// request ends exactly once when the band's max wait passes.
func TestProxyFlowCapacityPerTenant(t *testing.T) {
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {})
	cfg := testConfig()
	cfg.Bands[1].Fairness, cfg.Bands[1].FlowCapacity = flowcontrol.FairnessRoundRobin, 1
	cfg.Bands[1].MaxWait = time.Minute
	p, srv := runGateway(t, cfg, gateway.Options{}, true, b.srv.URL)
	require.Equal(t, flowcontrol.FairnessRoundRobin, p.Controller().Bands()[1].Fairness)
	b.saturated.Store(true)
	gatedNow(t, p)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(ctx context.Context, tenant string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
		req.Header.Set(gateway.ObjectiveHeader, "sheddable")
		req.Header.Set(flowhttp.FairnessIDHeader, tenant)
		return http.DefaultClient.Do(req)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, tenant := range []string{"noisy", "quiet"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := send(ctx, tenant)
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
		eventually(t, tenant+"'s first request queued", func() bool {
			for _, f := range p.Controller().Flows(1) {
				if f.Flow == tenant && f.Queued == 1 {
					return true
				}
			}
			return false
		})
	}
	// Bounded: without the per-flow bound it would queue for the band's minute.
	third, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	resp, err := send(third, "noisy")
	require.NoError(t, err, "the noisy tenant's second request was queued, not refused")
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, flowhttp.ReasonFlowFull, resp.Header.Get(gateway.ReasonHeader))
	st := p.Controller().Stats().Bands[1]
	require.Equal(t, 2, st.Queued, "the quiet tenant's request was crowded out")
	require.Equal(t, uint64(1), st.FlowFull)
	require.Equal(t, 2, st.Flows)

	cancel() // the two queued clients give up: each ends once, as cancelled
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, context.Canceled)
	}
	eventually(t, "the queued requests end", func() bool {
		st := p.Controller().Stats().Bands[1]
		return st.Queued == 0 && st.Cancelled == 2
	})
}

// A backlog built while the sheddable band was blocked does not reach the
// pool in one go when the band reopens: with the in-flight credit (the
// proxy's default) each forwarded request counts as waiting at once and the
// proxy re-reads the saturation while it drains, so against one idle-looking
// pod (queue threshold 5, set here) exactly 5 of 20 queued requests are forwarded — 3
// while the band is open (s ≤ 0.5), one at Every 2 (s 0.6), one at Every 4
// (s 0.8), then s = 1 blocks it — however many readings come.
func TestProxyBacklogDoesNotFloodOnReopen(t *testing.T) {
	var reached atomic.Int64
	release := make(chan struct{})
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	cfg := testConfig()
	require.True(t, cfg.Saturation.InFlightCredit, "the proxy's default")
	cfg.Saturation.QueueDepthThreshold = 5 // stated, so the count below is (the default is 6.25: 7 of 20)
	p, srv := runGateway(t, cfg, gateway.Options{}, true, b.srv.URL)
	b.saturated.Store(true)
	gatedNow(t, p)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	const queued = 20
	for range queued {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
			req.Header.Set(gateway.ObjectiveHeader, "sheddable")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	eventually(t, "the backlog queued", func() bool { return p.Controller().Stats().Bands[1].Queued == queued })
	require.Zero(t, reached.Load())

	b.saturated.Store(false) // the pod reads idle: only the credit counts
	eventually(t, "the band reopened and gated itself again", func() bool { return reached.Load() >= 5 })
	// Many readings later, still 5: the credit keeps the band blocked.
	scrapes := p.Poller().ReadingSeq()
	eventually(t, "20 more readings", func() bool { return p.Poller().ReadingSeq() >= scrapes+20 })
	require.Equal(t, int64(5), reached.Load(), "requests forwarded after the band reopened")
	require.Equal(t, queued-5, p.Controller().Stats().Bands[1].Queued)
}
