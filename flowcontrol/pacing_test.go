package flowcontrol_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// seqSat is a saturation source that counts its readings.
type seqSat struct {
	v   float64
	seq atomic.Uint64
}

func (s *seqSat) Saturation() float64 { return s.v }
func (s *seqSat) ReadingSeq() uint64  { return s.seq.Load() }

// pacedDispatcher: two bands at saturation 0.75 (sheddable Every 3),
// Burst 1, the given pacing, 10 sheddable items queued and one tick run.
func pacedDispatcher(t *testing.T, src flowcontrol.SaturationSource, p flowcontrol.Pacing, r *rec) *flowcontrol.Dispatcher[int] {
	t.Helper()
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(2, 64), Source: src, Burst: 1, Pacing: p,
	}}, r)
	for i := range 10 {
		if err := d.Enqueue(1, i); err != nil {
			t.Fatal(err)
		}
	}
	d.Step()
	return d
}

func released(r *rec) int { return len(r.take()) }

// TestPacingCompletions: under Pacing.Completions a gated band counts
// completions, not ticks: no release however many ticks pass without one,
// one Burst per Every completions, at once (Poll), not at the next tick.
func TestPacingCompletions(t *testing.T) {
	var r rec
	d := pacedDispatcher(t, constSat(0.75), flowcontrol.Pacing{Completions: true}, &r)
	for range 100 {
		d.Step()
	}
	if n := released(&r); n != 0 {
		t.Fatalf("%d released with no completion", n)
	}
	for round := range 3 {
		d.Complete()
		d.Complete()
		d.Poll()
		if n := released(&r); n != 0 {
			t.Fatalf("round %d: released after 2 completions (Every 3)", round)
		}
		d.Complete()
		d.Poll()
		if n := released(&r); n != 1 {
			t.Fatalf("round %d: %d released after the 3rd completion, want 1", round, n)
		}
	}
	// Without Pacing.Completions, Complete is a no-op.
	var r2 rec
	d2 := pacedDispatcher(t, constSat(0.75), flowcontrol.Pacing{Floor: time.Hour}, &r2)
	for range 10 {
		d2.Complete()
	}
	d2.Poll()
	if n := released(&r2); n != 0 {
		t.Fatalf("%d released by completions that the pacing does not count", n)
	}
}

// TestPacingReadings: under Pacing.Readings each new reading of a
// ReadingSource is one opportunity; ticks are not.
func TestPacingReadings(t *testing.T) {
	var r rec
	src := &seqSat{v: 0.75}
	d := pacedDispatcher(t, src, flowcontrol.Pacing{Readings: true}, &r)
	for range 50 {
		d.Step()
	}
	if n := released(&r); n != 0 {
		t.Fatalf("%d released with no new reading", n)
	}
	src.seq.Add(2)
	d.Step()
	if n := released(&r); n != 0 {
		t.Fatalf("released after 2 readings (Every 3)")
	}
	src.seq.Add(4) // 6 in all: the band opened at the 3rd, released, and reopens at the 6th
	d.Step()
	if n := released(&r); n != 1 {
		t.Fatalf("%d released after 4 more readings in one tick, want 1 (one Burst per run)", n)
	}
}

// TestPacingFloor: the floor grants one opportunity every Floor of ticks
// (rounded up), so a gated band is never starved.
func TestPacingFloor(t *testing.T) {
	var r rec
	// Tick 1 ms, Floor 4.5 ms → every 5 ticks; Every 3 → one release per 15 ticks.
	d := pacedDispatcher(t, constSat(0.75), flowcontrol.Pacing{Floor: 4500 * time.Microsecond}, &r)
	got := released(&r)
	for range 150 {
		d.Step()
		got += released(&r)
	}
	if got != 10 {
		t.Fatalf("released %d over 151 ticks, want all 10 (one per 15 ticks)", got)
	}
	var r2 rec
	d2 := pacedDispatcher(t, constSat(0.75), flowcontrol.Pacing{Floor: 4500 * time.Microsecond}, &r2)
	got = released(&r2)
	for range 148 {
		d2.Step()
		got += released(&r2)
	}
	if got != 9 {
		t.Fatalf("released %d over 149 ticks, want 9", got)
	}
	if _, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(1, 1), Source: constSat(0), Pacing: flowcontrol.Pacing{Floor: -1},
	}, Dispatch: func(int, int) {}}); err == nil {
		t.Fatal("negative Pacing.Floor accepted")
	}
}

// TestOpenBandWorkConserving: a band whose gate is open releases everything
// queued at once, whatever Burst says; a gated band keeps its Burst.
func TestOpenBandWorkConserving(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(2, 4096), Source: constSat(0.75), Burst: 1,
	}}, &r)
	d.Step()
	for i := range 3000 {
		_ = d.Enqueue(0, i)
		_ = d.Enqueue(1, -i-1)
	}
	d.Poll()
	ev := r.take()
	if len(ev) != 3000 {
		t.Fatalf("open band released %d of 3000 at once", len(ev))
	}
	for i, e := range ev {
		if e.band != 0 || e.item != i {
			t.Fatalf("event %d = %+v, want band 0 item %d in order", i, e, i)
		}
	}
	for range 3 {
		d.Step()
	}
	if ev := r.take(); len(ev) != 1 || ev[0].band != 1 {
		t.Fatalf("gated band (Every 3, Burst 1) over 3 ticks: %v, want one sheddable item", ev)
	}
}
