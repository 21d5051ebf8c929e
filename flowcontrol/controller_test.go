package flowcontrol_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// counter is a test InFlightCounter.
type counter struct{ inc, dec atomic.Int64 }

func (c *counter) Inc() { c.inc.Add(1) }
func (c *counter) Dec() { c.dec.Add(1) }

func newTestController(t *testing.T, cfg flowcontrol.ControllerConfig) *flowcontrol.Controller {
	t.Helper()
	c, err := flowcontrol.NewController(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewControllerValidation(t *testing.T) {
	_, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 0), Source: newSat(0)}})
	if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.Contains(err.Error(), "Capacity") {
		t.Fatalf("err = %v", err)
	}
}

// waitResult is what a Wait returned, delivered by its goroutine.
type waitResult struct {
	permit flowcontrol.Permit
	err    error
}

func goWait(c *flowcontrol.Controller, ctx context.Context, band int) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		p, err := c.Wait(ctx, band)
		ch <- waitResult{p, err}
	}()
	return ch
}

// waitQueued steps nothing; it waits (without sleeping) until the
// controller's band holds n waiters.
func waitQueued(c *flowcontrol.Controller, band, n int) {
	for c.Stats().Bands[band].Queued != n {
		runtimeGosched()
	}
}

func TestControllerOutcomes(t *testing.T) {
	clk := newFakeClock()
	sat := newSat(1) // two bands: sheddable blocked
	hook := &counter{}
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 2, []time.Duration{0, 10 * time.Millisecond}...), Source: sat, Now: clk.Now}, InFlight: hook, Stepped: true})

	// Unknown band and already-cancelled context return at once.
	if _, err := c.Wait(context.Background(), 2); !errors.Is(err, flowcontrol.ErrUnknownBand) {
		t.Fatalf("unknown band: %v", err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Wait(cctx, 0); !errors.Is(err, flowcontrol.ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}

	// Dispatched: critical flows at saturation 1.
	crit := goWait(c, context.Background(), 0)
	waitQueued(c, 0, 1)
	c.Step()
	res := <-crit
	if res.err != nil || c.InFlight() != 1 || hook.inc.Load() != 1 {
		t.Fatalf("critical: %v, in flight %d", res.err, c.InFlight())
	}
	res.permit.Done()
	res.permit.Done() // idempotent
	if c.InFlight() != 0 || hook.dec.Load() != 1 {
		t.Fatalf("after done twice: in flight %d, dec %d", c.InFlight(), hook.dec.Load())
	}

	// Expired: sheddable is blocked and its max wait passes.
	shed := goWait(c, context.Background(), 1)
	waitQueued(c, 1, 1)
	clk.Advance(10 * time.Millisecond)
	c.Step()
	if res := <-shed; !errors.Is(res.err, flowcontrol.ErrExpired) {
		t.Fatalf("expired: %v", res.err)
	}

	// Cancelled while queued: Wait returns at once; the dispatcher skips
	// the dead ticket later without spending the burst.
	ctx, cancel := context.WithCancel(context.Background())
	shed = goWait(c, ctx, 1)
	waitQueued(c, 1, 1)
	cancel()
	if res := <-shed; !errors.Is(res.err, flowcontrol.ErrCancelled) || !errors.Is(res.err, context.Canceled) {
		t.Fatalf("cancelled: %v", res.err)
	}
	// Queue full: the cancelled ticket still holds a slot until skipped.
	a := goWait(c, context.Background(), 1)
	waitQueued(c, 1, 2)
	if _, err := c.Wait(context.Background(), 1); !errors.Is(err, flowcontrol.ErrQueueFull) {
		t.Fatalf("full: %v", err)
	}
	sat.Set(0)
	c.Step() // skips the cancelled ticket, dispatches a
	res = <-a
	if res.err != nil {
		t.Fatalf("after skip: %v", res.err)
	}
	st := c.Stats().Bands[1]
	if st.Cancelled != 1 || st.Dispatched != 1 || st.Expired != 1 || st.Rejected != 1 {
		t.Fatalf("band 1 stats %+v", st)
	}

	// Closed: a pending waiter ends with ErrClosed, later ones too, and the
	// released request's done still works.
	sat.Set(1)
	b := goWait(c, context.Background(), 1)
	waitQueued(c, 1, 1)
	c.Close()
	if res := <-b; !errors.Is(res.err, flowcontrol.ErrClosed) {
		t.Fatalf("closed: %v", res.err)
	}
	if _, err := c.Wait(context.Background(), 0); !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	res.permit.Done()
	if c.InFlight() != 0 || hook.inc.Load() != hook.dec.Load() {
		t.Fatalf("in flight %d, inc %d dec %d", c.InFlight(), hook.inc.Load(), hook.dec.Load())
	}
}

// Many goroutines Wait with random bands, random cancellation, a short max
// wait, saturation moving, Run going and Close at a random moment. Every
// Wait ends in exactly one outcome; dispatched Waits equal the dispatcher's
// count; done (called once or twice) brings the in-flight count back to 0.
func TestControllerStress(t *testing.T) {
	const goroutines, per = 16, 300
	sat := newSat(0.5)
	hook := &counter{}
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(3, 8, []time.Duration{0, 2 * time.Millisecond, time.Millisecond}...), Source: sat, Burst: 4, Tick: 100 * time.Microsecond}, InFlight: hook})
	runErr := c.Start(context.Background())

	var outcomes [6]atomic.Int64 // nil, cancelled, expired, full, closed, other
	var wg sync.WaitGroup
	var closeOnce sync.Once
	var completed atomic.Int64
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for k := 0; k < per; k++ {
				if completed.Add(1) == goroutines*per*3/4 {
					closeOnce.Do(c.Close)
				}
				if k%50 == 0 {
					sat.Set(rng.Float64() * 1.2)
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					go cancel() // races with the dispatch
				}
				p, err := c.Wait(ctx, rng.IntN(3))
				cancel()
				switch {
				case err == nil:
					outcomes[0].Add(1)
					p.Done()
					if rng.IntN(2) == 0 {
						p.Done()
					}
				case errors.Is(err, flowcontrol.ErrCancelled):
					outcomes[1].Add(1)
					p.Done()
				case errors.Is(err, flowcontrol.ErrExpired):
					outcomes[2].Add(1)
				case errors.Is(err, flowcontrol.ErrQueueFull):
					outcomes[3].Add(1)
				case errors.Is(err, flowcontrol.ErrClosed):
					outcomes[4].Add(1)
				default:
					outcomes[5].Add(1)
					t.Errorf("Wait: %v", err)
				}
			}
		}(g)
	}
	wg.Wait()
	closeOnce.Do(c.Close)
	if err := <-runErr; !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("Run = %v", err)
	}
	var sum int64
	for i := range outcomes {
		sum += outcomes[i].Load()
	}
	if sum != goroutines*per {
		t.Fatalf("%d outcomes for %d Waits", sum, goroutines*per)
	}
	var st struct{ dispatched, expired, cancelled, closed, rejected uint64 }
	for _, b := range c.Stats().Bands {
		st.dispatched += b.Dispatched
		st.expired += b.Expired
		st.cancelled += b.Cancelled
		st.closed += b.Closed
		st.rejected += b.Rejected
		if b.Queued != 0 {
			t.Fatalf("queued after Close: %+v", b)
		}
	}
	if st.dispatched != uint64(outcomes[0].Load()) || st.rejected != uint64(outcomes[3].Load()) {
		t.Fatalf("dispatched %d vs %d Waits released; rejected %d vs %d full", st.dispatched, outcomes[0].Load(), st.rejected, outcomes[3].Load())
	}
	// Stats agrees with Wait: an expiry is counted as such exactly; a Wait
	// cancelled while queued is counted as cancelled whichever way the
	// dispatcher reaches its ticket. Waits cancelled or closed before they
	// were enqueued are not the dispatcher's to count, hence <= there.
	exp, cl, can := uint64(outcomes[2].Load()), uint64(outcomes[4].Load()), uint64(outcomes[1].Load())
	if st.expired != exp || st.closed > cl || st.cancelled > can {
		t.Fatalf("stats %+v vs Wait outcomes expired %d closed %d cancelled %d", st, exp, cl, can)
	}
	if c.InFlight() != 0 || hook.inc.Load() != outcomes[0].Load() || hook.dec.Load() != outcomes[0].Load() {
		t.Fatalf("in flight %d, inc %d, dec %d, released %d", c.InFlight(), hook.inc.Load(), hook.dec.Load(), outcomes[0].Load())
	}
	t.Logf("outcomes nil/cancelled/expired/full/closed: %d/%d/%d/%d/%d",
		outcomes[0].Load(), outcomes[1].Load(), outcomes[2].Load(), outcomes[3].Load(), outcomes[4].Load())
}

// A Wait cancelled in a hard-blocked band gives its place back at the next
// tick: a new waiter fits although the band never opened, and Stats counts
// the first as cancelled. Without Abandon the place would stay taken until
// the band opened.
func TestControllerCancelledWaiterFreesPlaceInBlockedBand(t *testing.T) {
	c := newTestController(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 1), Source: newSat(5)}, Stepped: true})
	defer c.Close()
	c.Step()
	ctx, cancel := context.WithCancel(context.Background())
	first := goWait(c, ctx, 1)
	waitQueued(c, 1, 1)
	if _, err := c.Wait(context.Background(), 1); !errors.Is(err, flowcontrol.ErrQueueFull) {
		t.Fatalf("second Wait while the first is queued = %v, want ErrQueueFull", err)
	}
	cancel()
	if res := <-first; !errors.Is(res.err, flowcontrol.ErrCancelled) {
		t.Fatalf("first Wait = %v, want ErrCancelled", res.err)
	}
	c.Step() // still blocked: saturation 5
	st := c.Stats().Bands[1]
	if st.Queued != 0 || st.Cancelled != 1 || st.Dispatched != 0 || st.Gate.Every != 0 {
		t.Fatalf("after the tick: %+v, want the place freed, 1 cancelled, band blocked", st)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	second := goWait(c, ctx2, 1)
	waitQueued(c, 1, 1) // it fits: the place was given back
	cancel2()
	if res := <-second; !errors.Is(res.err, flowcontrol.ErrCancelled) {
		t.Fatalf("second Wait = %v", res.err)
	}
	if rej := c.Stats().Bands[1].Rejected; rej != 1 {
		t.Fatalf("rejected %d, want 1", rej)
	}
}

// TestErrNotRunning: Wait on a controller nobody ticks returns
// ErrNotRunning at once instead of hanging until its context ends — before
// Run, after Run returned — while Start, Run and Stepped make it queue, and
// Close still answers ErrClosed. Each refusal is counted in Stats.
func TestErrNotRunning(t *testing.T) {
	cfg := flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 4), Source: newSat(0)}}
	c := newTestController(t, cfg)
	if _, err := c.Wait(context.Background(), 0); !errors.Is(err, flowcontrol.ErrNotRunning) {
		t.Fatalf("Wait before Run: %v, want ErrNotRunning", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := c.Start(ctx)
	p, err := c.Wait(context.Background(), 1)
	if err != nil {
		t.Fatalf("Wait after Start: %v", err)
	}
	p.Done()
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if _, err := c.Wait(context.Background(), 1); !errors.Is(err, flowcontrol.ErrNotRunning) {
		t.Fatalf("Wait after Run returned: %v, want ErrNotRunning", err)
	}
	st := c.Stats()
	if st.Bands[0].Refused.NotRunning != 1 || st.Bands[1].Refused.NotRunning != 1 || st.Bands[1].Dispatched != 1 {
		t.Fatalf("stats %+v", st.Bands)
	}
	c.Close()
	if _, err := c.Wait(context.Background(), 0); !errors.Is(err, flowcontrol.ErrClosed) {
		t.Fatalf("Wait after Close: %v, want ErrClosed", err)
	}
	if st := c.Stats(); st.Bands[0].Refused.Closed != 1 {
		t.Fatalf("closed refusal not counted: %+v", st.Bands[0])
	}
	if ch := c.Start(context.Background()); !errors.Is(<-ch, flowcontrol.ErrClosed) {
		t.Fatal("Start after Close did not report ErrClosed")
	}

	// Stepped: the host ticks; Wait queues.
	cfg.Stepped = true
	s := newTestController(t, cfg)
	got := make(chan error, 1)
	go func() {
		p, err := s.Wait(context.Background(), 0)
		if err == nil {
			p.Done()
		}
		got <- err
	}()
	waitQueued(s, 0, 1)
	s.Step()
	if err := <-got; err != nil {
		t.Fatalf("Stepped Wait: %v", err)
	}
	s.Close()
}
