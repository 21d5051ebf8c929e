package flowcontrol

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// idleSat is a settable saturation source that counts its reads (one per
// tick actually run).
type idleSat struct {
	bits  atomic.Uint64
	reads atomic.Int64
	seq   atomic.Uint64
}

func (s *idleSat) set(v float64) { s.bits.Store(math.Float64bits(v)); s.seq.Add(1) }
func (s *idleSat) Saturation() float64 {
	s.reads.Add(1)
	return math.Float64frombits(s.bits.Load())
}

// idleEvent is one outcome, with the virtual time it happened at.
type idleEvent struct {
	band, item int
	reason     error
	at         int64
}

// TestIdleSleepIsExact is the idle-accounting property: a dispatcher driven
// by Run's schedule (which stops ticking while every band is empty and, on
// the next Enqueue, credits the ticks it slept through) releases and drops
// exactly the same items at exactly the same instants, with the same Stats,
// as one that ticks through every grid point. Saturation changes only at
// grid points (a reading taken at a wake-up between two grid points is the
// one continuous ticking took at the last of them).
func TestIdleSleepIsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const tick = int64(time.Millisecond)
		nb := rapid.IntRange(1, 3).Draw(t, "bands")
		bands := make([]BandConfig, nb)
		for i := range bands {
			bands[i].Capacity = rapid.IntRange(1, 6).Draw(t, "capacity")
			if rapid.Bool().Draw(t, "timed") {
				bands[i].MaxWait = time.Duration(rapid.Int64Range(1, 6*tick).Draw(t, "maxWait"))
			}
		}
		burst := rapid.IntRange(1, 3).Draw(t, "burst")
		var clock atomic.Int64
		clock.Store(1e9)
		now := func() time.Time { return time.Unix(0, clock.Load()) }
		dead := map[int]bool{}
		sat := &idleSat{}
		sat.set(rapid.SampledFrom([]float64{0, 0.6, 0.75, 0.9, 1.2}).Draw(t, "sat0"))

		mk := func(log *[]idleEvent) *Dispatcher[int] {
			at := func() int64 { return clock.Load() }
			d, err := NewDispatcher(DispatcherConfig[int]{
				Config: Config{Bands: bands, Source: sat, Burst: burst, Tick: time.Duration(tick), Now: now},
				Dispatch: func(b, i int) {
					*log = append(*log, idleEvent{b, i, nil, at()})
				},
				OnDrop: func(b, i int, r error) {
					*log = append(*log, idleEvent{b, i, r, at()})
				},
				Abandoned: func(i int) bool { return dead[i] },
			})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		var logA, logB []idleEvent
		a := mk(&logA) // the reference: a Step at every grid point
		b := mk(&logB) // Run's schedule on the fake clock
		var s schedule[int]
		s.start(b)
		a.Step()
		grid := clock.Load()              // A's last grid point
		timerAt, armed := grid+tick, true // B's timer
		arm := func(wait time.Duration, ok bool) {
			if ok {
				timerAt, armed = clock.Load()+int64(wait), true
			}
		}
		item := 0
		compare := func(where string) {
			if fmt.Sprint(logA) != fmt.Sprint(logB) {
				t.Fatalf("%s: events differ\nticking: %v\nasleep:  %v", where, logA, logB)
			}
			sa, sb := a.Stats(), b.Stats()
			for i := range sa.Bands {
				x, y := sa.Bands[i], sb.Bands[i]
				if !s.asleep {
					if x != y {
						t.Fatalf("%s: band %d stats differ\nticking: %+v\nasleep:  %+v", where, i, x, y)
					}
				} else {
					x.Gate, y.Gate = Gate{}, Gate{}
					if x != y {
						t.Fatalf("%s: band %d counters differ while asleep\nticking: %+v\nasleep:  %+v", where, i, x, y)
					}
				}
			}
			if !s.asleep && (sa.Ticks != sb.Ticks || sa.Saturation != sb.Saturation) {
				t.Fatalf("%s: ticks %d/%d saturation %v/%v", where, sa.Ticks, sb.Ticks, sa.Saturation, sb.Saturation)
			}
		}
		// toNextGrid moves the clock to the next grid point, where A
		// ticks and B's timer fires if it is armed.
		toNextGrid := func(t *rapid.T) {
			grid += tick
			clock.Store(grid)
			a.Step()
			switch {
			case armed && timerAt == grid:
				armed = false
				arm(s.fire())
			case armed && timerAt < grid:
				t.Fatalf("timer at %d missed the grid point %d", timerAt, grid)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			// To the next grid point, where the saturation may change
			// before the tick reads it.
			"tick": func(t *rapid.T) {
				if rapid.Bool().Draw(t, "change") {
					sat.set(rapid.SampledFrom([]float64{0, 0.6, 0.75, 0.9, 1.2}).Draw(t, "sat"))
				}
				toNextGrid(t)
				compare("tick")
			},
			// A long idle stretch, ticked through.
			"idle": func(t *rapid.T) {
				for range rapid.IntRange(1, 50).Draw(t, "ticks") {
					toNextGrid(t)
				}
				compare("idle")
			},
			// Time passes within the current tick.
			"within": func(t *rapid.T) {
				clock.Store(rapid.Int64Range(clock.Load(), grid+tick-1).Draw(t, "at"))
			},
			"enqueue": func(t *rapid.T) {
				band := rapid.IntRange(0, nb-1).Draw(t, "band")
				item++
				ea, eb := a.Enqueue(band, item), b.Enqueue(band, item)
				if ea != eb {
					t.Fatalf("Enqueue: %v vs %v", ea, eb)
				}
				a.Flush() // Run's wake-up on Enqueue
				arm(s.nudge())
				compare("enqueue")
			},
			"abandon": func(t *rapid.T) {
				if item == 0 {
					t.Skip("nothing enqueued")
				}
				it := rapid.IntRange(1, item).Draw(t, "item")
				dead[it] = true
				band := rapid.IntRange(0, nb-1).Draw(t, "band")
				a.Abandon(band)
				b.Abandon(band)
				a.Flush()
				arm(s.nudge())
				compare("abandon")
			},
		})
		// Wake B with one more item and compare everything.
		item++
		_, _ = a.Enqueue(0, item), b.Enqueue(0, item)
		a.Flush()
		arm(s.nudge())
		compare("final")
	})
}

// TestRunSleepsWhenIdle: under Run, a dispatcher with every band empty
// stops ticking (it reads the saturation no more) and, at the next Enqueue,
// releases at once and counts the ticks it slept through.
func TestRunSleepsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sat := &idleSat{}
		got := make(chan int, 1)
		d, err := NewDispatcher(DispatcherConfig[int]{
			Config:   Config{Bands: []BandConfig{{Capacity: 4}}, Source: sat},
			Dispatch: func(_, i int) { got <- i },
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- d.Run(ctx) }()
		synctest.Wait()
		time.Sleep(time.Second) // fake time: a second of idleness
		synctest.Wait()
		if r := sat.reads.Load(); r > 2 {
			t.Fatalf("idle for 1 s at a 1 ms tick: %d ticks ran, want ≤ 2 (the start and the first tick)", r)
		}
		if err := d.Enqueue(0, 7); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case i := <-got:
			if i != 7 {
				t.Fatalf("got %d", i)
			}
		default:
			t.Fatal("not released on Enqueue after sleeping")
		}
		// 1 s of 1 ms ticks: the start, 1000 grid points (credited or
		// run), no more.
		if st := d.Stats(); st.Ticks != 1001 {
			t.Fatalf("ticks after 1 s = %d, want 1001", st.Ticks)
		}
		cancel()
		if err := <-ran; err != context.Canceled {
			t.Fatalf("Run: %v", err)
		}
	})
}

// TestRunStaysAwakeUnderDirectTraffic: releases on the Controller's fast
// path (an open band with nothing queued, which never enqueues) keep Run
// ticking, so that the next request can take the fast path too, instead of
// Run sleeping after every empty tick and sending the next arrival through
// the queue and a hand-off to its goroutine. Once the traffic stops, Run
// sleeps again within two ticks. time.Sleep here is synctest's fake clock.
func TestRunStaysAwakeUnderDirectTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sat := &idleSat{}
		c, err := NewController(ControllerConfig{Config: Config{Bands: []BandConfig{{Capacity: 4}}, Source: sat}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := c.Start(ctx)
		defer func() { // also on a failure: no goroutine left in the bubble
			cancel()
			if err := <-ran; err != context.Canceled {
				t.Errorf("Run: %v", err)
			}
		}()
		synctest.Wait()
		const n = 200 // 300 µs apart: 60 ticks of traffic
		for i := range n {
			if !c.d.awake.Load() {
				t.Fatalf("request %d at %v: Run is asleep under traffic (the request would be queued)", i, time.Duration(i)*300*time.Microsecond)
			}
			p, err := c.Wait(ctx, 0)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			p.Done()
			time.Sleep(300 * time.Microsecond)
			synctest.Wait()
		}
		if got := c.Stats().Bands[0].Dispatched; got != n {
			t.Fatalf("dispatched %d, want %d", got, n)
		}
		time.Sleep(2 * time.Millisecond) // two ticks without traffic
		synctest.Wait()
		if c.d.awake.Load() {
			t.Fatal("Run still ticking two ticks after the traffic stopped")
		}
		reads := sat.reads.Load()
		time.Sleep(time.Second)
		synctest.Wait()
		if r := sat.reads.Load(); r != reads {
			t.Fatalf("idle for 1 s after the traffic: %d more ticks ran, want 0", r-reads)
		}
	})
}
