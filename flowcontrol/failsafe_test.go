package flowcontrol_test

import (
	"math"
	"testing"

	"github.com/flowgate/flowgate/flowcontrol"
)

// TestFailSafeBadSaturation: each bad reading a source can return, end to
// end through the dispatcher (two bands, soft-reflective, one item queued in
// each): the tick records the sanitised value, band 0 is dispatched at
// once, and the sheddable band does what the documented fail-safe says —
// NaN reads as 1 (waits), +Inf and huge values as MaxSaturation (wait),
// negative values and −Inf as 0 (go). A band that waits is released, not
// lost, once the reading is sane again.
func TestFailSafeBadSaturation(t *testing.T) {
	for _, c := range []struct {
		name      string
		raw, want float64
		shedGoes  bool
	}{
		{"NaN", math.NaN(), 1, false},
		{"+Inf", math.Inf(1), flowcontrol.MaxSaturation, false},
		{"MaxFloat64", math.MaxFloat64, flowcontrol.MaxSaturation, false},
		{"-Inf", math.Inf(-1), 0, true},
		{"negative", -0.5, 0, true},
		{"negative zero", math.Copysign(0, -1), 0, true},
		{"smallest negative", -math.SmallestNonzeroFloat64, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sat := newSat(c.raw)
			var r rec
			d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 4), Source: sat}}, &r)
			for band := range 2 {
				if err := d.Enqueue(band, band); err != nil {
					t.Fatal(err)
				}
			}
			d.Step()
			st := d.Stats()
			if st.Saturation != c.want {
				t.Fatalf("tick read %v as %v, want %v", c.raw, st.Saturation, c.want)
			}
			got := map[int]bool{}
			for _, e := range r.take() {
				if e.reason != nil {
					t.Fatalf("item %d dropped: %v", e.item, e.reason)
				}
				got[e.band] = true
			}
			if !got[0] {
				t.Fatalf("critical band not dispatched at saturation %v", c.raw)
			}
			if got[1] != c.shedGoes {
				t.Fatalf("sheddable dispatched = %v at %v, want %v (gate %+v)", got[1], c.raw, c.shedGoes, st.Bands[1].Gate)
			}
			if !c.shedGoes {
				sat.Set(0.2)
				d.Step()
				if ev := r.take(); len(ev) != 1 || ev[0].band != 1 || ev[0].reason != nil {
					t.Fatalf("held sheddable item after recovery: %+v", ev)
				}
			}
		})
	}
}
