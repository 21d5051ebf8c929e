package flowcontrol

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// TestDoneServedCharges: the Done of WaitRequest's Permit charges the
// request's flow Served − Cost, once (a second Done does nothing), and
// nothing when Served is left 0.
func TestDoneServedCharges(t *testing.T) {
	c, err := NewController(ControllerConfig{Config: Config{
		Bands:  []BandConfig{{Capacity: 4, Fairness: FairnessShare}},
		Source: satConst(0),
	}, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(r *Request) Permit {
		ch := make(chan Permit, 1)
		go func() {
			p, err := c.WaitRequest(context.Background(), 0, r)
			if err != nil {
				t.Error(err)
			}
			ch <- p
		}()
		for {
			c.Step()
			select {
			case p := <-ch:
				return p
			default:
			}
		}
	}
	charge := func() float64 {
		return math.Float64frombits(c.d.bands[0].flows.find("a").charge.Load())
	}
	r := &Request{Flow: "a", Cost: 10}
	p := get(r)
	r.Served = 25
	p.Done()
	p.Done()
	if got := charge(); got != 15 {
		t.Fatalf("charge %v after Served 25 on Cost 10, want 15", got)
	}
	// The next request of the flow starts after the corrected finish
	// (10 + 15) and, with Served left 0, finishes at its estimate.
	r2 := &Request{Flow: "a", Cost: 10}
	get(r2).Done()
	if f := c.d.bands[0].flows.find("a"); charge() != 0 || f.finish != 35 {
		t.Fatalf("charge %v, finish %v: want 0 and 35", charge(), f.finish)
	}
}

type satConst float64

func (s satConst) Saturation() float64 { return float64(s) }

// TestPinnedWhileInFlight: a flow whose WaitRequest is released and still in
// flight is not forgotten however long past FlowIdle, so the correction its
// Done reports lands on it (its finish tag moves); once its Done ran, a
// correction applied and its busy period over, it is forgotten.
func TestPinnedWhileInFlight(t *testing.T) {
	var clock atomic.Int64
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	c, err := NewController(ControllerConfig{Config: Config{
		Bands:  []BandConfig{{Capacity: 4, Fairness: FairnessShare, FlowIdle: time.Millisecond}},
		Source: satConst(0), Now: now,
	}, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &Request{Flow: "long", Cost: 10}
	ch := make(chan Permit, 1)
	go func() {
		p, err := c.WaitRequest(context.Background(), 0, r)
		if err != nil {
			t.Error(err)
		}
		ch <- p
	}()
	var p Permit
	for p == (Permit{}) {
		c.Step()
		select {
		case p = <-ch:
		default:
		}
	}
	known := func() bool { return len(c.Flows(0)) == 1 }
	for range 10 {
		clock.Add(int64(time.Millisecond))
		c.Step()
	}
	if !known() {
		t.Fatal("a flow with a request in flight was forgotten")
	}
	r.Served = 30
	p.Done()
	c.Step() // applies the correction: finish 10 → max(V 10, 10) + 20
	if f := c.d.bands[0].flows.find("long"); f.finish != 30 {
		t.Fatalf("finish %v after the correction, want 30", f.finish)
	}
	// Ahead of the virtual time by its correction, the flow is kept
	// until another busy period ends past it.
	for range 10 {
		clock.Add(int64(time.Millisecond))
		c.Step()
	}
	if !known() {
		t.Fatal("forgotten while its correction is ahead of the virtual time")
	}
	_ = c.d.EnqueueFlow(0, "other", 1, time.Time{}, &ticket{c: c, ch: make(chan struct{}, 1)})
	for range 10 {
		clock.Add(int64(time.Millisecond))
		c.Step()
	}
	// other's busy period ended at the largest finish tag (long's):
	// both are behind the virtual time, idle, and forgotten.
	if fl := c.Flows(0); len(fl) != 0 {
		t.Fatalf("flows %v: long should be forgotten once a busy period ended past it", fl)
	}
}
