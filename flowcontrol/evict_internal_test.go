package flowcontrol

import (
	"fmt"
	"testing"
	"time"
)

type fixedSat float64

func (s fixedSat) Saturation() float64 { return float64(s) }

// TestEvictorForgetsIdleEndpoints: an endpoint with nothing tracked and
// nothing left to pace is forgotten at the next Check, so a host whose
// endpoints come and go (pods rescheduled) does not accumulate them; one
// still within the grace of its last eviction is kept until it ends.
func TestEvictorForgetsIdleEndpoints(t *testing.T) {
	now := time.Unix(0, 0)
	e, err := NewEvictor(EvictionConfig{KVUsage: func(string) float64 { return 1 }}, 2, fixedSat(1), nil,
		func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		e.Track(1, fmt.Sprint("pod-", i), func() {}).Done()
	}
	victim := e.Track(1, "kept", func() {})
	e.Track(0, "kept", func() {}).Done()
	held := e.Track(0, "kept", func() {})
	now = now.Add(DefaultEvictionStall)
	if n := e.Check(); n != 1 {
		t.Fatalf("Check took %d, want the victim", n)
	}
	victim.Done()
	held.Done()
	if len(e.eps) != 1 || len(e.order) != 1 || e.order[0].name != "kept" {
		t.Fatalf("after the Check: %d endpoints known (%d ordered), want only the one in its grace", len(e.eps), len(e.order))
	}
	now = now.Add(DefaultEvictionGrace)
	e.Check()
	if len(e.eps) != 0 || len(e.order) != 0 {
		t.Fatalf("%d endpoints still known (%d ordered) with nothing tracked or paced", len(e.eps), len(e.order))
	}
	if st := e.Stats(); st.Tracked != 0 || st.Evicting != 0 {
		t.Fatalf("Stats %+v", st)
	}
}
