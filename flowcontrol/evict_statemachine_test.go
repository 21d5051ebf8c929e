package flowcontrol_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/emirpasic/gods/v2/maps/treemap"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// Item states in the eviction state machine's model.
const (
	smQueued = iota
	smInFlight
	smEvicting // the act was called, the server has not confirmed
	smEnded
)

type smItem struct {
	id, band  int
	state     int
	endpoint  string
	started   bool
	evictions int
	since     time.Time
	tracked   *flowcontrol.Tracked
	outcomes  []string
	abandoned bool
}

// TestEvictionStateMachine drives a Dispatcher and an Evictor together as
// a host does — releases tracked on two endpoints, first bytes, ends,
// evictions confirmed and re-queued at the head of their band, clients
// giving up while queued or while their eviction is confirmed, the
// saturation moving, the clock advancing — and checks, against a model
// kept in a gods ordered map, that every request ends in exactly one
// outcome, that no started request and no request of the most critical
// band is taken, that no request is taken more than MaxEvictions times,
// that an endpoint never has two evictions in flight, and that no eviction
// lands on an endpoint within Grace of its last confirmation.
func TestEvictionStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const bands = 3
		clock := newFakeClock()
		sat := newSat(0)
		kv := map[string]float64{}
		cfg := flowcontrol.EvictionConfig{Stall: 10 * time.Millisecond, Grace: 20 * time.Millisecond, MaxEvictions: 2,
			KVUsage:        func(ep string) float64 { return kv[ep] },
			ConfirmTimeout: time.Hour}
		items := treemap.New[int, *smItem]()
		var d *flowcontrol.Dispatcher[int]
		var ev *flowcontrol.Evictor
		lastConfirm := map[string]time.Time{}
		var accepted [bands]uint64 // Enqueue returned nil, plus Requeue
		get := func(id int) *smItem { it, _ := items.Get(id); return it }
		end := func(it *smItem, outcome string) {
			it.state = smEnded
			it.outcomes = append(it.outcomes, outcome)
		}
		var err error
		d, err = flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
			Config: flowcontrol.Config{Bands: bandsOf(bands, 4, time.Second), Policy: flowcontrol.NewStatic(0.9),
				Source: sat, Now: clock.Now},
			Dispatch: func(band, id int) {
				it := get(id)
				if it.state != smQueued || band != it.band {
					t.Fatalf("item %d released from state %d, band %d", id, it.state, band)
				}
				it.state = smInFlight
				it.endpoint = fmt.Sprint("pod-", id%2)
				act := func() {
					switch {
					case it.state != smInFlight:
						t.Fatalf("item %d taken in state %d", id, it.state)
					case it.started:
						t.Fatalf("started item %d taken", id)
					case it.band == 0:
						t.Fatalf("critical item %d taken", id)
					case clock.Now().Before(lastConfirm[it.endpoint].Add(cfg.Grace)):
						t.Fatalf("item %d taken within Grace of %s's last confirmation", id, it.endpoint)
					}
					for _, o := range items.Values() {
						if o.endpoint == it.endpoint && o.state == smEvicting {
							t.Fatalf("two evictions in flight on %s", it.endpoint)
						}
					}
					it.state = smEvicting
					it.evictions++
					if it.evictions > cfg.MaxEvictions {
						t.Fatalf("item %d evicted %d times", id, it.evictions)
					}
				}
				if it.tracked == nil {
					it.tracked = ev.Track(band, it.endpoint, act)
				} else {
					it.tracked.Again(it.endpoint, act)
				}
			},
			OnDrop: func(band, id int, reason error) {
				it := get(id)
				if it.state != smQueued {
					t.Fatalf("item %d dropped from state %d", id, it.state)
				}
				end(it, "dropped: "+reason.Error())
			},
			Abandoned: func(id int) bool { return get(id).abandoned },
		})
		require.NoError(t, err)
		ev, err = flowcontrol.NewEvictor(cfg, bands, sat, d.Held, clock.Now)
		require.NoError(t, err)

		pick := func(label string, state int) *smItem {
			var ids []int
			for _, it := range items.Values() {
				if it.state == state {
					ids = append(ids, it.id)
				}
			}
			if len(ids) == 0 {
				t.Skip("none")
			}
			return get(rapid.SampledFrom(ids).Draw(t, label))
		}
		confirm := func(it *smItem, gone bool) {
			if !it.tracked.Done() {
				t.Fatalf("item %d: its Done did not confirm its eviction", it.id)
			}
			lastConfirm[it.endpoint] = clock.Now()
			if gone {
				end(it, "client gone during its eviction")
				return
			}
			it.state = smQueued
			if err := d.Requeue(it.band, "", 1, it.since, it.id); err != nil {
				t.Fatalf("Requeue: %v", err)
			}
			accepted[it.band]++
		}
		next := 0
		t.Repeat(map[string]func(*rapid.T){
			"arrive": func(t *rapid.T) {
				it := &smItem{id: next, band: rapid.IntRange(0, bands-1).Draw(t, "band"), since: clock.Now()}
				next++
				items.Put(it.id, it)
				if err := d.Enqueue(it.band, it.id); err != nil {
					if !errors.Is(err, flowcontrol.ErrQueueFull) {
						t.Fatalf("Enqueue: %v", err)
					}
					end(it, "refused")
				} else {
					accepted[it.band]++
				}
			},
			"tick": func(t *rapid.T) {
				clock.Advance(time.Duration(rapid.IntRange(0, 25).Draw(t, "ms")) * time.Millisecond)
				d.Step()
				ev.Check()
			},
			// A release at a low saturation, then a full pool a Stall
			// later: the moves that make evictions, in one action.
			"cycle": func(t *rapid.T) {
				sat.Set(0.5)
				d.Step()
				clock.Advance(cfg.Stall)
				sat.Set(1.4)
				kv["pod-0"], kv["pod-1"] = 1, 1
				d.Step()
				ev.Check()
			},
			"saturation": func(t *rapid.T) { sat.Set(rapid.SampledFrom([]float64{0, 0.5, 0.95, 1, 1.4}).Draw(t, "s")) },
			"kv": func(t *rapid.T) {
				kv[rapid.SampledFrom([]string{"pod-0", "pod-1"}).Draw(t, "pod")] = rapid.SampledFrom([]float64{0, 0.5, 0.9, 1}).Draw(t, "kv")
			},
			"start": func(t *rapid.T) { it := pick("start", smInFlight); it.started = true; it.tracked.Start() },
			"finish": func(t *rapid.T) {
				it := pick("finish", smInFlight)
				if it.tracked.Done() {
					t.Fatalf("item %d: Done says evicted, the act was never called", it.id)
				}
				end(it, "completed")
			},
			"confirm": func(t *rapid.T) { confirm(pick("confirm", smEvicting), rapid.Bool().Draw(t, "gone")) },
			// The act found nothing to cut (the request had just
			// finished or started): the eviction is undone, and the
			// endpoint may give way again at once.
			"decline": func(t *rapid.T) {
				it := pick("decline", smEvicting)
				it.tracked.Decline()
				it.state = smInFlight
				it.evictions--
			},
			"cancel": func(t *rapid.T) {
				it := pick("cancel", smQueued)
				it.abandoned = true
				d.Abandon(it.band)
			},
		})

		// Drain: the pool empties, everything in flight ends or is
		// confirmed, until nothing is left; then Close.
		sat.Set(0)
		for range 1000 {
			busy := false
			for _, it := range items.Values() {
				switch it.state {
				case smInFlight:
					busy = true
					if it.tracked.Done() {
						t.Fatalf("item %d: evicted without its act", it.id)
					}
					end(it, "completed")
				case smEvicting:
					busy = true
					confirm(it, false)
				case smQueued:
					busy = true
				}
			}
			if !busy {
				break
			}
			clock.Advance(10 * time.Millisecond)
			d.Step()
			ev.Check()
		}
		d.Close()
		st := d.Stats()
		var queued int
		for _, b := range st.Bands {
			queued += b.Queued
		}
		if queued != 0 {
			t.Fatalf("%d still queued", queued)
		}
		for i, b := range st.Bands {
			if n := b.Dispatched + b.Dropped(); n != accepted[i] {
				t.Fatalf("band %d: %d outcomes for %d accepted (%+v)", i, n, accepted[i], b)
			}
		}
		for _, it := range items.Values() {
			if len(it.outcomes) != 1 {
				t.Fatalf("item %d: outcomes %v", it.id, it.outcomes)
			}
		}
		es := ev.Stats()
		if es.Tracked != 0 || es.Evicting != 0 {
			t.Fatalf("evictor still holds %+v", es)
		}
		var evicted uint64
		for _, it := range items.Values() {
			evicted += uint64(it.evictions)
		}
		var counted uint64
		for _, n := range es.Evicted {
			counted += n
		}
		if evicted != counted {
			t.Fatalf("Stats counts %d evictions, the acts were %d", counted, evicted)
		}
	})
}
