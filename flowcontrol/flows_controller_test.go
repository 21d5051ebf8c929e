package flowcontrol_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// WaitRequest's done charges the flow what it really served: a flow that
// estimated 1 and served 100 goes behind a flow that served what it
// estimated, until the two are even again.
func TestWaitRequestServedCharges(t *testing.T) {
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands: flowBand(flowcontrol.FairnessShare, 64), Burst: 1, Source: newSat(0), Policy: everyPolicy(2)}, Stepped: true})
	defer c.Close()
	type res struct {
		flow string
		waitResult
	}
	out := make(chan res, 64)
	wait := func(flow string, n int) {
		for range n {
			go func() {
				r := &flowcontrol.Request{Flow: flow, Cost: 1}
				done, err := c.WaitRequest(context.Background(), 0, r)
				r.Served = 1
				if flow == "greedy" {
					r.Served = 100
				}
				out <- res{flow, waitResult{done, err}}
			}()
		}
	}
	// release steps until one waiter is released (Every 2: two steps).
	release := func() res {
		c.Step()
		c.Step()
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.done() // reports Served
		return r
	}
	wait("greedy", 1)
	wait("modest", 1)
	waitQueued(c, 0, 2)
	release()
	release()
	// Both served once; greedy 100, modest 1. Now both backlogged.
	wait("greedy", 3)
	waitQueued(c, 0, 3)
	wait("modest", 5)
	waitQueued(c, 0, 8)
	var order []string
	for range 8 {
		order = append(order, release().flow)
	}
	// modest's five go before greedy's next (greedy's finish tag is 100
	// virtual units ahead); then greedy.
	for i, f := range order {
		if want := map[bool]string{true: "modest", false: "greedy"}[i < 5]; f != want {
			t.Fatalf("release order %v: greedy must wait for the 99 units it under-estimated", order)
		}
	}
	st := c.Stats().Bands[0]
	if st.Dispatched != 10 || st.Queued != 0 || c.InFlight() != 0 {
		t.Fatalf("stats %+v, in flight %d", st, c.InFlight())
	}
}

// Race stress: many goroutines WaitRequest on a few flows of two flow bands
// (one gated) with FlowCapacity and random deadlines and cancellations, on a
// running controller; afterwards every outcome each Wait returned is
// counted exactly once in Stats, and nothing is left queued or in flight.
func TestWaitRequestStress(t *testing.T) {
	sat := newSat(0.8) // band 1 of 2 gated
	bands := []flowcontrol.BandConfig{
		{Capacity: 32, Fairness: flowcontrol.FairnessShare, FlowCapacity: 8, Ordering: flowcontrol.OrderingEDF, MaxWait: 2 * time.Millisecond},
		{Capacity: 16, Fairness: flowcontrol.FairnessRoundRobin, FlowCapacity: 4, MaxWait: time.Millisecond},
	}
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: sat, Tick: 100 * time.Microsecond}})
	ctx, stop := context.WithCancel(context.Background())
	runDone := c.Start(ctx)
	const workers, per = 8, 400
	var ok, cancelled, expired, flowFull, full [2]atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range per {
				band := rng.IntN(2)
				r := &flowcontrol.Request{Flow: flowName(rng.IntN(5)), Cost: float64(1 + rng.IntN(100))}
				if rng.IntN(3) == 0 {
					r.Deadline = time.Now().Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
				}
				wctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					go cancel()
				}
				done, err := c.WaitRequest(wctx, band, r)
				cancel()
				switch {
				case err == nil:
					ok[band].Add(1)
					r.Served = float64(rng.IntN(200))
					done()
					done() // a second call does nothing
				case errors.Is(err, flowcontrol.ErrCancelled):
					cancelled[band].Add(1)
				case errors.Is(err, flowcontrol.ErrExpired):
					expired[band].Add(1)
				case errors.Is(err, flowcontrol.ErrFlowFull):
					flowFull[band].Add(1)
				case errors.Is(err, flowcontrol.ErrQueueFull):
					full[band].Add(1)
				default:
					t.Errorf("WaitRequest: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	stop()
	<-runDone
	c.Close()
	st := c.Stats()
	for b, bs := range st.Bands {
		if bs.Dispatched != ok[b].Load() || bs.Cancelled+bs.Refused.Cancelled != cancelled[b].Load() ||
			bs.Expired != expired[b].Load() || bs.FlowFull != flowFull[b].Load() || bs.Rejected != full[b].Load() ||
			bs.Queued != 0 || bs.Closed != 0 {
			t.Errorf("band %d: stats %+v; waits returned ok %d cancelled %d expired %d flowFull %d full %d", b, bs,
				ok[b].Load(), cancelled[b].Load(), expired[b].Load(), flowFull[b].Load(), full[b].Load())
		}
		for _, f := range c.Flows(b) {
			if f.Queued != 0 {
				t.Errorf("band %d flow %s: %d queued after Close", b, f.Flow, f.Queued)
			}
		}
	}
	var sum uint64
	for b := range 2 {
		sum += ok[b].Load() + cancelled[b].Load() + expired[b].Load() + flowFull[b].Load() + full[b].Load()
	}
	if sum != workers*per {
		t.Errorf("%d outcomes for %d waits", sum, workers*per)
	}
	if c.InFlight() != 0 {
		t.Errorf("in flight %d", c.InFlight())
	}
	t.Logf("band 0: %+v", st.Bands[0])
	t.Logf("band 1: %+v", st.Bands[1])
}
