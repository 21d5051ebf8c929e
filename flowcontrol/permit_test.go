package flowcontrol

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPermitDoneOnce: a Permit's Done releases its in-flight slot once (the
// InFlight hook told once); a second Done, a stale Done after its ticket
// went to the next Wait, and Done on the zero Permit an error returns do
// nothing.
func TestPermitDoneOnce(t *testing.T) {
	hook := &countHook{}
	c, err := NewController(ControllerConfig{Config: Config{Bands: []BandConfig{{Capacity: 4}}, Source: satConst(0.3)}, InFlight: hook, Stepped: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Step()
	// The open path needs Run's awake mark (a Stepped controller queues
	// every Wait until the next Step): set it as Run does. Nothing else
	// runs, so this goroutine alone takes tickets from the pool.
	c.d.awake.Store(true)
	defer c.d.awake.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, not blocks
	defer cancel()

	p, err := c.Wait(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p == (Permit{}) || c.InFlight() != 1 || hook.n != 1 {
		t.Fatalf("released: permit %v, in flight %d, hook %d; want a permit, 1, 1", p, c.InFlight(), hook.n)
	}
	p.Done()
	p.Done()
	if c.InFlight() != 0 || hook.n != 0 {
		t.Fatalf("after Done twice: in flight %d, hook %d; want 0, 0", c.InFlight(), hook.n)
	}

	// The next holder of p's ticket: a Wait that reuses it (the pool
	// usually hands it straight back), or else the same ticket held as
	// the open path holds one (sync.Pool may drop or move an item, and
	// does at random under the race detector).
	var q Permit
	for range 100 {
		if q, err = c.Wait(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if q.t == p.t {
			break
		}
		q.Done()
	}
	if q.t != p.t {
		c.inflight.Add(1)
		hook.Inc()
		q = p.t.hold()
	}
	if q == p {
		t.Fatal("a reused ticket's permit equals the previous holder's")
	}
	p.Done() // stale: must not release q
	if c.InFlight() != 1 || hook.n != 1 {
		t.Fatalf("a stale Done released the ticket's next holder: in flight %d, hook %d; want 1, 1", c.InFlight(), hook.n)
	}
	q.Done()
	if c.InFlight() != 0 || hook.n != 0 {
		t.Fatalf("after the holder's Done: in flight %d, hook %d; want 0, 0", c.InFlight(), hook.n)
	}

	z, err := c.Wait(ctx, 7)
	if !errors.Is(err, ErrUnknownBand) || z != (Permit{}) {
		t.Fatalf("unknown band: %v, %v; want ErrUnknownBand and the zero Permit", z, err)
	}
	z.Done()
	var zero Permit
	zero.Done()
	if c.InFlight() != 0 || hook.n != 0 {
		t.Fatalf("the zero Permit's Done changed the counts: in flight %d, hook %d", c.InFlight(), hook.n)
	}
}

// countHook is an InFlightCounter for one goroutine.
type countHook struct{ n int }

func (h *countHook) Inc() { h.n++ }
func (h *countHook) Dec() { h.n-- }
