package flowcontrol_test

import (
	"errors"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// fairnessInvalid is the model of the fairness fields' validation: the
// field the error must name, or "" for a valid band.
func fairnessInvalid(b flowcontrol.BandConfig) string {
	switch b.Fairness {
	case "", flowcontrol.FairnessFCFS, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare:
	default:
		return "Bands[0].Fairness"
	}
	switch b.Ordering {
	case "", flowcontrol.OrderingFCFS, flowcontrol.OrderingEDF:
	default:
		return "Bands[0].Ordering"
	}
	if b.FlowCapacity < 0 || b.FlowCapacity > b.Capacity {
		return "Bands[0].FlowCapacity"
	}
	if b.FlowIdle < 0 {
		return "Bands[0].FlowIdle"
	}
	fcfs := b.Fairness == "" || b.Fairness == flowcontrol.FairnessFCFS
	if fcfs && b.FlowCapacity != 0 {
		return "Bands[0].FlowCapacity"
	}
	if fcfs && b.Ordering == flowcontrol.OrderingEDF {
		return "Bands[0].Ordering"
	}
	return ""
}

// FuzzFairnessConfig fuzzes the fairness fields of a band (Fairness,
// Ordering, FlowCapacity, FlowIdle) against the model above: an invalid band
// is an ErrInvalidConfig error prefixed "flowcontrol: " naming exactly the
// field; a valid one is accepted, handed back by BandConfigs as given, and
// its per-flow capacity holds: a flow takes FlowCapacity
// items then ErrFlowFull, another flow still gets in.
func FuzzFairnessConfig(f *testing.F) {
	f.Add("", "", 0, int64(0), 4)
	f.Add("fcfs", "fcfs", 0, int64(0), 4)
	f.Add("round-robin", "edf", 2, int64(time.Second), 4)
	f.Add("fair-share", "", 4, int64(0), 4)
	f.Add("fair-share", "edf", 5, int64(0), 4)  // FlowCapacity > Capacity
	f.Add("fcfs", "edf", 0, int64(0), 4)        // edf needs flows
	f.Add("", "", 1, int64(0), 4)               // FlowCapacity needs flows
	f.Add("Round-Robin", "", 0, int64(0), 4)    // names are exact
	f.Add("fair-share", "lifo", 0, int64(0), 4) // unknown ordering
	f.Add("round-robin", "", -1, int64(0), 4)   // negative capacity
	f.Add("round-robin", "", 0, int64(-1), 4)   // negative idle
	f.Add("global-strict", "", 0, int64(0), 4)  // llm-d's name is not ours
	f.Fuzz(func(t *testing.T, fairness, ordering string, flowCap int, idle int64, capacity int) {
		if capacity < 1 || capacity > 64 {
			t.Skip()
		}
		bc := flowcontrol.BandConfig{Capacity: capacity, Fairness: fairness, Ordering: ordering, FlowCapacity: flowCap, FlowIdle: time.Duration(idle)}
		want := fairnessInvalid(bc)
		var r rec
		d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: []flowcontrol.BandConfig{bc}, Source: newSat(1)}, Dispatch: r.dispatch})
		if want != "" {
			checkConfigError(t, "NewDispatcher", err, []string{want})
			return
		}
		if err != nil {
			t.Fatalf("valid band %+v refused: %v", bc, err)
		}
		defer d.Close()
		// The fairness fields come back as given (defaults are resolved
		// inside, not written back).
		if got := d.BandConfigs()[0]; got.Fairness != fairness || got.Ordering != ordering || got.FlowIdle != bc.FlowIdle || got.FlowCapacity != flowCap {
			t.Fatalf("band %+v came back as %+v", bc, got)
		}
		if flowCap == 0 {
			return
		}
		for i := range flowCap {
			if err := d.EnqueueFlow(0, "a", 1, time.Time{}, i); err != nil {
				t.Fatalf("item %d of FlowCapacity %d: %v", i, flowCap, err)
			}
		}
		// The band is checked first: at FlowCapacity = Capacity the band
		// is full before the flow is.
		err = d.EnqueueFlow(0, "a", 1, time.Time{}, -1)
		if flowCap < capacity && !errors.Is(err, flowcontrol.ErrFlowFull) ||
			flowCap == capacity && (!errors.Is(err, flowcontrol.ErrQueueFull) || errors.Is(err, flowcontrol.ErrFlowFull)) {
			t.Fatalf("beyond FlowCapacity %d of %d: %v", flowCap, capacity, err)
		}
		if flowCap < capacity {
			if err := d.EnqueueFlow(0, "b", 1, time.Time{}, -1); err != nil {
				t.Fatalf("another flow refused: %v", err)
			}
		}
	})
}
