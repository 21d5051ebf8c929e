package flowcontrol

import (
	"context"
	"math"
	"testing"
)

// TestDoneServedCharges: WaitRequest's done charges the request's flow
// Served − Cost, once (a second done does nothing), and nothing when Served
// is left 0.
func TestDoneServedCharges(t *testing.T) {
	c, err := NewController(ControllerConfig{Config: Config{
		Bands:  []BandConfig{{Capacity: 4, Fairness: FairnessShare}},
		Source: satConst(0),
	}, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(r *Request) func() {
		ch := make(chan func(), 1)
		go func() {
			done, err := c.WaitRequest(context.Background(), 0, r)
			if err != nil {
				t.Error(err)
			}
			ch <- done
		}()
		for {
			c.Step()
			select {
			case done := <-ch:
				return done
			default:
			}
		}
	}
	charge := func() float64 {
		v, _ := c.d.bands[0].flows.ids.Load("a")
		return math.Float64frombits(v.(*flow[*ticket]).charge.Load())
	}
	r := &Request{Flow: "a", Cost: 10}
	done := get(r)
	r.Served = 25
	done()
	done()
	if got := charge(); got != 15 {
		t.Fatalf("charge %v after Served 25 on Cost 10, want 15", got)
	}
	// The next request of the flow starts after the corrected finish
	// (10 + 15) and, with Served left 0, finishes at its estimate.
	r2 := &Request{Flow: "a", Cost: 10}
	get(r2)()
	v, _ := c.d.bands[0].flows.ids.Load("a")
	if f := v.(*flow[*ticket]); charge() != 0 || f.finish != 35 {
		t.Fatalf("charge %v, finish %v: want 0 and 35", charge(), f.finish)
	}
}

type satConst float64

func (s satConst) Saturation() float64 { return float64(s) }
