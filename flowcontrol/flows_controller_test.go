package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// Charge moves a fair-share flow's finish tag: a flow that estimated 1 and
// served 100 goes behind a flow that served what it estimated, until the
// two are even again. (That WaitRequest's done charges Served − Cost is
// TestDoneServedCharges, inside the package.)
func TestChargeReorders(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: flowBand(flowcontrol.FairnessShare, 64), Burst: 1, Source: newSat(0), BlockCritical: true, Policy: everyPolicy(2)}}, &r)
	defer d.Close()
	id := 0
	enq := func(flow string, n int) {
		for range n {
			if err := d.EnqueueFlow(0, flow, 1, time.Time{}, id); err != nil {
				t.Fatal(err)
			}
			id++
		}
	}
	flowOf := func(item int) string {
		if item == 0 || item >= 2 && item < 5 {
			return "greedy"
		}
		return "modest"
	}
	var order []string
	steps := func(n int) {
		for range n {
			d.Step()
			for _, e := range r.take() {
				order = append(order, flowOf(e.item))
			}
		}
	}
	enq("greedy", 1) // item 0
	enq("modest", 1) // item 1
	steps(4)
	d.Charge(0, "greedy", 99) // served 100, estimated 1
	d.Charge(0, "modest", 0)
	enq("greedy", 3) // items 2..4
	enq("modest", 5) // items 5..9
	order = order[:0]
	steps(16)
	want := []string{"modest", "modest", "modest", "modest", "modest", "greedy", "greedy", "greedy"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("release order %v, want %v: greedy must wait for the 99 units it under-estimated", order, want)
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
		// FlowIdle 1 ms: flows are forgotten while producers race to use them.
		{Capacity: 16, Fairness: flowcontrol.FairnessRoundRobin, FlowCapacity: 4, MaxWait: time.Millisecond, FlowIdle: time.Millisecond},
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
				p, err := c.WaitRequest(wctx, band, r)
				cancel()
				switch {
				case err == nil:
					ok[band].Add(1)
					r.Served = float64(rng.IntN(200))
					p.Done()
					p.Done() // a second call does nothing
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

// Wait on a band with fairness queues in DefaultFlow; WaitRequest on an fcfs
// band is Wait (its flow ignored, no flow kept); a nil Request is Wait.
func TestWaitOnFlowBands(t *testing.T) {
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands:  []flowcontrol.BandConfig{{Capacity: 4}, {Capacity: 4, Fairness: flowcontrol.FairnessRoundRobin}},
		Source: newSat(0)}, Stepped: true})
	defer c.Close()
	release := func(band int, r *flowcontrol.Request) {
		t.Helper()
		ch := make(chan error, 1)
		go func() {
			var p flowcontrol.Permit
			var err error
			if r == nil {
				p, err = c.Wait(context.Background(), band)
			} else {
				p, err = c.WaitRequest(context.Background(), band, r)
			}
			p.Done() // the zero Permit on an error: does nothing
			ch <- err
		}()
		for {
			c.Step()
			select {
			case err := <-ch:
				if err != nil {
					t.Fatal(err)
				}
				return
			default:
				runtimeGosched()
			}
		}
	}
	release(1, nil)
	release(1, &flowcontrol.Request{Flow: "a"})
	release(0, &flowcontrol.Request{Flow: "a"})
	release(0, nil)
	got := map[string]uint64{}
	for _, f := range c.Flows(1) {
		got[f.Flow] = f.Dispatched
	}
	if len(got) != 2 || got[flowcontrol.DefaultFlow] != 1 || got["a"] != 1 {
		t.Fatalf("band 1 flows %v, want %s and a, one each", got, flowcontrol.DefaultFlow)
	}
	if f := c.Flows(0); f != nil {
		t.Fatalf("fcfs band reports flows %v", f)
	}
	if st := c.Stats(); st.Bands[0].Dispatched != 2 || st.Bands[1].Dispatched != 2 || st.Bands[0].Flows != 0 || st.Bands[1].Flows != 2 {
		t.Fatalf("stats %+v", st.Bands)
	}
}
