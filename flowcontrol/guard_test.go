package flowcontrol_test

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"pgregory.net/rapid"
)

// TestOpenBandWorkConserving: a band whose gate is open and that holds no
// backlog releases everything queued at once, whatever Burst says; a gated
// band keeps its Burst.
func TestOpenBandWorkConserving(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(2, 4096), Source: newSat(0.75), Burst: 1,
	}}, &r)
	d.Step()
	for i := range 3000 {
		_ = d.Enqueue(0, i)
		_ = d.Enqueue(1, -i-1)
	}
	d.Flush()
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

// TestReopenedBacklogIsPaced: a band that opens with a backlog built while
// it was blocked releases Burst per tick until it is empty, then releases on
// arrival again.
func TestReopenedBacklogIsPaced(t *testing.T) {
	for _, burst := range []int{1, 3} {
		var r rec
		sat := newSat(1)
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: bandsOf(2, 256), Source: sat, Burst: burst, Policy: flowcontrol.NewStatic(1),
		}}, &r)
		for i := range 10 {
			_ = d.Enqueue(1, i)
		}
		d.Step() // blocked
		if n := len(r.take()); n != 0 {
			t.Fatalf("blocked band released %d", n)
		}
		sat.Set(0.2)
		left := 10
		for left > 0 {
			d.Step()
			d.Flush() // between ticks nothing more goes
			got := len(r.take())
			if want := min(burst, left); got != want {
				t.Fatalf("burst %d: reopened band released %d in a tick with %d queued, want %d", burst, got, left, want)
			}
			left -= got
		}
		d.Step() // finds the band empty: released on arrival again
		for i := range 50 {
			_ = d.Enqueue(1, 100+i)
		}
		d.Flush()
		if got := len(r.take()); got != 50 {
			t.Fatalf("burst %d: caught-up open band released %d of 50 on arrival", burst, got)
		}
	}
}

// TestBacklogArmedByItsArrival: a backlog that arrives on a band the last
// tick found blocked, and meets a reopening at the very next tick (no tick
// saw it queued), is paced too: the arrival's Flush arms the band. The same
// for a Run woken from sleep by the first arrivals (synctest): the gate
// opens at once, and the band drains at Burst per tick, not in one.
func TestBacklogArmedByItsArrival(t *testing.T) {
	var r rec
	sat := newSat(1)
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(2, 256), Source: sat, Policy: flowcontrol.NewStatic(1),
	}}, &r)
	d.Step() // blocked, empty: nothing armed
	for i := range 10 {
		_ = d.Enqueue(1, i)
	}
	d.Flush() // the arrivals' wake-up
	sat.Set(0.2)
	for left := 10; left > 0; left-- {
		d.Step()
		if got := len(r.take()); got != 1 {
			t.Fatalf("a backlog no tick saw released %d in a tick with %d queued, want 1", got, left)
		}
	}

	synctest.Test(t, func(t *testing.T) {
		sat := newSat(1)
		released := make(chan int, 16)
		d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
			Config:   flowcontrol.Config{Bands: bandsOf(2, 256), Source: sat, Policy: flowcontrol.NewStatic(1)},
			Dispatch: func(_, item int) { released <- item },
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = d.Run(ctx) }()
		time.Sleep(10 * flowcontrol.DefaultTick) // Run ticks the empty bands, then sleeps
		synctest.Wait()
		for i := range 10 {
			_ = d.Enqueue(1, i)
		}
		synctest.Wait() // Run woke and took the arrivals in; no tick since
		sat.Set(0.2)
		for tick := 1; tick <= 10; tick++ {
			time.Sleep(flowcontrol.DefaultTick)
			synctest.Wait()
			if got := len(released); got > tick {
				t.Fatalf("after %d ticks %d released: a flood", tick, got)
			}
		}
		d.Close()
	})
}

// TestReopenedBacklogStopsWhenTheGateCloses: while a reopened band drains
// its backlog, a source that counts each release at once (an in-flight
// credit) closes it within the tick, for fcfs bands and bands with flows;
// without such a source the tick still releases at most Burst.
func TestReopenedBacklogStopsWhenTheGateCloses(t *testing.T) {
	for _, fair := range []string{"", flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare} {
		for _, credit := range []bool{false, true} {
			sat := newSat(1)
			released := 0
			d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
				Config: flowcontrol.Config{Bands: []flowcontrol.BandConfig{{Capacity: 8}, {Capacity: 16, Fairness: fair}},
					Burst: 4, Source: sat, Policy: flowcontrol.NewStatic(1)},
				Dispatch: func(int, int) {
					released++
					if credit {
						sat.Set(1)
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 12 {
				if err := d.EnqueueFlow(1, flowName(i%2), 1, time.Time{}, i); err != nil {
					t.Fatal(err)
				}
			}
			d.Step()
			sat.Set(0.3)
			d.Step()
			d.Close()
			if want := map[bool]int{false: 4, true: 1}[credit]; released != want {
				t.Errorf("fairness %q, credit %v: released %d, want %d", fair, credit, released, want)
			}
		}
	}
}

// policyCase is a policy under test: every shipped one and random
// PolicyFuncs.
func drawPolicy(t *rapid.T, bands int) (string, flowcontrol.CeilingPolicy) {
	switch rapid.IntRange(0, 3).Draw(t, "policyKind") {
	case 0:
		th := rapid.SampledFrom([]float64{0.3, 0.8, 1, 1.5}).Draw(t, "threshold")
		return "static", flowcontrol.NewStatic(th)
	case 1:
		return "soft-reflective", flowcontrol.NewSoftReflective()
	case 2:
		lo := rapid.SampledFrom([]float64{0, 0.2, 0.5}).Draw(t, "minCeiling")
		p, err := flowcontrol.NewPriorityHoldback(lo, 1)
		if err != nil {
			t.Fatal(err)
		}
		return "priority-holdback", p
	}
	// A random PolicyFunc: an Every per band and saturation bucket,
	// anything a user might return (negative, blocked, huge).
	const buckets = 4
	table := make([]int, bands*buckets)
	for i := range table {
		table[i] = rapid.SampledFrom([]int{-1, 0, 1, 1, 2, 3, 7, flowcontrol.MaxEvery + 1}).Draw(t, "every")
	}
	return "func", flowcontrol.PolicyFunc(func(band, n int, s float64) flowcontrol.Gate {
		k := min(max(int(s*buckets/1.5), 0), buckets-1)
		return flowcontrol.Gate{Ceiling: 1, Every: table[min(max(band, 0), bands-1)*buckets+k]}
	})
}

// TestDisciplineProperties checks the dispatcher's guarantees for every
// shipped policy and random PolicyFuncs, over random saturation paths and
// arrivals, tick by tick against a model of the rules in Dispatcher's
// godoc:
//   - band 0 holding items releases at every tick (the critical
//     guarantee), whatever the policy says;
//   - a band holding items whose effective gate stays at Every ≥ 1 releases
//     at least once every E ticks, E the largest Every seen since its last
//     release (no starvation while the policy lets it through);
//   - a band that held items at a tick where it was gated releases at most
//     Burst per tick until a tick leaves it empty (no flood on reopening);
//   - exact accounting: every item enqueued is released once or still queued.
func TestDisciplineProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nb := rapid.IntRange(1, 4).Draw(t, "bands")
		name, policy := drawPolicy(t, nb)
		burst := rapid.IntRange(1, 3).Draw(t, "burst")
		sat := newSat(0)
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: bandsOf(nb, 64), Source: sat, Burst: burst, Policy: policy,
		}}, &r)
		queued := make([]int, nb)
		gap := make([]int, nb)      // ticks with items and no release
		maxEvery := make([]int, nb) // largest Every since the last release
		paced := make([]bool, nb)   // the model's "at most Burst this tick"
		guarded := make([]bool, nb) // gated since it was last open and empty
		prevEvery := make([]int, nb)
		item := 0
		for tick := range rapid.IntRange(1, 150).Draw(t, "ticks") {
			for range rapid.IntRange(0, 4).Draw(t, "arrivals") {
				b := rapid.IntRange(0, nb-1).Draw(t, "band")
				if d.Enqueue(b, item) == nil {
					queued[b]++
				}
				item++
			}
			sat.Set(rapid.SampledFrom([]float64{0, 0.3, 0.6, 0.75, 0.9, 0.99, 1, 1.2, 5, math.NaN()}).Draw(t, "saturation"))
			had := append([]int(nil), queued...)

			d.Step()
			rel := make([]int, nb)
			for _, e := range r.take() {
				if e.reason != nil {
					t.Fatalf("%s: unexpected drop %+v", name, e)
				}
				rel[e.band]++
			}
			st := d.Stats()
			for b := range nb {
				every := st.Bands[b].Gate.Every
				queued[b] -= rel[b]
				if int(st.Bands[b].Queued) != queued[b] {
					t.Fatalf("%s tick %d band %d: Stats.Queued %d, model %d", name, tick, b, st.Bands[b].Queued, queued[b])
				}
				// Armed by a tick that finds the band gated with items,
				// cleared once a tick leaves it empty.
				if every != 1 && had[b] > 0 {
					guarded[b] = true
				}
				paced[b] = guarded[b]
				if paced[b] && rel[b] > burst {
					t.Fatalf("%s tick %d band %d: released %d with Every %d after Every %d, Burst %d: a flood",
						name, tick, b, rel[b], every, prevEvery[b], burst)
				}
				if queued[b] == 0 {
					guarded[b] = false
				}
				if had[b] > 0 && rel[b] == 0 {
					gap[b]++
				} else {
					gap[b], maxEvery[b] = 0, 0
				}
				if gap[b] > 0 {
					if every == 0 {
						maxEvery[b] = math.MaxInt // blocked: no bound in this window
					} else {
						maxEvery[b] = max(maxEvery[b], every)
					}
				}
				if b == 0 && gap[b] > 0 {
					t.Fatalf("%s tick %d: band 0 held %d items through a tick without a release (Every %d)", name, tick, had[0], every)
				}
				if gap[b] > 0 && maxEvery[b] != math.MaxInt && gap[b] >= maxEvery[b] {
					t.Fatalf("%s tick %d band %d: %d ticks without a release, largest Every %d", name, tick, b, gap[b], maxEvery[b])
				}
				prevEvery[b] = every
			}
		}
	})
}

// TestBlockCriticalLetsThePolicyBlockBand0: with Config.BlockCritical, band
// 0 follows the policy (llm-d's meaning): blocked at s ≥ t under Static.
// Without it the same dispatcher releases band 0 at once.
func TestBlockCriticalLetsThePolicyBlockBand0(t *testing.T) {
	for _, block := range []bool{false, true} {
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: bandsOf(2, 64), Source: newSat(1), Policy: flowcontrol.NewStatic(1), BlockCritical: block,
		}}, &r)
		for i := range 10 {
			_ = d.Enqueue(0, i)
		}
		for range 10 {
			d.Step()
		}
		want := map[bool]int{false: 10, true: 0}[block]
		if got := len(r.take()); got != want {
			t.Errorf("BlockCritical %v: band 0 released %d of 10 at s = t, want %d", block, got, want)
		}
	}
}
