package flowcontrol_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/emirpasic/gods/v2/queues/linkedlistqueue"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// modelItem is a queued item in the model: its id and absolute deadline
// (0 = none) in fake-clock nanoseconds.
type modelItem struct {
	id  int
	due int64
}

// model is a straightforward sequential re-statement of the dispatcher's
// contract over gods queues: per band FIFO, tick counts since the last
// dispatch, open bands (Every 1) releasing everything, a per-tick budget for
// gated ones, expiry at the due tick, dead items skipped
// without spending the budget, Close ending everything with ErrClosed; an
// item whose owner gave up ends as cancelled whichever way it is reached.
type model struct {
	policy   flowcontrol.CeilingPolicy
	bands    []*linkedlistqueue.Queue[modelItem]
	since    []int
	budget   []int
	open     []bool // the band's gate at the last tick was Every 1 (closed before the first)
	guarded  []bool // gated since the band was last open and empty: a backlog is paced
	maxWait  []time.Duration
	capacity int
	burst    int
	closed   bool
	dead     map[int]bool
	pending  []bool        // Abandon called on the band since its last reap
	outcome  map[int]error // id → outcome (nil = dispatched)
	counts   []map[string]uint64
}

func reasonName(err error) string {
	if err == nil {
		return "dispatched"
	}
	return err.Error()
}

func (m *model) end(band int, it modelItem, reason error, events *[]event) {
	*events = append(*events, event{band, it.id, reason})
	m.counts[band][reasonName(reason)]++
}

// drop ends an undispatched item: cancelled if its owner gave up, else reason.
func (m *model) drop(band int, it modelItem, reason error, events *[]event) {
	if m.dead[it.id] {
		reason = flowcontrol.ErrCancelled
	}
	m.end(band, it, reason, events)
}

func (m *model) step(now int64, sat float64, advance bool) []event {
	var ev []event
	if m.closed {
		return nil
	}
	n := len(m.bands)
	if advance {
		s := flowcontrol.Sanitize(sat)
		for b := 0; b < n; b++ {
			every := min(max(m.policy.Gate(b, n, s).Every, 0), flowcontrol.MaxEvery)
			if b == 0 {
				every = 1 // the critical guarantee
			}
			if m.since[b] < flowcontrol.MaxEvery {
				m.since[b]++
			}
			m.open[b] = every == 1
			if !m.open[b] && m.bands[b].Size() > 0 {
				m.guarded[b] = true
			}
			m.budget[b] = 0
			if every > 0 && m.since[b] >= every {
				m.budget[b] = m.burst
			}
			q := m.bands[b]
			for {
				it, ok := q.Peek()
				if !ok || it.due == 0 || now < it.due {
					break
				}
				q.Dequeue()
				m.drop(b, it, flowcontrol.ErrExpired, &ev)
			}
		}
	}
	for b := 0; b < n; b++ {
		if !advance && !m.open[b] && m.bands[b].Size() > 0 {
			m.guarded[b] = true // a poll on a gated band with items arms it too
		}
		if m.pending[b] {
			// Reap: every dead item leaves the band at once, in order.
			m.pending[b] = false
			kept := linkedlistqueue.New[modelItem]()
			for it, ok := m.bands[b].Dequeue(); ok; it, ok = m.bands[b].Dequeue() {
				if m.dead[it.id] {
					m.end(b, it, flowcontrol.ErrCancelled, &ev)
				} else {
					kept.Enqueue(it)
				}
			}
			m.bands[b] = kept
		}
		q := m.bands[b]
		if m.open[b] && !m.guarded[b] {
			// Open bands without a backlog are work-conserving: no budget.
			m.budget[b] = 1 << 62
		}
		for m.budget[b] > 0 {
			it, ok := q.Dequeue()
			if !ok {
				break
			}
			switch {
			case it.due != 0 && now >= it.due:
				m.drop(b, it, flowcontrol.ErrExpired, &ev)
			case m.dead[it.id]:
				m.end(b, it, flowcontrol.ErrCancelled, &ev)
			default:
				m.budget[b]--
				m.since[b] = 0
				m.end(b, it, nil, &ev)
			}
		}
		if m.bands[b].Size() == 0 {
			m.guarded[b] = false // caught up
		}
	}
	return ev
}

// Exactly once: random Enqueue / Step / Poll / cancel / advance time /
// change saturation / Close against the model. Every item ends in exactly
// one outcome, the same outcome at the same moment as the model says, no
// due item is left queued after a tick, and Stats add up.
func TestDispatcherStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bands := rapid.IntRange(1, 4).Draw(t, "bands")
		capacity := rapid.IntRange(1, 6).Draw(t, "capacity")
		burst := rapid.IntRange(1, 3).Draw(t, "burst")
		maxWait := make([]time.Duration, bands)
		for b := range maxWait {
			maxWait[b] = time.Duration(rapid.IntRange(0, 5).Draw(t, "maxWaitMs")) * time.Millisecond
		}
		clk := newFakeClock()
		sat := newSat(0)
		m := &model{
			policy: flowcontrol.NewSoftReflective(), capacity: capacity, burst: burst, maxWait: maxWait,
			since: make([]int, bands), budget: make([]int, bands), open: make([]bool, bands), guarded: make([]bool, bands), pending: make([]bool, bands),
			dead: map[int]bool{}, outcome: map[int]error{},
		}
		for b := 0; b < bands; b++ {
			m.bands = append(m.bands, linkedlistqueue.New[modelItem]())
			m.counts = append(m.counts, map[string]uint64{})
		}
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(bands, capacity, maxWait...), Burst: burst, Source: sat, Now: clk.Now}, Abandoned: func(i int) bool { return m.dead[i] }}, &r)
		next := 0
		var queuedIDs []int
		bandOf := map[int]int{}
		accepted := 0

		record := func(got []event) {
			for _, e := range got {
				if prev, ok := m.outcome[e.item]; ok {
					t.Fatalf("item %d ended twice: %v then %v", e.item, prev, e.reason)
				}
				m.outcome[e.item] = e.reason
			}
		}
		compare := func(what string, want []event) {
			got := r.take()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: dispatcher %v, model %v", what, got, want)
			}
			record(got)
		}
		now := func() int64 { return int64(clk.Elapsed()) }

		actions := map[string]func(*rapid.T){
			"enqueue": func(t *rapid.T) {
				b := rapid.IntRange(-1, bands).Draw(t, "band")
				err := d.Enqueue(b, next)
				var want error
				switch {
				case b < 0 || b >= bands:
					want = flowcontrol.ErrUnknownBand
				case m.closed:
					want = flowcontrol.ErrClosed
				case m.bands[b].Size() >= capacity:
					want = flowcontrol.ErrQueueFull
				}
				if !errors.Is(err, want) || (want == nil && err != nil) {
					t.Fatalf("Enqueue(%d) = %v, model says %v", b, err, want)
				}
				if err == nil {
					it := modelItem{id: next}
					if maxWait[b] > 0 {
						it.due = now() + int64(maxWait[b])
					}
					m.bands[b].Enqueue(it)
					queuedIDs = append(queuedIDs, next)
					bandOf[next] = b
					accepted++
				}
				next++
			},
			"cancel": func(t *rapid.T) {
				if len(queuedIDs) == 0 {
					return
				}
				id := rapid.SampledFrom(queuedIDs).Draw(t, "id")
				m.dead[id] = true
				// Tell the dispatcher (as Controller does) or not (it
				// then meets the item when it reaches it).
				if rapid.Bool().Draw(t, "abandon") {
					b := bandOf[id]
					if !m.closed {
						m.pending[b] = true
					}
					d.Abandon(b)
				}
			},
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(0, 3).Draw(t, "ms")) * time.Millisecond)
			},
			"saturation": func(t *rapid.T) {
				sat.Set(saturationGen().Draw(t, "s"))
			},
			"step": func(t *rapid.T) {
				want := m.step(now(), sat.Saturation(), true)
				d.Step()
				compare("Step", want)
				// Nothing due may remain queued after a tick.
				for b, q := range m.bands {
					for _, it := range q.Values() {
						if it.due != 0 && it.due <= now() && !m.closed {
							t.Fatalf("band %d: item %d due at %d still queued at %d", b, it.id, it.due, now())
						}
					}
				}
			},
			"poll": func(t *rapid.T) {
				want := m.step(now(), sat.Saturation(), false)
				d.Flush()
				compare("Poll", want)
			},
			"close": func(t *rapid.T) {
				var want []event
				if !m.closed {
					m.closed = true
					for b, q := range m.bands {
						for {
							it, ok := q.Dequeue()
							if !ok {
								break
							}
							m.drop(b, it, flowcontrol.ErrClosed, &want)
						}
					}
				}
				d.Close()
				compare("Close", want)
			},
			"": func(t *rapid.T) {
				st := d.Stats()
				ended := 0
				for b, bs := range st.Bands {
					c := m.counts[b]
					if bs.Queued != m.bands[b].Size() || bs.Dispatched != c["dispatched"] ||
						bs.Expired != c[flowcontrol.ErrExpired.Error()] || bs.Cancelled != c[flowcontrol.ErrCancelled.Error()] ||
						bs.Closed != c[flowcontrol.ErrClosed.Error()] {
						t.Fatalf("band %d stats %+v, model queued %d counts %v", b, bs, m.bands[b].Size(), c)
					}
					ended += int(bs.Dispatched + bs.Dropped())
				}
				queued := 0
				for _, q := range m.bands {
					queued += q.Size()
				}
				if ended+queued != accepted || len(m.outcome) != ended {
					t.Fatalf("accepted %d, ended %d (%d distinct), queued %d", accepted, ended, len(m.outcome), queued)
				}
			},
		}
		check := actions[""]
		delete(actions, "")
		// Weighted action names; rapid's Repeat runs ~30 actions, too few
		// to reach deep states, so the test draws its own, longer, run.
		names := []string{"enqueue", "enqueue", "enqueue", "cancel", "advance", "advance",
			"saturation", "step", "step", "step", "poll", "close"}
		for i, n := 0, rapid.IntRange(10, 300).Draw(t, "actions"); i < n; i++ {
			name := rapid.SampledFrom(names).Draw(t, "action")
			if name == "close" && rapid.IntRange(0, 9).Draw(t, "reallyClose") != 0 {
				continue
			}
			actions[name](t)
			check(t)
		}
		d.Close()
		record(r.take())
		if len(m.outcome) != accepted {
			t.Fatalf("after Close %d of %d items have an outcome", len(m.outcome), accepted)
		}
	})
}
