package flowcontrol_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/emirpasic/gods/v2/queues/linkedlistqueue"
	"github.com/emirpasic/gods/v2/queues/priorityqueue"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// flowName is the id of test flow k.
func flowName(k int) string { return "tenant-" + strconv.Itoa(k) }

// flowBand is one band of the given fairness.
func flowBand(fairness string, capacity int) []flowcontrol.BandConfig {
	return []flowcontrol.BandConfig{{Capacity: capacity, Fairness: fairness}}
}

// Round-robin: between two releases of a flow that stayed backlogged (it
// had items queued right after the first), every other flow is released at
// most once; and the order is exactly the rotation the model computes: a
// flow that becomes backlogged joins the end of the turn, a flow that is
// released and still has items goes to the end.
func TestRoundRobinProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 6).Draw(t, "flows")
		burst := rapid.IntRange(1, 5).Draw(t, "burst")
		// A gated band (open one opportunity in two, Burst per
		// opening), so that a step releases only a few.
		var r rec
		pol := everyPolicy(2)
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: flowBand(flowcontrol.FairnessRoundRobin, 64), Burst: burst, Source: newSat(0.9),
			Policy: pol}}, &r)
		defer d.Close()
		flowOf := map[int]int{}
		queued := make([]*linkedlistqueue.Queue[int], k)
		for i := range queued {
			queued[i] = linkedlistqueue.New[int]()
		}
		var turn []int // the model's rotation
		inTurn := make([]bool, k)
		next := 0
		var released []int // flow of each release, in order
		backlogged := []bool{}
		for range rapid.IntRange(1, 200).Draw(t, "actions") {
			if rapid.IntRange(0, 2).Draw(t, "op") > 0 {
				f := rapid.IntRange(0, k-1).Draw(t, "flow")
				if err := d.EnqueueFlow(0, flowName(f), 1, time.Time{}, next); err != nil {
					if errors.Is(err, flowcontrol.ErrQueueFull) {
						continue
					}
					t.Fatal(err)
				}
				flowOf[next] = f
				queued[f].Enqueue(next)
				if !inTurn[f] {
					inTurn[f] = true
					turn = append(turn, f)
				}
				next++
				continue
			}
			d.Step()
			for _, e := range r.take() {
				if e.reason != nil {
					t.Fatalf("item %d dropped: %v", e.item, e.reason)
				}
				f := flowOf[e.item]
				if len(turn) == 0 || turn[0] != f {
					t.Fatalf("released flow %d, model's turn %v", f, turn)
				}
				if want, _ := queued[f].Dequeue(); want != e.item {
					t.Fatalf("flow %d released item %d, want %d (FIFO within the flow)", f, e.item, want)
				}
				turn = turn[1:]
				if queued[f].Size() > 0 {
					turn = append(turn, f)
				} else {
					inTurn[f] = false
				}
				released = append(released, f)
				backlogged = append(backlogged, queued[f].Size() > 0)
			}
		}
		// The property, checked on the record (independently of the
		// model above): between two releases of a flow still
		// backlogged after the first, no other flow goes twice.
		for i, f := range released {
			if !backlogged[i] {
				continue
			}
			seen := map[int]int{}
			for j := i + 1; j < len(released) && released[j] != f; j++ {
				if seen[released[j]]++; seen[released[j]] > 1 {
					t.Fatalf("between two releases of backlogged flow %d (at %d), flow %d was released twice: %v", f, i, released[j], released[i:j+1])
				}
			}
		}
	})
}

// everyPolicy opens every band one opportunity in n.
type everyPolicy int

func (p everyPolicy) Gate(band, bands int, s float64) flowcontrol.Gate {
	return flowcontrol.Gate{Ceiling: 0, Every: int(p)}
}

// sfqModel is start-time fair queuing restated over a gods priority queue
// of active flows, keyed by (virtual start tag, activation order): V is the
// start tag of the item in service, and the largest finish tag given when a
// busy period ends.
type sfqModel struct {
	vtime  float64
	maxFin float64 // the largest finish tag: V at the end of a busy period
	finish map[int]float64
	start  map[int]float64
	order  map[int]int
	seq    int
	items  map[int]*linkedlistqueue.Queue[[2]float64] // flow → (id, cost)
	active *priorityqueue.Queue[int]
}

func newSFQModel() *sfqModel {
	m := &sfqModel{finish: map[int]float64{}, start: map[int]float64{}, order: map[int]int{},
		items: map[int]*linkedlistqueue.Queue[[2]float64]{}}
	m.active = priorityqueue.NewWith(func(a, b int) int {
		switch {
		case m.start[a] < m.start[b]:
			return -1
		case m.start[a] > m.start[b]:
			return 1
		}
		return m.order[a] - m.order[b]
	})
	return m
}

func (m *sfqModel) enqueue(f, id int, cost float64) {
	q := m.items[f]
	if q == nil {
		q = linkedlistqueue.New[[2]float64]()
		m.items[f] = q
	}
	if q.Empty() {
		m.start[f] = math.Max(m.vtime, m.finish[f])
		m.order[f] = m.seq
		m.seq++
		m.active.Enqueue(f)
	}
	q.Enqueue([2]float64{float64(id), cost})
}

// release returns the flow and item the model releases next.
func (m *sfqModel) release() (int, int, float64, bool) {
	f, ok := m.active.Dequeue()
	if !ok {
		return 0, 0, 0, false
	}
	it, _ := m.items[f].Dequeue()
	m.vtime = m.start[f]
	m.finish[f] = m.start[f] + it[1]
	m.maxFin = math.Max(m.maxFin, m.finish[f])
	m.start[f] = math.Max(m.vtime, m.finish[f])
	if !m.items[f].Empty() {
		m.active.Enqueue(f)
	}
	if m.active.Empty() {
		// End of a busy period: V jumps to the largest finish tag.
		m.vtime = math.Max(m.vtime, m.maxFin)
	}
	return f, int(it[0]), it[1], true
}

// Fair-share: the release order is exactly start-time fair queuing (the
// gods-heap model above), with flows arriving, emptying and coming back at
// random; no backlogged flow waits longer than its last item's cost plus one
// maximum-cost item of any other flow's service; and over every window of releases in which every flow stayed
// backlogged, any two flows' cost-weighted service differs by at most two
// maximum-cost items (SFQ's fairness bound for equal weights), so over a
// long backlogged run each flow's share is within ±10 % of 1/k once the
// window holds 20 maximum-cost items per flow.
func TestFairShareProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 5).Draw(t, "flows")
		burst := rapid.IntRange(1, 8).Draw(t, "burst")
		maxCost := make([]float64, k)
		for f := range maxCost {
			maxCost[f] = float64(rapid.IntRange(1, 50).Draw(t, "maxCost"))
		}
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: flowBand(flowcontrol.FairnessShare, 256), Burst: burst, Source: newSat(0.9), BlockCritical: true, Policy: everyPolicy(2)}}, &r)
		defer d.Close()
		m := newSFQModel()
		flowOf, costOf := map[int]int{}, map[int]float64{}
		queued := make([]int, k)
		next := 0
		type rel struct {
			flow int
			cost float64
			all  bool // every flow backlogged just before this release
			more bool // the flow still backlogged just after
		}
		var rels []rel
		lmax := 0.0
		for range rapid.IntRange(1, 300).Draw(t, "actions") {
			if rapid.IntRange(0, 3).Draw(t, "op") > 0 {
				f := rapid.IntRange(0, k-1).Draw(t, "flow")
				c := float64(rapid.IntRange(1, int(maxCost[f])).Draw(t, "cost"))
				if err := d.EnqueueFlow(0, flowName(f), c, time.Time{}, next); err != nil {
					continue // band full
				}
				m.enqueue(f, next, c)
				flowOf[next], costOf[next] = f, c
				queued[f]++
				lmax = math.Max(lmax, c)
				next++
				continue
			}
			d.Step()
			for _, e := range r.take() {
				all := true
				for _, q := range queued {
					all = all && q > 0
				}
				f, id, _, ok := m.release()
				if !ok || id != e.item {
					t.Fatalf("released item %d (flow %d), model says item %d (flow %d, ok %v)", e.item, flowOf[e.item], id, f, ok)
				}
				queued[f]--
				rels = append(rels, rel{f, costOf[e.item], all, queued[f] > 0})
			}
		}
		// No backlogged flow waits unboundedly: between two releases of
		// a flow that stayed backlogged, every other flow receives at
		// most the cost of the first release plus one maximum-cost item
		// (its items with start tags between the two).
		for i, x := range rels {
			if !x.more {
				continue
			}
			other := map[int]float64{}
			for j := i + 1; j < len(rels) && rels[j].flow != x.flow; j++ {
				if other[rels[j].flow] += rels[j].cost; other[rels[j].flow] > x.cost+lmax {
					t.Fatalf("flow %d backlogged after release %d (cost %v) while flow %d received %v > %v", x.flow, i, x.cost, rels[j].flow, other[rels[j].flow], x.cost+lmax)
				}
			}
		}
		if k < 2 {
			return
		}
		// Windows in which every flow was backlogged before each release.
		for i := 0; i < len(rels); i++ {
			w := make([]float64, k)
			for j := i; j < len(rels) && rels[j].all; j++ {
				w[rels[j].flow] += rels[j].cost
				lo, hi := math.Inf(1), math.Inf(-1)
				total := 0.0
				for _, x := range w {
					lo, hi = math.Min(lo, x), math.Max(hi, x)
					total += x
				}
				if hi-lo > 2*lmax {
					t.Fatalf("window %d..%d: services %v differ by %v > 2 × max cost %v", i, j, w, hi-lo, lmax)
				}
				if mean := total / float64(k); mean >= 20*lmax {
					for f, x := range w {
						if math.Abs(x-mean) > 0.1*mean {
							t.Fatalf("window %d..%d: flow %d served %v, mean %v: outside ±10 %%", i, j, f, x, mean)
						}
					}
				}
			}
		}
	})
}

// Fair-share never starves: with two flows kept backlogged, one of cheap
// items and one of items 100 × dearer, the dear flow is released within
// every two maximum-cost items' worth of the cheap flow's service, and a
// flow that arrives late starts at the current virtual time — it is not
// ahead for its idle past (it does not monopolise the band) nor behind.
func TestFairShareNoStarvationNewcomer(t *testing.T) {
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: flowBand(flowcontrol.FairnessShare, 4096), Burst: 1, Source: newSat(0), BlockCritical: true, Policy: everyPolicy(2)}}, &r)
	defer d.Close()
	id := 0
	enq := func(flow string, cost float64, n int) {
		for range n {
			if err := d.EnqueueFlow(0, flow, cost, time.Time{}, id); err != nil {
				t.Fatal(err)
			}
			id++
		}
	}
	enq("cheap", 1, 2000)
	for range 2000 { // one release per two steps
		d.Step()
	}
	r.take()
	// The newcomer arrives after 1000 units of service to "cheap".
	first := id
	enq("dear", 100, 10)
	served := map[bool]float64{}
	sinceDear := 0.0
	for range 2400 {
		d.Step()
		for _, e := range r.take() {
			dear := e.item >= first
			if dear {
				served[true] += 100
				sinceDear = 0
			} else {
				served[false]++
				sinceDear++
			}
			if sinceDear > 200 {
				t.Fatalf("dear flow waited %v units of cheap service", sinceDear)
			}
		}
	}
	// 1200 releases: the shares are within two dear items of equal.
	if diff := math.Abs(served[true] - served[false]); diff > 200 {
		t.Fatalf("served %v: a newcomer must neither monopolise nor starve", served)
	}
}

// Per-flow capacity is exact: a flow is refused with ErrFlowFull (which is
// ErrQueueFull) exactly when it holds FlowCapacity items, whatever the
// others hold; the band's Capacity still applies; Stats counts each.
func TestFlowCapacityExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 20).Draw(t, "capacity")
		fc := rapid.IntRange(1, capacity).Draw(t, "flowCapacity")
		fair := rapid.SampledFrom([]string{flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare}).Draw(t, "fairness")
		var r rec
		bands := []flowcontrol.BandConfig{{Capacity: capacity, Fairness: fair, FlowCapacity: fc}}
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands: bands, Burst: 1, Source: newSat(0), BlockCritical: true, Policy: everyPolicy(1)}}, &r)
		defer d.Close()
		held := map[string]int{}
		flowOf := map[int]string{}
		total, full, flowFull := 0, uint64(0), uint64(0)
		for i := range rapid.IntRange(1, 100).Draw(t, "actions") {
			if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				d.Step()
				for _, e := range r.take() {
					held[flowOf[e.item]]--
					total--
				}
				continue
			}
			f := flowName(rapid.IntRange(0, 3).Draw(t, "flow"))
			err := d.EnqueueFlow(0, f, 1, time.Time{}, i)
			switch {
			case total >= capacity:
				if !errors.Is(err, flowcontrol.ErrQueueFull) || errors.Is(err, flowcontrol.ErrFlowFull) {
					t.Fatalf("band full: got %v", err)
				}
				full++
			case held[f] >= fc:
				if !errors.Is(err, flowcontrol.ErrFlowFull) || !errors.Is(err, flowcontrol.ErrQueueFull) {
					t.Fatalf("flow %s holds %d of %d: got %v", f, held[f], fc, err)
				}
				flowFull++
			case err != nil:
				t.Fatalf("flow %s holds %d of %d, band %d of %d: refused %v", f, held[f], fc, total, capacity, err)
			default:
				held[f]++
				total++
				flowOf[i] = f
			}
			st := d.Stats().Bands[0]
			if st.Rejected != full || st.FlowFull != flowFull || st.Queued != total {
				t.Fatalf("stats %+v, want rejected %d flowFull %d queued %d", st, full, flowFull, total)
			}
			for _, fsx := range d.Flows(0) {
				if fsx.Queued != held[fsx.Flow] {
					t.Fatalf("Flows: %s queued %d, model %d", fsx.Flow, fsx.Queued, held[fsx.Flow])
				}
			}
		}
	})
}

// flowItem is what the flow state machine knows of an accepted item.
type flowItem struct {
	band, flow int
	seq        int
	due        int64 // fake-clock ns; math.MaxInt64 = none
	ended      bool
}

// Exactly once with flows: random EnqueueFlow (with costs and per-item
// deadlines) / cancel (with or without Abandon) / advance time / change
// saturation / Step / Poll / Close on a round-robin and a fair-share band,
// each with a random ordering, MaxWait and FlowCapacity. Checked after every
// action: each item ends once; a cancelled owner's item ends as cancelled;
// an item expires only when due and is dispatched only before; nothing due
// is left queued after a Step; after an Abandon's tick no abandoned item is
// left; within a flow items leave in FIFO (fcfs) or deadline (edf) order;
// refusals are exactly the model's (band full, flow full); Stats and Flows
// add up to the model.
func TestFlowStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const nb = 2
		fair := []string{flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare}
		bands := make([]flowcontrol.BandConfig, nb)
		for b := range bands {
			bands[b] = flowcontrol.BandConfig{
				Capacity: rapid.IntRange(1, 8).Draw(t, "capacity"),
				Fairness: fair[b],
				Ordering: rapid.SampledFrom([]string{"", flowcontrol.OrderingFCFS, flowcontrol.OrderingEDF}).Draw(t, "ordering"),
				MaxWait:  time.Duration(rapid.IntRange(0, 5).Draw(t, "maxWaitMs")) * time.Millisecond,
			}
			bands[b].FlowCapacity = rapid.IntRange(0, bands[b].Capacity).Draw(t, "flowCapacity")
			// Short enough that flows are forgotten and come back
			// within a run.
			bands[b].FlowIdle = time.Duration(rapid.IntRange(1, 8).Draw(t, "flowIdleMs")) * time.Millisecond
		}
		burst := rapid.IntRange(1, 3).Draw(t, "burst")
		clk := newFakeClock()
		sat := newSat(0)
		dead := map[int]bool{}
		var r rec
		d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bands, Burst: burst, Source: sat, Now: clk.Now},
			Abandoned: func(i int) bool { return dead[i] }}, &r)
		items := map[int]*flowItem{}
		counts := make([]map[string]uint64, nb)
		for b := range counts {
			counts[b] = map[string]uint64{}
		}
		pending := make([]bool, nb) // Abandon called since the band's last run
		closed := false
		next, seq := 0, 0
		queuedIn := func(b, f int) int {
			n := 0
			for _, it := range items {
				if !it.ended && it.band == b && (f < 0 || it.flow == f) {
					n++
				}
			}
			return n
		}
		// before reports whether it must leave its flow before x.
		before := func(it, x *flowItem) bool {
			if bands[x.band].Ordering == flowcontrol.OrderingEDF {
				return it.due < x.due || it.due == x.due && it.seq < x.seq
			}
			return it.seq < x.seq
		}
		handle := func(what string, now int64) {
			for _, e := range r.take() {
				x := items[e.item]
				if x == nil || x.ended {
					t.Fatalf("%s: item %d ended twice or never accepted: %v", what, e.item, e.reason)
				}
				switch {
				case dead[e.item]:
					if !errors.Is(e.reason, flowcontrol.ErrCancelled) {
						t.Fatalf("%s: item %d, cancelled by its owner, ended %v", what, e.item, e.reason)
					}
				case e.reason == nil:
					if now >= x.due {
						t.Fatalf("%s: item %d dispatched at %d, due %d", what, e.item, now, x.due)
					}
					for id, it := range items {
						if !it.ended && id != e.item && it.band == x.band && it.flow == x.flow && !dead[id] && before(it, x) && now < it.due {
							t.Fatalf("%s: item %d of band %d flow %d dispatched before live item %d", what, e.item, x.band, x.flow, id)
						}
					}
				case errors.Is(e.reason, flowcontrol.ErrExpired):
					if now < x.due {
						t.Fatalf("%s: item %d expired at %d, due %d", what, e.item, now, x.due)
					}
				case errors.Is(e.reason, flowcontrol.ErrClosed):
					if what != "Close" {
						t.Fatalf("%s: item %d closed", what, e.item)
					}
				default:
					t.Fatalf("%s: item %d ended %v", what, e.item, e.reason)
				}
				x.ended = true
				counts[x.band][reasonName(e.reason)]++
			}
		}
		check := func(what string) {
			st := d.Stats()
			for b, bs := range st.Bands {
				c := counts[b]
				if bs.Queued != queuedIn(b, -1) || bs.Dispatched != c["dispatched"] ||
					bs.Expired != c[flowcontrol.ErrExpired.Error()] || bs.Cancelled != c[flowcontrol.ErrCancelled.Error()] ||
					bs.Closed != c[flowcontrol.ErrClosed.Error()] {
					t.Fatalf("%s: band %d stats %+v, model queued %d counts %v", what, b, bs, queuedIn(b, -1), c)
				}
				for _, f := range d.Flows(b) {
					k, _ := strconv.Atoi(f.Flow[len("tenant-"):])
					if f.Queued != queuedIn(b, k) {
						t.Fatalf("%s: band %d flow %s queued %d, model %d", what, b, f.Flow, f.Queued, queuedIn(b, k))
					}
				}
			}
		}
		now := func() int64 { return int64(clk.Elapsed()) }
		for range rapid.IntRange(10, 300).Draw(t, "actions") {
			what := rapid.SampledFrom([]string{"enqueue", "enqueue", "enqueue", "cancel", "advance", "advance",
				"saturation", "step", "step", "step", "poll", "close"}).Draw(t, "action")
			switch what {
			case "enqueue":
				b := rapid.IntRange(0, nb-1).Draw(t, "band")
				f := rapid.IntRange(0, 3).Draw(t, "flow")
				var deadline time.Time
				dl := int64(math.MaxInt64)
				if rapid.Bool().Draw(t, "hasDeadline") {
					off := time.Duration(rapid.IntRange(0, 6).Draw(t, "deadlineMs")) * time.Millisecond
					deadline = clk.Now().Add(off)
					dl = now() + int64(off)
				}
				err := d.EnqueueFlow(b, flowName(f), float64(rapid.IntRange(1, 9).Draw(t, "cost")), deadline, next)
				var want error
				switch {
				case closed:
					want = flowcontrol.ErrClosed
				case queuedIn(b, -1) >= bands[b].Capacity:
					want = flowcontrol.ErrQueueFull
				case bands[b].FlowCapacity > 0 && queuedIn(b, f) >= bands[b].FlowCapacity:
					want = flowcontrol.ErrFlowFull
				}
				if want == nil && err != nil || want != nil && !errors.Is(err, want) ||
					errors.Is(err, flowcontrol.ErrFlowFull) != errors.Is(want, flowcontrol.ErrFlowFull) {
					t.Fatalf("EnqueueFlow(%d, flow %d) = %v, model %v", b, f, err, want)
				}
				if err == nil {
					due := int64(math.MaxInt64)
					if bands[b].MaxWait > 0 {
						due = now() + int64(bands[b].MaxWait)
					}
					if bands[b].Ordering == flowcontrol.OrderingEDF {
						due = min(due, dl)
					}
					items[next] = &flowItem{band: b, flow: f, seq: seq, due: due}
					seq++
				}
				next++
			case "cancel":
				var live []int
				for id, it := range items {
					if !it.ended && !dead[id] {
						live = append(live, id)
					}
				}
				if len(live) == 0 {
					continue
				}
				slices.Sort(live)
				id := rapid.SampledFrom(live).Draw(t, "id")
				dead[id] = true
				if rapid.Bool().Draw(t, "abandon") {
					pending[items[id].band] = !closed
					d.Abandon(items[id].band)
				}
			case "advance":
				clk.Advance(time.Duration(rapid.IntRange(0, 3).Draw(t, "ms")) * time.Millisecond)
			case "saturation":
				sat.Set(saturationGen().Draw(t, "s"))
			case "step", "poll":
				if what == "step" {
					d.Step()
				} else {
					d.Flush()
				}
				handle(what, now())
				for id, it := range items {
					if closed || it.ended {
						continue
					}
					if what == "step" && it.due <= now() {
						t.Fatalf("step: item %d due at %d still queued at %d", id, it.due, now())
					}
					if pending[it.band] && dead[id] {
						t.Fatalf("%s: abandoned item %d still queued after the sweep", what, id)
					}
				}
				clear(pending)
			case "close":
				if rapid.IntRange(0, 9).Draw(t, "reallyClose") != 0 {
					continue
				}
				closed = true
				d.Close()
				handle("Close", now())
			}
			check(what)
		}
		d.Close()
		handle("Close", now())
		for id, it := range items {
			if !it.ended {
				t.Fatalf("after Close item %d has no outcome", id)
			}
		}
	})
}

// Idle flows are forgotten: a flow with nothing queued for FlowIdle leaves
// Flows and Stats.Flows by the tick after 1.25 × FlowIdle, not before
// FlowIdle; a flow with items (here in a blocked band) is never forgotten; a
// forgotten flow that comes back starts afresh (its Dispatched from 0).
func TestIdleFlowsForgotten(t *testing.T) {
	clk := newFakeClock()
	var r rec
	mk := func(every int) *flowcontrol.Dispatcher[int] {
		return newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
			Bands:  []flowcontrol.BandConfig{{Capacity: 8, Fairness: flowcontrol.FairnessShare, FlowIdle: time.Minute}},
			Source: newSat(0.9), BlockCritical: true, Policy: everyPolicy(every), Now: clk.Now}}, &r)
	}
	open, blocked := mk(1), mk(0)
	defer open.Close()
	defer blocked.Close()
	known := func(d *flowcontrol.Dispatcher[int]) map[string]flowcontrol.FlowStats {
		m := map[string]flowcontrol.FlowStats{}
		for _, f := range d.Flows(0) {
			m[f.Flow] = f
		}
		if n := d.Stats().Bands[0].Flows; n != len(m) {
			t.Fatalf("Stats.Flows %d, Flows lists %d", n, len(m))
		}
		return m
	}
	step := func() { open.Step(); blocked.Step(); r.take() }
	if err := open.EnqueueFlow(0, "a", 1, time.Time{}, 1); err != nil {
		t.Fatal(err)
	}
	if err := blocked.EnqueueFlow(0, "b", 1, time.Time{}, 2); err != nil {
		t.Fatal(err)
	}
	step() // a released, b stays
	if k := known(open); k["a"].Dispatched != 1 || len(k) != 1 {
		t.Fatalf("flows %v", k)
	}
	clk.Advance(time.Minute - time.Nanosecond)
	step()
	if _, ok := known(open)["a"]; !ok {
		t.Fatal("a forgotten before FlowIdle")
	}
	clk.Advance(time.Minute / 4)
	step()
	if k := known(open); len(k) != 0 {
		t.Fatalf("a still known 1.25 × FlowIdle after its last item: %v", k)
	}
	if k := known(blocked); k["b"].Queued != 1 {
		t.Fatalf("b, queued, must not be forgotten: %v", k)
	}
	if err := open.EnqueueFlow(0, "a", 1, time.Time{}, 3); err != nil {
		t.Fatal(err)
	}
	step()
	if k := known(open); k["a"].Dispatched != 1 {
		t.Fatalf("a came back: %v, want Dispatched 1 (afresh)", k)
	}
}

// Forgetting is invisible to the order: the same run of enqueues (costs,
// flows coming and going), charges of released items (before the clock
// moves on: a Controller pins a flow until its done charges it),
// cancellations and ticks, on a clock that advances, releases exactly the
// same items at the same ticks whether idle flows are forgotten after 1 ms
// or remembered for an hour.
func TestForgettingInvisible(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fair := rapid.SampledFrom([]string{flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare}).Draw(t, "fairness")
		ord := rapid.SampledFrom([]string{flowcontrol.OrderingFCFS, flowcontrol.OrderingEDF}).Draw(t, "ordering")
		burst := rapid.IntRange(1, 3).Draw(t, "burst")
		clk := newFakeClock()
		dead := map[int]bool{}
		var ra, rb rec
		mk := func(idle time.Duration, r *rec) *flowcontrol.Dispatcher[int] {
			return newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
				Bands: []flowcontrol.BandConfig{{Capacity: 32, Fairness: fair, Ordering: ord, FlowIdle: idle}},
				Burst: burst, Source: newSat(0), BlockCritical: true, Policy: everyPolicy(2), Now: clk.Now},
				Abandoned: func(i int) bool { return dead[i] }}, r)
		}
		a, b := mk(time.Millisecond, &ra), mk(time.Hour, &rb)
		defer a.Close()
		defer b.Close()
		next := 0
		flowOf := map[int]string{}
		var released []string // flows released at the last step: what a host charges
		for range rapid.IntRange(1, 200).Draw(t, "actions") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0, 1:
				f := flowName(rapid.IntRange(0, 3).Draw(t, "flow"))
				c := float64(rapid.IntRange(1, 9).Draw(t, "cost"))
				dl := clk.Now().Add(time.Duration(rapid.IntRange(1, 9).Draw(t, "deadlineMs")) * time.Millisecond)
				ea, eb := a.EnqueueFlow(0, f, c, dl, next), b.EnqueueFlow(0, f, c, dl, next)
				if (ea == nil) != (eb == nil) {
					t.Fatalf("enqueue: %v and %v", ea, eb)
				}
				flowOf[next] = f
				next++
			case 2:
				// A host charges a released item's flow when the
				// request ends (Controller's done does, and pins
				// the flow till then): here before the clock moves
				// on from its release.
				if len(released) == 0 {
					continue
				}
				f := rapid.SampledFrom(released).Draw(t, "charged")
				delta := float64(rapid.IntRange(-5, 20).Draw(t, "delta"))
				a.Charge(0, f, delta)
				b.Charge(0, f, delta)
			case 3:
				if next > 0 {
					id := rapid.IntRange(0, next-1).Draw(t, "cancel")
					dead[id] = true
					a.Abandon(0)
					b.Abandon(0)
				}
			case 4:
				clk.Advance(time.Duration(rapid.IntRange(0, 3).Draw(t, "ms")) * time.Millisecond)
				released = nil
			case 5:
				a.Step()
				b.Step()
				released = nil
				for _, e := range ra.events {
					if e.reason == nil {
						released = append(released, flowOf[e.item])
					}
				}
				// Releases in order; drops as a set (a sweep's
				// drops come in the order of the band's flow
				// list, which forgetting reshuffles).
				if ga, gb := outcomes(ra.take()), outcomes(rb.take()); ga != gb {
					t.Fatalf("forgetting changed the outcomes:\nforgetting: %s\nremembering: %s", ga, gb)
				}
			}
		}
	})
}

// outcomes prints the dispatched items in order, then the drops sorted.
func outcomes(evs []event) string {
	var sent []int
	var dropped []string
	for _, e := range evs {
		if e.reason == nil {
			sent = append(sent, e.item)
		} else {
			dropped = append(dropped, fmt.Sprint(e.item, e.reason))
		}
	}
	slices.Sort(dropped)
	return fmt.Sprint(sent, dropped)
}
