package flowcontrol

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// creditSat is a saturation source that counts dispatches at once, as the
// in-flight credit does: base plus step per item released so far. A tick
// made up after a late timer must read it like a punctual tick would, so
// the catch-up stops releasing as soon as the gate closes.
type creditSat struct {
	base, step float64
	released   *atomic.Int64
}

func (s creditSat) Saturation() float64 { return s.base + s.step*float64(s.released.Load()) }

// fataler is what the rig needs of *testing.T and *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// constSat makes a lateRig source of constant saturation v.
func constSat(v float64) func(*atomic.Int64) SaturationSource {
	return func(rel *atomic.Int64) SaturationSource { return creditSat{base: v, released: rel} }
}

// lateRig is a dispatcher with a full sheddable band (band 1 of 2, shipped
// soft-reflective policy) driven by Run's schedule on a fake clock, so a
// test decides exactly how late each timer fires.
type lateRig struct {
	clock    atomic.Int64
	d        *Dispatcher[int]
	s        schedule[int]
	released atomic.Int64 // band-1 items dispatched
	order    []int        // band-1 items in release order
	timerAt  int64        // when the schedule's timer is due
}

// newLateRig builds the rig; src makes its saturation source from the
// rig's count of releases.
func newLateRig(t fataler, src func(released *atomic.Int64) SaturationSource, burst int, backlog int) *lateRig {
	r := &lateRig{}
	r.clock.Store(1e9)
	d, err := NewDispatcher(DispatcherConfig[int]{
		Config: Config{
			Bands: []BandConfig{{Capacity: 4}, {Capacity: backlog}}, Source: src(&r.released),
			Burst: burst,
			Now:   func() time.Time { return time.Unix(0, r.clock.Load()) },
		},
		Dispatch: func(band, item int) {
			if band == 1 {
				r.released.Add(1)
				r.order = append(r.order, item)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range backlog {
		if err := d.Enqueue(1, i); err != nil {
			t.Fatal(err)
		}
	}
	r.d = d
	r.timerAt = r.clock.Load() + int64(r.s.start(d))
	return r
}

// fireLate moves the clock to lateTicks whole ticks plus frac past the
// timer's due instant and fires the timer there. It returns the wait the
// schedule asked for.
func (r *lateRig) fireLate(t fataler, lateTicks, frac int64) time.Duration {
	r.clock.Store(r.timerAt + lateTicks*int64(r.d.tick) + frac)
	// Keep Run awake even once the band runs dry, as traffic on the
	// fast path does: this rig is about the timer, not the idle sleep.
	r.d.directed.Store(true)
	wait, ok := r.s.fire()
	if !ok {
		t.Fatal("the schedule went to sleep")
	}
	if wait <= 0 || wait > r.d.tick {
		t.Fatalf("after a timer %d ticks + %d ns late the next wait is %v, want in (0, %v]: the next grid point", lateTicks, frac, wait, r.d.tick)
	}
	r.timerAt = r.clock.Load() + int64(wait)
	if (r.timerAt-r.s.last)%int64(r.d.tick) != 0 {
		t.Fatalf("the next timer (%d) is off the grid (last tick at %d)", r.timerAt, r.s.last)
	}
	return wait
}

// TestLateTimerCreditsMissedTicks: a timer that fires k ticks late makes up
// the k grid points it missed, up to catchUpTicks of them and no more, so
// the gated band releases what ticking on time would have: one item per 3
// ticks at Every 3.
func TestLateTimerCreditsMissedTicks(t *testing.T) {
	n := catchUpTicks(DefaultTick)
	if n != int64(catchUp/DefaultTick) {
		t.Fatalf("catchUpTicks(%v) = %d, want %d", DefaultTick, n, catchUp/DefaultTick)
	}
	for _, late := range []int64{0, 1, 2, 3, 10, 50, n - 1, n, n + 1, n + 2, 3 * n, 1000 * n} {
		r := newLateRig(t, constSat(0.75), 1, 4096) // band 1 at Every 3
		r.fireLate(t, late, int64(DefaultTick)/2)
		// The start's tick, the due one, and min(late, n) made up.
		want := 1 + 1 + min(late, n)
		st := r.d.Stats()
		if st.Ticks != uint64(want) {
			t.Errorf("timer %d ticks late: %d ticks run, want %d (catch-up bound %d)", late, st.Ticks, want, n)
		}
		if got, wantRel := r.released.Load(), want/3; got != wantRel {
			t.Errorf("timer %d ticks late: band released %d, want %d (%d ticks at Every 3)", late, got, wantRel, want)
		}
		for i, it := range r.order {
			if it != i {
				t.Fatalf("release %d was item %d: not FIFO", i, it)
			}
		}
		// Back on the grid: the next timer fires on time and runs
		// exactly one tick.
		r.fireLate(t, 0, 0)
		if st := r.d.Stats(); st.Ticks != uint64(want+1) {
			t.Errorf("timer %d ticks late, then one on time: %d ticks run, want %d", late, st.Ticks, want+1)
		}
	}
}

// TestCatchUpReadsTheGate: the ticks a late timer makes up are real ticks:
// each reads the saturation and asks the policy again, so a source that
// counts releases at once closes the gated band during the catch-up, as it
// would have between punctual ticks, instead of the whole missed duty
// cycle being released on the gate read before the timer was late.
func TestCatchUpReadsTheGate(t *testing.T) {
	// 0.75 + 0.05 per release: Every 3, 4, 6, 9, 19 (41 ticks), then
	// blocked at 1.0 after 5 releases.
	r := newLateRig(t, func(rel *atomic.Int64) SaturationSource {
		return creditSat{base: 0.75, step: 0.05, released: rel}
	}, 1, 4096)
	r.fireLate(t, catchUpTicks(DefaultTick), 0) // the whole bound
	if got := r.released.Load(); got != 5 {
		t.Fatalf("catch-up of %d ticks with a source counting releases released %d, want 5 (the gate blocks at saturation 1.0)", catchUpTicks(DefaultTick), got)
	}
	if s := r.d.Stats().Saturation; s != 1 {
		t.Fatalf("last reading %v, want 1 (the catch-up's ticks read the source)", s)
	}
}

// TestLateTimerCatchUpModel is the rate property: under any pattern of
// timer lateness (on time, late within the bound, late beyond it, with any
// sub-tick remainder), the dispatcher driven by Run's schedule releases
// exactly what a reference dispatcher stepped once per credited grid point
// releases, item for item, and, with a constant saturation and tick
// pacing, exactly the model's count: Burst × ⌊credited ticks / Every⌋,
// where a fire k grid points late credits min(k, 1+catchUpTicks) ticks.
func TestLateTimerCatchUpModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// A small backlog runs dry during the fires (the catch-up then
		// credits what it cannot release); the large one never does:
		// 1+60·(1+n) ticks release less at Every 2, Burst 4.
		backlog := rapid.SampledFrom([]int{7, 60, 1 << 15}).Draw(t, "backlog")
		burst := rapid.IntRange(1, 4).Draw(t, "burst")
		sat := rapid.SampledFrom([]float64{0.6, 0.75, 0.9}).Draw(t, "saturation")
		credit := rapid.Bool().Draw(t, "credit") // the source counts releases
		n := catchUpTicks(DefaultTick)

		step := 0.0
		if credit {
			step = 0.01
		}
		src := func(rel *atomic.Int64) SaturationSource { return creditSat{base: sat, step: step, released: rel} }
		b := newLateRig(t, src, burst, backlog)
		var relA atomic.Int64
		// The reference shares B's clock and is stepped once per
		// credited grid point.
		var orderA []int
		a, err := NewDispatcher(DispatcherConfig[int]{
			Config: Config{
				Bands: []BandConfig{{Capacity: 4}, {Capacity: backlog}}, Source: src(&relA),
				Burst: burst,
				Now:   func() time.Time { return time.Unix(0, b.clock.Load()) },
			},
			Dispatch: func(band, item int) {
				if band == 1 {
					relA.Add(1)
					orderA = append(orderA, item)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := range backlog {
			if err := a.Enqueue(1, i); err != nil {
				t.Fatal(err)
			}
		}
		a.Step() // the schedule's start
		credited := int64(1)
		for range rapid.IntRange(1, 60).Draw(t, "fires") {
			var late int64
			switch rapid.IntRange(0, 3).Draw(t, "kind") {
			case 0: // on time
			case 1:
				late = rapid.Int64Range(1, n).Draw(t, "within")
			case 2:
				late = rapid.Int64Range(n+1, 4*n).Draw(t, "beyond")
			default:
				late = rapid.Int64Range(1, 3).Draw(t, "slightly")
			}
			frac := rapid.Int64Range(0, int64(DefaultTick)-1).Draw(t, "frac")
			b.fireLate(t, late, frac)
			k := min(1+late, 1+n)
			for range k {
				a.Step()
			}
			credited += k
			if got := b.d.Stats().Ticks; got != uint64(credited) {
				t.Fatalf("%d ticks run, model %d (last fire %d ticks late, bound %d)", got, credited, late, n)
			}
			if len(b.order) != len(orderA) {
				t.Fatalf("late schedule released %d, reference %d (last fire %d ticks late)", len(b.order), len(orderA), late)
			}
		}
		// Refill both and fire on time: the duty cycles the catch-up
		// left (run or credited) are the reference's.
		for i := range 8 {
			_, _ = a.Enqueue(1, backlog+i), b.d.Enqueue(1, backlog+i)
		}
		for range 20 {
			b.fireLate(t, 0, 0)
			a.Step()
			credited++
		}
		if len(b.order) != len(orderA) {
			t.Fatalf("after a refill: late schedule released %d, reference %d", len(b.order), len(orderA))
		}
		for i := range orderA {
			if b.order[i] != orderA[i] || orderA[i] != i {
				t.Fatalf("release %d: schedule item %d, reference item %d", i, b.order[i], orderA[i])
			}
		}
		if !credit && backlog > 1<<14 {
			every := int64(NewSoftReflective().Gate(1, 2, sat).Every)
			if want := int64(burst) * (credited / every); int64(len(orderA)) != want {
				t.Fatalf("released %d over %d credited ticks at Every %d, Burst %d: model %d", len(orderA), credited, every, burst, want)
			}
		}
	})
}

// TestRunCatchesUpAfterStall drives Run itself (testing/synctest's fake
// clock): one tick's saturation read stalls for a while, as a goroutine
// starved of a P would, so the timer fires that much late. A stall within
// catchUp loses no tick and no release; a longer one loses exactly the grid
// points beyond the bound.
func TestRunCatchesUpAfterStall(t *testing.T) {
	for _, stall := range []time.Duration{20 * time.Millisecond, catchUp, 3 * catchUp} { // within, at and beyond the bound
		t.Run(stall.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var reads atomic.Int64
				src := stallSat{reads: &reads, at: 10, stall: stall, sat: 0.75}
				var released atomic.Int64
				d, err := NewDispatcher(DispatcherConfig[int]{
					Config:   Config{Bands: []BandConfig{{Capacity: 4}, {Capacity: 4096}}, Source: src},
					Dispatch: func(band, _ int) { released.Add(int64(band)) },
				})
				if err != nil {
					t.Fatal(err)
				}
				for i := range 4096 {
					if err := d.Enqueue(1, i); err != nil {
						t.Fatal(err)
					}
				}
				ctx, cancel := context.WithCancel(context.Background())
				ran := make(chan error, 1)
				start := time.Now()
				go func() { ran <- d.Run(ctx) }()
				// 300 ms after the stall, half a tick past a grid
				// point: that tick has run, the next has not.
				time.Sleep(stall + 300*time.Millisecond + 500*time.Microsecond)
				synctest.Wait()
				elapsed := time.Since(start)
				cancel()
				if err := <-ran; err != context.Canceled {
					t.Fatalf("Run: %v", err)
				}
				grid := int64(elapsed / DefaultTick) // grid points passed
				// The timer is reset after the stalled tick, so it
				// fires stall late; the grid points beyond the bound
				// are lost.
				lost := max(0, int64(stall/DefaultTick)-catchUpTicks(DefaultTick))
				want := 1 + grid - lost
				st := d.Stats()
				if st.Ticks != uint64(want) {
					t.Fatalf("stall %v: %d ticks run in %v, want %d (%d grid points, %d beyond the catch-up bound)", stall, st.Ticks, elapsed, want, grid, lost)
				}
				if got := released.Load(); got != want/3 {
					t.Fatalf("stall %v: sheddable band released %d, want %d (%d ticks at Every 3)", stall, got, want/3, want)
				}
			})
		})
	}
}

// stallSat reads sat, and sleeps for stall on its at-th read: the tick
// that reads it takes that long, so Run's next timer fires that late.
type stallSat struct {
	reads *atomic.Int64
	at    int64
	stall time.Duration
	sat   float64
}

func (s stallSat) Saturation() float64 {
	if s.reads.Add(1) == s.at {
		time.Sleep(s.stall)
	}
	return s.sat
}
