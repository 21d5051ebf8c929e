package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// The soak suite. Three sizes: the default (a developer's go test ./...),
// full with FLOWGATE_FULL=1 (.ci/run sets it; it runs under -race too),
// and
//
//	FLOWGATE_SOAK=long go test -run 'Soak' -v ./flowcontrol/
//
// which runs 1,000,000 requests. Each test logs the size it ran. All stop by
// themselves: a fixed request count, and a wall-clock bound that fails the
// test if exceeded (a hang detector, minutes beyond what a run takes).

// soakLong reports whether FLOWGATE_SOAK=long is set.
func soakLong() bool { return os.Getenv("FLOWGATE_SOAK") == "long" }

// fullSize reports whether FLOWGATE_FULL=1 asks for the full size.
func fullSize() bool { return os.Getenv("FLOWGATE_FULL") == "1" }

// soakSize picks one of the three sizes (counts of what) and logs which it
// ran.
func soakSize(t *testing.T, what string, small, full, long int) int {
	t.Helper()
	switch {
	case soakLong():
		t.Logf("size: long (FLOWGATE_SOAK=long): %d %s", long, what)
		return long
	case fullSize():
		t.Logf("size: full (FLOWGATE_FULL=1): %d %s", full, what)
		return full
	}
	t.Logf("size: default: %d %s (FLOWGATE_FULL=1: %d)", small, what, full)
	return small
}

// rawSat is a saturation source returning whatever was stored, NaN and
// infinities included: it stands for a broken host source, so that the
// dispatcher's own sanitising is what is exercised.
type rawSat struct{ bits atomic.Uint64 }

func (s *rawSat) set(v float64)       { s.bits.Store(math.Float64bits(v)) }
func (s *rawSat) Saturation() float64 { return math.Float64frombits(s.bits.Load()) }

// flapSource reads either the raw value or a real saturation.Poller, as the
// flipper decides.
type flapSource struct {
	raw       rawSat
	usePoller atomic.Bool
	poller    *saturation.Poller
}

func (f *flapSource) Saturation() float64 {
	if f.usePoller.Load() {
		return f.poller.Saturation()
	}
	return f.raw.Saturation()
}

// flakyPod is a /metrics endpoint whose behaviour the flipper changes:
// good metrics, HTTP 500, garbage, or a hang until the scrape times out, so
// the poller's reading goes stale and back.
type flakyPod struct{ mode atomic.Int32 }

func (p *flakyPod) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p.mode.Load() {
	case 0:
		fmt.Fprint(w, "vllm:num_requests_waiting 1\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0.3\n")
	case 1:
		http.Error(w, "boom", http.StatusInternalServerError)
	case 2:
		fmt.Fprint(w, "\x00\xffnot {prometheus} text\n")
	default:
		<-r.Context().Done() // hang until the poller's timeout
	}
}

// probeCtx records whether Wait ever looked at ctx.Done(). Wait enqueues
// and then blocks on its ticket and ctx.Done(); it returns before that, without
// touching Done, when the context is already over, the band unknown or full,
// or the controller closed. So a Wait that called Done entered the queue,
// and one that returned ErrCancelled or ErrClosed without calling it never
// did: the callers can tell exactly which of their drops the dispatcher
// must have counted. (If Wait ever consulted Done before enqueueing, the
// soak's exact drop check would fail loudly, not pass silently.)
type probeCtx struct {
	context.Context
	looked atomic.Bool
}

func (p *probeCtx) Done() <-chan struct{} {
	p.looked.Store(true)
	return p.Context.Done()
}

// soakCounts are the Wait outcomes seen by the callers, per band. The
// cancelled, expired and closed outcomes are split by whether the request
// entered the queue (probeCtx).
type soakCounts struct {
	dispatched, rejected             [soakBands]atomic.Int64
	cancelled, expired, closed       [soakBands]atomic.Int64
	cancelledIn, expiredIn, closedIn [soakBands]atomic.Int64 // entered the queue
	unknown, other                   atomic.Int64
}

const soakBands = 4

// TestSoakController drives N requests (20,000; 100,000 with FLOWGATE_FULL=1;
// 1 M with FLOWGATE_SOAK=long) through
// a Controller running on the real clock from 64 goroutines, with random
// deadlines and cancellations, a hot band that moves across the bands, and
// a few unknown bands, while the saturation flaps through NaN, ±Inf,
// negative, huge, normal values and a real Poller whose pod fails, serves
// garbage, hangs (goes stale) and recovers. It closes the controller with
// requests in flight and then checks the accounting exactly:
//
//   - every request ended in exactly one outcome (dispatched, cancelled,
//     expired, rejected, closed, unknown band) and only in an outcome its
//     inputs allow (no cancellation without a context that ends, no expiry
//     in the band without MaxWait);
//   - the dispatcher's Stats agree exactly, per band: dispatched, rejected,
//     and expired, cancelled and closed for the requests that entered the
//     queue (probeCtx tells which did); requests = entered + rejected +
//     unknown band + ended before entering; nothing is left queued;
//   - Done is counted once: each released request calls Done once or
//     twice, and a stale Done from the previous request is called again
//     after the ticket may have been reused; the InFlight hook saw as many
//     Dec as Inc, as many as releases, and the in-flight count is 0;
//   - the policy only ever saw sanitised saturations, and band 0 was never
//     gated.
func TestSoakController(t *testing.T) {
	n := soakSize(t, "requests", 20_000, 100_000, 1_000_000)
	bound := 2 * time.Minute
	if soakLong() {
		bound = 30 * time.Minute
	}
	if testing.Short() {
		n = 10_000
		t.Logf("-short: %d requests", n)
	}
	const goroutines = 64
	start := time.Now()

	pod := &flakyPod{}
	srv := httptest.NewServer(pod)
	defer srv.Close()
	poller, err := saturation.NewPoller(saturation.PollerConfig{
		Endpoints: []string{srv.URL + "/metrics"},
		Interval:  time.Millisecond,
		Timeout:   2 * time.Millisecond,
		Scorer:    saturation.Scorer{Staleness: 3 * time.Millisecond},
		FailFast:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := poller.Start(); err != nil {
		t.Fatal(err)
	}
	defer poller.Close()
	src := &flapSource{poller: poller}

	// The policy under test, wrapped to check what the dispatcher feeds it
	// and what it answers for band 0.
	var unsanitised, gateCalls atomic.Int64
	soft := flowcontrol.NewSoftReflective()
	policy := flowcontrol.PolicyFunc(func(band, bands int, s float64) flowcontrol.Gate {
		gateCalls.Add(1)
		if s != s || s < 0 || s > flowcontrol.MaxSaturation {
			unsanitised.Add(1)
		}
		g := soft.Gate(band, bands, s)
		return g
	})

	hook := &counter{}
	// outcomeHook counts OnOutcome calls per band and outcome (0
	// dispatched, 1 cancelled, 2 expired, 3 closed, 4 anything else).
	var outcomeHook [soakBands][5]atomic.Int64
	onOutcome := func(band int, outcome error, waited time.Duration) {
		k := 4
		switch {
		case outcome == nil:
			k = 0
		case errors.Is(outcome, flowcontrol.ErrCancelled):
			k = 1
		case errors.Is(outcome, flowcontrol.ErrExpired):
			k = 2
		case errors.Is(outcome, flowcontrol.ErrClosed):
			k = 3
		}
		if waited < 0 {
			k = 4
		}
		outcomeHook[band][k].Add(1)
	}
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(soakBands, 48, []time.Duration{0, 4 * time.Millisecond, 2 * time.Millisecond, time.Millisecond}...), Policy: policy, Source: src, Burst: 32, Tick: 100 * time.Microsecond}, InFlight: hook, OnOutcome: onOutcome})
	if err != nil {
		t.Fatal(err)
	}
	runErr := c.Start(context.Background())

	// The flipper changes the saturation every 200 µs of real time until
	// the workers are done.
	stopFlip := make(chan struct{})
	flipped := make(chan int)
	go func() {
		values := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, -1e-300, 0, 0.2, 0.5, 0.6, 0.75,
			0.9, 1, 1.5, 3, 1e300, math.MaxFloat64}
		rng := rand.New(rand.NewPCG(7, 7))
		tk := time.NewTicker(200 * time.Microsecond)
		defer tk.Stop()
		flips := 0
		for {
			select {
			case <-stopFlip:
				flipped <- flips
				return
			case <-tk.C:
			}
			flips++
			if rng.IntN(5) == 0 {
				src.usePoller.Store(true)
				pod.mode.Store(int32(rng.IntN(4)))
				continue
			}
			src.usePoller.Store(false)
			src.raw.set(values[rng.IntN(len(values))])
		}
	}()

	var (
		counts  soakCounts
		seen    = make([]atomic.Int32, n) // outcome recorded per request
		next    atomic.Int64
		closeAt = int64(n) * 9 / 10
		wg      sync.WaitGroup
	)
	record := func(i int64, outcome int32) {
		if !seen[i].CompareAndSwap(0, outcome) {
			t.Errorf("request %d: second outcome %d after %d", i, outcome, seen[i].Load())
		}
	}
	for g := range goroutines {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			var stale flowcontrol.Permit // the previous request's, released again later
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					break
				}
				if i == closeAt {
					// Close mid-flight: the other 63 workers are
					// queued, holding slots or about to Wait.
					c.Close()
				}
				// The hot band moves through the bands in 8 phases.
				hot := int(i*8/int64(n)) % soakBands
				band := hot
				switch r := rng.IntN(100); {
				case r < 1:
					band = []int{-1, soakBands, math.MaxInt}[rng.IntN(3)]
				case r < 40:
					band = rng.IntN(soakBands)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				mayEnd := true
				switch r := rng.IntN(100); {
				case r < 50:
					mayEnd = false
				case r < 75:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
				case r < 95:
					var cc context.CancelFunc
					ctx, cc = context.WithCancel(ctx)
					tm := time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cc)
					cancel = func() { tm.Stop(); cc() }
				default:
					var cc context.CancelFunc
					ctx, cc = context.WithCancel(ctx)
					cc() // already over
					cancel = cc
				}
				probe := &probeCtx{Context: ctx}
				p, err := c.Wait(probe, band)
				cancel()
				entered := probe.looked.Load()
				b := min(max(band, 0), soakBands-1)
				switch {
				case err == nil:
					counts.dispatched[b].Add(1)
					record(i, 1)
					if c.InFlight() < 1 {
						t.Errorf("request %d released but in-flight count %d", i, c.InFlight())
					}
					if rng.IntN(2) == 0 {
						stale.Done() // already released: must not release this one's slot
					}
					p.Done()
					if rng.IntN(4) == 0 {
						p.Done()
					}
					stale = p
				case errors.Is(err, flowcontrol.ErrUnknownBand):
					counts.unknown.Add(1)
					record(i, 2)
					if band >= 0 && band < soakBands {
						t.Errorf("request %d: band %d reported unknown", i, band)
					}
				case errors.Is(err, flowcontrol.ErrCancelled):
					counts.cancelled[b].Add(1)
					if entered {
						counts.cancelledIn[b].Add(1)
					}
					record(i, 3)
					if !mayEnd || !(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
						t.Errorf("request %d: %v with a context that cannot end (%v)", i, err, mayEnd)
					}
				case errors.Is(err, flowcontrol.ErrExpired):
					counts.expired[b].Add(1)
					if entered {
						counts.expiredIn[b].Add(1)
					} else {
						t.Errorf("request %d expired without entering the queue", i)
					}
					record(i, 4)
					if b == 0 {
						t.Errorf("request %d expired in band 0, which has no MaxWait", i)
					}
				case errors.Is(err, flowcontrol.ErrQueueFull):
					counts.rejected[b].Add(1)
					record(i, 5)
				case errors.Is(err, flowcontrol.ErrClosed):
					counts.closed[b].Add(1)
					if entered {
						counts.closedIn[b].Add(1)
					}
					record(i, 6)
				default:
					counts.other.Add(1)
					record(i, 7)
					t.Errorf("request %d: unexpected error %v", i, err)
				}
				if err != nil {
					p.Done() // the zero Permit of an error: does nothing
				}
			}
		}(g)
	}

	// Bounded: the workers must finish within the bound (they do in
	// seconds); if not, fail instead of hanging the suite.
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	select {
	case <-workersDone:
	case <-time.After(bound):
		c.Close()
		t.Fatalf("soak did not finish in %v: %d of %d requests issued", bound, next.Load(), n)
	}
	close(stopFlip)
	flips := <-flipped
	if err := <-runErr; !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("Run = %v, want ErrClosed", err)
	}
	elapsed := time.Since(start)

	// Every request has exactly one recorded outcome.
	for i := range seen {
		if seen[i].Load() == 0 {
			t.Fatalf("request %d has no outcome", i)
		}
	}
	var tot struct{ dispatched, cancelled, expired, rejected, closed, notEntered int64 }
	st := c.Stats()
	var accepted uint64
	for b := range soakBands {
		bs := st.Bands[b]
		d, r := counts.dispatched[b].Load(), counts.rejected[b].Load()
		can, exp, cl := counts.cancelled[b].Load(), counts.expired[b].Load(), counts.closed[b].Load()
		canIn, expIn, clIn := counts.cancelledIn[b].Load(), counts.expiredIn[b].Load(), counts.closedIn[b].Load()
		tot.dispatched += d
		tot.rejected += r
		tot.cancelled += can
		tot.expired += exp
		tot.closed += cl
		tot.notEntered += (can - canIn) + (cl - clIn)
		accepted += bs.Dispatched + bs.Dropped()
		if bs.Queued != 0 {
			t.Errorf("band %d: %d still queued after Close", b, bs.Queued)
		}
		if bs.Dispatched != uint64(d) || bs.Rejected != uint64(r) {
			t.Errorf("band %d: Stats dispatched %d rejected %d, callers saw %d released, %d rejected", b, bs.Dispatched, bs.Rejected, d, r)
		}
		// Every request that entered the queue and was not released is
		// one drop in Stats, under the reason its Wait returned (a
		// waiter that cancelled is counted as cancelled even when the
		// dispatcher reaches its ticket by expiry or Close).
		// The outcome hook was called exactly once per Wait that
		// entered the queue, with the outcome that Wait returned, and
		// never for a refusal.
		oh := &outcomeHook[b]
		if oh[0].Load() != d || oh[1].Load() != canIn || oh[2].Load() != expIn || oh[3].Load() != clIn || oh[4].Load() != 0 {
			t.Errorf("band %d: OnOutcome dispatched %d cancelled %d expired %d closed %d other %d; callers saw (in the queue) %d %d %d %d",
				b, oh[0].Load(), oh[1].Load(), oh[2].Load(), oh[3].Load(), oh[4].Load(), d, canIn, expIn, clIn)
		}
		// Refusals at the door are in Stats under their own reason.
		if bs.Refused.Cancelled != uint64(can-canIn) || bs.Refused.Closed != uint64(cl-clIn) || bs.Refused.NotRunning != 0 {
			t.Errorf("band %d: Stats refused %+v; callers saw cancelled %d closed %d before the queue", b, bs.Refused, can-canIn, cl-clIn)
		}
		if bs.Expired != uint64(expIn) || bs.Cancelled != uint64(canIn) || bs.Closed != uint64(clIn) {
			t.Errorf("band %d: Stats expired %d cancelled %d closed %d, callers saw (in the queue) expired %d cancelled %d closed %d",
				b, bs.Expired, bs.Cancelled, bs.Closed, expIn, canIn, clIn)
		}
	}
	if st.UnknownBand != uint64(counts.unknown.Load()) {
		t.Errorf("Stats unknown band %d, callers saw %d", st.UnknownBand, counts.unknown.Load())
	}
	sum := tot.dispatched + tot.cancelled + tot.expired + tot.rejected + tot.closed + counts.unknown.Load() + counts.other.Load()
	if sum != int64(n) {
		t.Fatalf("outcomes %d != requests %d", sum, n)
	}
	// requests = entered the queue (Stats) + rejected + unknown band +
	// ended before entering (context already over, or closed).
	if got := int64(accepted) + tot.rejected + counts.unknown.Load() + tot.notEntered; got != int64(n) {
		t.Errorf("Stats accepted %d + rejected %d + unknown %d + not entered %d = %d != %d requests",
			accepted, tot.rejected, counts.unknown.Load(), tot.notEntered, got, n)
	}
	if c.InFlight() != 0 || hook.inc.Load() != tot.dispatched || hook.dec.Load() != tot.dispatched {
		t.Errorf("in flight %d; hook Inc %d Dec %d; released %d", c.InFlight(), hook.inc.Load(), hook.dec.Load(), tot.dispatched)
	}
	if unsanitised.Load() != 0 {
		t.Errorf("policy saw %d unsanitised saturations", unsanitised.Load())
	}
	if st.Bands[0].Gate.Every != 1 {
		t.Errorf("band 0's gate at the end: %+v, want open (the critical guarantee)", st.Bands[0].Gate)
	}
	if tot.closed == 0 || tot.dispatched == 0 {
		t.Errorf("soak did not exercise Close mid-flight and dispatch: %+v", tot)
	}
	var scrapes int64
	for _, r := range poller.Readings() {
		scrapes += r.Scrapes
	}
	t.Logf("%d requests from %d goroutines in %v (%d ticks, %d saturation flips, %d gate calls, %d pod scrapes)",
		n, goroutines, elapsed.Round(time.Millisecond), st.Ticks, flips, gateCalls.Load(), scrapes)
	t.Logf("dispatched %d, cancelled %d, expired %d, rejected %d, closed %d, unknown band %d (sum %d); ended before entering the queue %d",
		tot.dispatched, tot.cancelled, tot.expired, tot.rejected, tot.closed, counts.unknown.Load(), sum, tot.notEntered)
	for b, bs := range st.Bands {
		t.Logf("band %d Stats: dispatched %d expired %d cancelled %d closed %d rejected %d", b, bs.Dispatched, bs.Expired, bs.Cancelled, bs.Closed, bs.Rejected)
	}
}

// heapAfterGC returns the live heap after two collections (the second one
// frees what the first one's finalisers and sync.Pool victim cache kept).
func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestSoakMemoryBounded: a band at capacity under sustained overload
// rejects with ErrQueueFull instead of growing. The sheddable band is held
// (saturation far above 1 blocks it) with Capacity waiters queued; then
// 8 goroutines push 50× the capacity more (100× with FLOWGATE_FULL=1, 1000×
// with FLOWGATE_SOAK=long). Every extra Wait must fail at once with
// ErrQueueFull, the band must hold exactly Capacity, and the live heap after
// GC must not grow by more than 256 KiB — a queue that grew would need at
// least a pointer per request, 400 KiB at the default size (800 KiB full),
// and a parked goroutine (kilobytes of stack) per waiter.
// Close then ends every queued waiter with ErrClosed.
func TestSoakMemoryBounded(t *testing.T) {
	const capacity = 1024
	overload := soakSize(t, "overload Waits", 50*capacity, 100*capacity, 1000*capacity)
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, capacity), Source: newSat(1e6), Tick: time.Millisecond}, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Step() // apply the gate: band 1 blocked
	if g := c.Stats().Bands[1].Gate; g.Every != 0 {
		t.Fatalf("band 1 gate %+v, want blocked", g)
	}
	held := make(chan error, capacity)
	for range capacity {
		go func() {
			_, err := c.Wait(context.Background(), 1)
			held <- err
		}()
	}
	waitQueued(c, 1, capacity)
	c.Step() // still blocked: nothing leaves
	before := heapAfterGC()
	start := time.Now()

	// Bounded: were a Wait accepted instead of rejected it would block;
	// the context ends it (as "other") after 30 s at most.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const pushers = 8
	var rejected, other atomic.Int64
	var wg sync.WaitGroup
	for range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range overload / pushers {
				_, err := c.Wait(ctx, 1)
				if errors.Is(err, flowcontrol.ErrQueueFull) {
					rejected.Add(1)
				} else {
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after := heapAfterGC()
	st := c.Stats().Bands[1]
	if rejected.Load() != int64(overload) || other.Load() != 0 {
		t.Fatalf("%d of %d overload Waits rejected, %d other outcomes", rejected.Load(), overload, other.Load())
	}
	if st.Queued != capacity || st.Rejected != uint64(overload) || st.Dispatched != 0 {
		t.Fatalf("band 1 after overload: %+v", st)
	}
	growth := int64(after) - int64(before)
	t.Logf("heap after GC: %d B with %d queued, %d B after %d rejected Waits (%+d B) in %v",
		before, capacity, after, overload, growth, elapsed.Round(time.Millisecond))
	if growth > 256<<10 {
		t.Errorf("live heap grew by %d B under overload", growth)
	}

	c.Close()
	for range capacity {
		if err := <-held; !errors.Is(err, flowcontrol.ErrClosed) {
			t.Fatalf("held waiter: %v, want ErrClosed", err)
		}
	}
	if st := c.Stats().Bands[1]; st.Closed != capacity || st.Queued != 0 {
		t.Fatalf("after Close: %+v", st)
	}
}
