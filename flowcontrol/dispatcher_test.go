package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// rec collects a dispatcher's outcomes (single-threaded ticks).
type rec struct{ events []event }

func (r *rec) dispatch(band, item int) { r.events = append(r.events, event{band, item, nil}) }
func (r *rec) drop(band, item int, reason error) {
	r.events = append(r.events, event{band, item, reason})
}
func (r *rec) take() []event { e := r.events; r.events = nil; return e }

func newTestDispatcher(t interface{ Fatalf(string, ...any) }, cfg flowcontrol.DispatcherConfig[int], r *rec) *flowcontrol.Dispatcher[int] {
	cfg.Dispatch = r.dispatch
	cfg.OnDrop = r.drop
	d, err := flowcontrol.NewDispatcher(cfg)
	if err != nil {
		t.Fatalf("NewDispatcher: %v", err)
	}
	return d
}

func TestEnqueueErrors(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 3), Source: newSat(0)}}, &r)
	for _, b := range []int{-1, 2, math.MaxInt} {
		if err := d.Enqueue(b, 0); !errors.Is(err, flowcontrol.ErrUnknownBand) {
			t.Errorf("Enqueue(%d) = %v", b, err)
		}
	}
	// Capacity is exact (the ring underneath holds 4).
	for i := 0; i < 3; i++ {
		if err := d.Enqueue(1, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Enqueue(1, 3); !errors.Is(err, flowcontrol.ErrQueueFull) {
		t.Errorf("4th Enqueue = %v, want ErrQueueFull", err)
	}
	if st := d.Stats(); st.Bands[1].Queued != 3 || st.Bands[1].Rejected != 1 {
		t.Errorf("stats %+v", st.Bands[1])
	}
	d.Close()
	if err := d.Enqueue(0, 9); !errors.Is(err, flowcontrol.ErrClosed) {
		t.Errorf("Enqueue after Close = %v", err)
	}
	got := r.take()
	if len(got) != 3 {
		t.Fatalf("Close dropped %v", got)
	}
	for i, e := range got {
		if e != (event{1, i, flowcontrol.ErrClosed}) {
			t.Errorf("Close event %d = %+v", i, e)
		}
	}
	if err := d.Run(context.Background()); !errors.Is(err, flowcontrol.ErrClosed) {
		t.Errorf("Run after Close = %v", err)
	}
	d.Step()  // no-op
	d.Close() // idempotent
	if st := d.Stats(); st.Bands[1].Closed != 3 || st.Bands[1].Queued != 0 {
		t.Errorf("stats after Close %+v", st.Bands[1])
	}
}

// Critical never blocked: for any number of bands and any saturation
// sequence, a band-0 item enqueued before Step is dispatched by that Step.
func TestCriticalNeverBlocked(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(1, 8).Draw(t, "bands")
		burst := rapid.IntRange(1, 8).Draw(t, "burst")
		sat := newSat(0)
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(bands, 64), Burst: burst, Source: sat}}, &r)
		ticks := rapid.IntRange(1, 50).Draw(t, "ticks")
		next := 0
		for tick := 0; tick < ticks; tick++ {
			sat.Set(saturationGen().Draw(t, "s"))
			n := rapid.IntRange(0, burst).Draw(t, "critical")
			want := map[int]bool{}
			for i := 0; i < n; i++ {
				if err := d.Enqueue(0, next); err != nil {
					t.Fatal(err)
				}
				want[next] = true
				next++
			}
			for i := rapid.IntRange(0, 3).Draw(t, "others"); i > 0 && bands > 1; i-- {
				_ = d.Enqueue(rapid.IntRange(1, bands-1).Draw(t, "band"), -1)
			}
			d.Step()
			for _, e := range r.take() {
				if e.band == 0 && e.reason == nil {
					delete(want, e.item)
				}
			}
			if len(want) > 0 {
				t.Fatalf("tick %d, s=%v: critical items %v not dispatched", tick, sat.Saturation(), want)
			}
		}
	})
}

// Bounded starvation: with saturation ≤ 1−ε on every tick and the last band
// never empty, the gap between its dispatching ticks never exceeds the
// largest Every seen (during the gap).
func TestBoundedSheddableStarvation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(2, 8).Draw(t, "bands")
		eps := rapid.SampledFrom([]float64{0.01, 0.05, 0.2}).Draw(t, "eps")
		sat := newSat(0)
		var r rec
		last := bands - 1
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(bands, 16), Burst: 1, Source: sat}}, &r)
		maxEvery, lastOpen := 0, 0
		for tick := 1; tick <= 400; tick++ {
			sat.Set(rapid.OneOf(
				rapid.Float64Range(0, 1-eps),
				rapid.SampledFrom([]float64{0.55, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 1 - eps}),
			).Draw(t, "s"))
			for d.Stats().Bands[last].Queued < 2 {
				if err := d.Enqueue(last, tick); err != nil {
					t.Fatal(err)
				}
			}
			d.Step()
			if e := d.Stats().Bands[last].Gate.Every; e > maxEvery {
				maxEvery = e
			}
			dispatched := false
			for _, e := range r.take() {
				dispatched = dispatched || (e.band == last && e.reason == nil)
			}
			if dispatched {
				lastOpen, maxEvery = tick, 0
			} else if gap := tick - lastOpen; gap >= maxEvery && maxEvery > 0 {
				t.Fatalf("tick %d: last band idle for %d ticks, largest Every seen %d", tick, gap, maxEvery)
			}
		}
	})
}

// blockedTicks runs a two-band dispatcher at constant s for n ticks with the
// sheddable band never empty and counts the ticks it did not dispatch.
func blockedTicks(t testing.TB, policy flowcontrol.CeilingPolicy, s float64, n int) int {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 4), Burst: 1, Source: newSat(s), Policy: policy}}, &r)
	blocked := 0
	for tick := 0; tick < n; tick++ {
		if d.Stats().Bands[1].Queued == 0 {
			if err := d.Enqueue(1, tick); err != nil {
				t.Fatal(err)
			}
		}
		d.Step()
		if len(r.take()) == 0 {
			blocked++
		}
	}
	return blocked
}

func TestTwoBandTable(t *testing.T) {
	const n = 10000
	for _, tc := range []struct {
		s       float64
		blocked float64 // fraction of ticks, as DESIGN.md gives it
	}{{0, 0}, {0.5, 0}, {0.6, 1.0 / 2}, {0.75, 2.0 / 3}, {0.9, 8.0 / 9}, {1, 1}, {1.5, 1}} {
		got := blockedTicks(t, nil, tc.s, n)
		want := tc.blocked * n
		if math.Abs(float64(got)-want) > 1 {
			t.Errorf("s=%v: sheddable blocked %d of %d ticks (%.1f%%), want %.1f%% ±1 tick", tc.s, got, n, 100*float64(got)/n, 100*tc.blocked)
		}
	}
}

// Dead zone is a no-op: at s ≤ 0.5 with two bands the dispatch sequence is
// exactly that of no policy at all.
func TestDeadZoneIsNoPolicy(t *testing.T) {
	always := flowcontrol.PolicyFunc(func(int, int, float64) flowcontrol.Gate { return flowcontrol.Gate{Ceiling: 1, Every: 1} })
	rapid.Check(t, func(t *rapid.T) {
		sat := newSat(0)
		burst := rapid.IntRange(1, 4).Draw(t, "burst")
		var ra, rb rec
		a := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 8), Burst: burst, Source: sat}}, &ra)
		b := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 8), Burst: burst, Source: sat, Policy: always}}, &rb)
		for i := 0; i < 100; i++ {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0, 1:
				band := rapid.IntRange(0, 1).Draw(t, "band")
				ea, eb := a.Enqueue(band, i), b.Enqueue(band, i)
				if !errors.Is(ea, eb) && ea != eb {
					t.Fatalf("Enqueue: %v vs %v", ea, eb)
				}
			case 2:
				sat.Set(rapid.Float64Range(-1, 0.5).Draw(t, "s"))
				a.Step()
				b.Step()
			}
		}
		if fa, fb := fmt.Sprint(ra.events), fmt.Sprint(rb.events); fa != fb {
			t.Fatalf("soft-reflective %s\nno policy      %s", fa, fb)
		}
	})
}

// Monotone: at constant s, a lower band never dispatches on more ticks than
// a higher one (all bands never empty).
func TestMonotoneAcrossBands(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(2, 8).Draw(t, "bands")
		s := saturationGen().Draw(t, "s")
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(bands, 4), Burst: 1, Source: newSat(s)}}, &r)
		opens := make([]int, bands)
		for tick := 0; tick < 300; tick++ {
			for b := 0; b < bands; b++ {
				if d.Stats().Bands[b].Queued == 0 {
					_ = d.Enqueue(b, tick)
				}
			}
			d.Step()
			for _, e := range r.take() {
				opens[e.band]++
			}
		}
		for b := 1; b < bands; b++ {
			if opens[b] > opens[b-1] {
				t.Fatalf("s=%v: band %d dispatched on %d ticks, band %d on %d", s, b, opens[b], b-1, opens[b-1])
			}
		}
		if opens[0] != 300 {
			t.Fatalf("critical dispatched on %d of 300 ticks", opens[0])
		}
	})
}

// Gated bands are independent: a blocked middle band does not stop the
// band below it from using its own open ticks.
func TestBandsGatedIndependently(t *testing.T) {
	p := flowcontrol.PolicyFunc(func(band, _ int, _ float64) flowcontrol.Gate {
		if band == 1 {
			return flowcontrol.Gate{Every: 0}
		}
		return flowcontrol.Gate{Ceiling: 1, Every: 1}
	})
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(3, 4), Source: newSat(0), Policy: p}}, &r)
	_ = d.Enqueue(1, 1)
	_ = d.Enqueue(2, 2)
	d.Step()
	if got := r.take(); len(got) != 1 || got[0] != (event{2, 2, nil}) {
		t.Fatalf("events %v, want band 2 dispatched past blocked band 1", got)
	}
}

// An expired item in a gated band expires at the tick it falls due, and
// expired or cancelled items do not spend the burst.
func TestExpiryAndSkipWithoutBurst(t *testing.T) {
	clk := newFakeClock()
	dead := map[int]bool{}
	var r rec
	sat := newSat(1) // two bands: sheddable blocked
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 16, []time.Duration{0, 10 * time.Millisecond}...), Burst: 2, Source: sat, Now: clk.Now}, Abandoned: func(i int) bool { return dead[i] }}, &r)
	_ = d.Enqueue(1, 1)
	clk.Advance(5 * time.Millisecond)
	_ = d.Enqueue(1, 2)
	_ = d.Enqueue(1, 3)
	_ = d.Enqueue(1, 4)
	_ = d.Enqueue(1, 5)
	clk.Advance(5*time.Millisecond - 1)
	d.Step()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("early events %v", got)
	}
	clk.Advance(1) // item 1 due now
	d.Step()
	if got := r.take(); len(got) != 1 || got[0] != (event{1, 1, flowcontrol.ErrExpired}) {
		t.Fatalf("at due: %v", got)
	}
	dead[2], dead[3] = true, true
	sat.Set(0)
	d.Step()
	want := []event{{1, 2, flowcontrol.ErrCancelled}, {1, 3, flowcontrol.ErrCancelled}, {1, 4, nil}, {1, 5, nil}}
	if got := r.take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	st := d.Stats().Bands[1]
	if st.Dispatched != 2 || st.Expired != 1 || st.Cancelled != 2 || st.Queued != 0 || st.Dropped() != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// Poll spends only what the current tick left and does not count a tick.
func TestPollUsesRemainingBurst(t *testing.T) {
	var r rec
	sat := newSat(0.6) // two bands: sheddable every 2
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(2, 16), Burst: 2, Source: sat}}, &r)
	d.Step() // tick 1: band 1 closed (count 1 < 2)
	_ = d.Enqueue(1, 1)
	d.Flush()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("Poll on a closed band dispatched %v", got)
	}
	d.Step() // tick 2: open, sends item 1, one of two left
	if got := r.take(); len(got) != 1 {
		t.Fatalf("tick 2: %v", got)
	}
	_ = d.Enqueue(1, 2)
	_ = d.Enqueue(1, 3)
	d.Flush()
	if got := r.take(); fmt.Sprint(got) != fmt.Sprint([]event{{1, 2, nil}}) {
		t.Fatalf("Poll after tick 2: %v", got)
	}
	if d.Stats().Ticks != 2 {
		t.Fatalf("ticks %d", d.Stats().Ticks)
	}
	d.Step() // tick 3: count 1 < 2, closed
	d.Step() // tick 4: open
	if got := r.take(); fmt.Sprint(got) != fmt.Sprint([]event{{1, 3, nil}}) {
		t.Fatalf("ticks 3-4: %v", got)
	}
	// Critical is unaffected by Poll limits: it has a fresh burst every tick.
	_ = d.Enqueue(0, 7)
	d.Flush()
	if got := r.take(); fmt.Sprint(got) != fmt.Sprint([]event{{0, 7, nil}}) {
		t.Fatalf("critical Poll: %v", got)
	}
}

// Run wakes on Enqueue: with a tick of an hour, only the wake-up path can
// dispatch the item.
func TestRunWakesOnEnqueue(t *testing.T) {
	got := make(chan int, 1)
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(1, 4), Source: newSat(0), Tick: time.Hour}, Dispatch: func(_, i int) { got <- i }})
	if err != nil {
		t.Fatal(err)
	}
	d.Step()
	errc := make(chan error, 1)
	go func() { errc <- d.Run(context.Background()) }()
	// Wait for Run's own first tick; its next one is an hour away, so
	// from here only the wake-up path can dispatch.
	for d.Stats().Ticks != 2 {
		runtimeGosched()
	}
	if err := d.Enqueue(0, 42); err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-got:
		if i != 42 {
			t.Fatalf("dispatched %d", i)
		}
	case <-time.After(time.Minute): // a failure deadline, not a wait
		t.Fatal("item not dispatched: Run did not wake on Enqueue")
	}
	d.Close()
	if err := <-errc; !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("Run = %v, want ErrClosed", err)
	}
}

func TestRunContextAndSingleRun(t *testing.T) {
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(1, 4), Source: newSat(0), Tick: time.Hour}, Dispatch: func(int, int) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		close(started)
		errc <- d.Run(ctx)
	}()
	<-started
	// A second Run either loses the race (ErrRunning) or, if it won,
	// the first one gets ErrRunning. Either way exactly one returns it.
	second := make(chan error, 1)
	go func() { second <- d.Run(ctx) }()
	var errs []error
	select {
	case e := <-second:
		errs = append(errs, e)
	case e := <-errc:
		errs = append(errs, e)
	}
	if !errors.Is(errs[0], flowcontrol.ErrRunning) {
		t.Fatalf("concurrent Run returned %v first, want ErrRunning", errs[0])
	}
	cancel()
	var last error
	select {
	case last = <-second:
	case last = <-errc:
	}
	if !errors.Is(last, context.Canceled) {
		t.Fatalf("Run after cancel = %v", last)
	}
}

// Concurrent producers, Run consuming, Close in the middle: every accepted
// item is seen exactly once (dispatched or closed), every refused one was
// refused with ErrClosed or ErrQueueFull.
func TestDispatcherConcurrentExactlyOnce(t *testing.T) {
	const producers, per = 8, 2000
	var mu sync.Mutex
	seen := make(map[int]error, producers*per)
	var dup []int
	note := func(i int, reason error) {
		mu.Lock()
		if _, ok := seen[i]; ok {
			dup = append(dup, i)
		}
		seen[i] = reason
		mu.Unlock()
	}
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(3, 64), Source: newSat(0.7), Burst: 16, Tick: 100 * time.Microsecond}, Dispatch: func(_, i int) { note(i, nil) }, OnDrop: func(_, i int, r error) { note(i, r) }})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- d.Run(context.Background()) }()
	var wg sync.WaitGroup
	accepted := make([][]int, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for k := 0; k < per; k++ {
				i := p*per + k
				switch err := d.Enqueue(i%3, i); {
				case err == nil:
					accepted[p] = append(accepted[p], i)
				case errors.Is(err, flowcontrol.ErrQueueFull), errors.Is(err, flowcontrol.ErrClosed):
				default:
					t.Errorf("Enqueue: %v", err)
				}
				if p == 0 && k == per/2 {
					d.Close()
				}
			}
		}(p)
	}
	wg.Wait()
	if err := <-errc; !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("Run = %v", err)
	}
	n := 0
	for _, a := range accepted {
		for _, i := range a {
			if _, ok := seen[i]; !ok {
				t.Fatalf("item %d accepted but never ended", i)
			}
			n++
		}
	}
	if len(dup) > 0 || len(seen) != n {
		t.Fatalf("duplicates %v; %d outcomes for %d accepted items", dup, len(seen), n)
	}
	var total uint64
	for _, b := range d.Stats().Bands {
		total += b.Dispatched + b.Dropped()
		if b.Queued != 0 {
			t.Fatalf("queued after Close: %+v", b)
		}
	}
	if total != uint64(n) {
		t.Fatalf("stats count %d outcomes, want %d", total, n)
	}
}

// BandCapacity gives each band its own exact capacity (Capacity unused).
func TestBandCapacity(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsCap([]int{1, 5, 2}), Source: newSat(0)}}, &r)
	for band, want := range []int{1, 5, 2} {
		for i := 0; i < want; i++ {
			if err := d.Enqueue(band, i); err != nil {
				t.Fatalf("band %d item %d: %v", band, i, err)
			}
		}
		if err := d.Enqueue(band, want); !errors.Is(err, flowcontrol.ErrQueueFull) {
			t.Fatalf("band %d beyond %d: %v, want ErrQueueFull", band, want, err)
		}
		if st := d.Stats().Bands[band]; st.Queued != want || st.Rejected != 1 {
			t.Fatalf("band %d: %+v", band, st)
		}
	}
}
