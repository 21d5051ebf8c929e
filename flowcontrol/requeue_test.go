package flowcontrol_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol"
)

// recorded is a Dispatcher[int] whose releases and drops are recorded.
type recorded struct {
	d       *flowcontrol.Dispatcher[int]
	out     []int
	dropped map[int]error
}

func TestRequeueGoesFirst(t *testing.T) {
	for _, fairness := range []string{flowcontrol.FairnessFCFS, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare} {
		t.Run(fairness, func(t *testing.T) {
			clock := newFakeClock()
			bands := bandsOf(1, 3)
			bands[0].Fairness = fairness
			r := newRecordedBlocked(t, bands, clock)
			for id := 1; id <= 3; id++ {
				require.NoError(t, r.d.EnqueueFlow(0, "tenant", 1, time.Time{}, id))
			}
			require.ErrorIs(t, r.d.Enqueue(0, 9), flowcontrol.ErrQueueFull)
			// An evicted item comes back at the head, over Capacity, in its
			// own flow or the others'.
			require.NoError(t, r.d.Requeue(0, "other", 1, time.Time{}, 10))
			require.NoError(t, r.d.Requeue(0, "tenant", 1, time.Time{}, 11))
			r.open.Set(0)
			for range 8 {
				r.d.Step()
			}
			switch fairness {
			case flowcontrol.FairnessFCFS:
				assert.Equal(t, []int{11, 10, 1, 2, 3}, r.out)
			case flowcontrol.FairnessRoundRobin:
				// Each re-queued item heads its flow; "tenant" had items,
				// "other" was empty and takes the front of the turn.
				assert.Equal(t, []int{10, 11, 1, 2, 3}, r.out)
			default:
				// Both flows start at the virtual time: the two
				// re-queued items go first, in either order.
				assert.ElementsMatch(t, []int{10, 11}, r.out[:2])
				assert.Equal(t, []int{1, 2, 3}, r.out[2:])
			}
			st := r.d.Stats()
			assert.EqualValues(t, 5, st.Bands[0].Dispatched)
			assert.EqualValues(t, 2, st.Bands[0].Requeued)
			assert.EqualValues(t, 0, st.Bands[0].Queued)
		})
	}
}

// blockedRecorded is a dispatcher whose only band obeys a Static policy read from
// open (BlockCritical), so a test can hold and then release it.
type blockedRecorded struct {
	*recorded
	open *satValue
}

func newRecordedBlocked(t *testing.T, bands []flowcontrol.BandConfig, clock *fakeClock) *blockedRecorded {
	r := &blockedRecorded{recorded: &recorded{dropped: map[int]error{}}, open: newSat(1)}
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
		Config: flowcontrol.Config{Bands: bands, Policy: flowcontrol.NewStatic(0.5), Source: r.open, Now: clock.Now,
			BlockCritical: true},
		Dispatch: func(_ int, id int) { r.out = append(r.out, id) },
		OnDrop:   func(_ int, id int, err error) { r.dropped[id] = err },
	})
	require.NoError(t, err)
	r.d = d
	d.Step()
	return r
}

// TestRequeueKeepsItsDeadline: a re-queued item expires MaxWait after it
// first queued, not after its re-queue.
func TestRequeueKeepsItsDeadline(t *testing.T) {
	clock := newFakeClock()
	r := newRecordedBlocked(t, bandsOf(1, 4, time.Second), clock)
	first := clock.Now()
	clock.Advance(900 * time.Millisecond)
	require.NoError(t, r.d.Requeue(0, "", 1, first, 1))
	require.NoError(t, r.d.Requeue(0, "", 1, time.Time{}, 2)) // zero: since now
	clock.Advance(100 * time.Millisecond)
	r.d.Step()
	assert.Equal(t, map[int]error{1: flowcontrol.ErrExpired}, r.dropped)
	clock.Advance(900 * time.Millisecond)
	r.d.Step()
	assert.Equal(t, map[int]error{1: flowcontrol.ErrExpired, 2: flowcontrol.ErrExpired}, r.dropped)
	assert.Empty(t, r.out)
}

func TestRequeueAfterClose(t *testing.T) {
	clock := newFakeClock()
	r := newRecordedBlocked(t, bandsOf(2, 4), clock)
	require.NoError(t, r.d.Requeue(1, "", 1, time.Time{}, 1))
	require.ErrorIs(t, r.d.Requeue(5, "", 1, time.Time{}, 2), flowcontrol.ErrUnknownBand)
	r.d.Close()
	assert.Equal(t, map[int]error{1: flowcontrol.ErrClosed}, r.dropped, "Close ends a re-queued item")
	require.ErrorIs(t, r.d.Requeue(1, "", 1, time.Time{}, 3), flowcontrol.ErrClosed)
}

// TestControllerEvictsAndRequeues: a Controller with eviction on runs its
// evictor beside the dispatcher; a sheddable request released before a
// critical one stalls is taken back, re-queued at the head of its band
// ahead of a newer sheddable request, and released again when the pool has
// room; Close stops both goroutines (goleak checks it).
func TestControllerEvictsAndRequeues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sat := newSat(0)
		c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{
			Config:   flowcontrol.Config{Bands: bandsOf(2, 4), Policy: flowcontrol.NewStatic(1), Source: sat},
			Eviction: flowcontrol.EvictionConfig{Enabled: true, KVUsage: fullKV},
		})
		require.NoError(t, err)
		ev := c.Evictor()
		require.NotNil(t, ev)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		runErr := c.Start(ctx)

		p, err := c.Wait(ctx, 1)
		require.NoError(t, err)
		since := time.Now()
		upstream, stop := context.WithCancel(ctx) // the forwarded request
		tr := ev.Track(1, "pod", stop)

		sat.Set(1) // the pool fills; a newer sheddable request queues
		time.Sleep(2 * flowcontrol.DefaultTick)
		var wg sync.WaitGroup
		var order []string
		var mu sync.Mutex
		wg.Go(func() {
			p2, err := c.Wait(ctx, 1)
			if assert.NoError(t, err) {
				mu.Lock()
				order = append(order, "newer")
				mu.Unlock()
				p2.Done()
			}
		})
		synctest.Wait()

		crit, err := c.Wait(ctx, 0) // never gated
		require.NoError(t, err)
		ct := ev.Track(0, "pod", func() { t.Error("critical evicted") })
		<-upstream.Done() // Stall later the evictor cancels the sheddable request
		assert.Equal(t, flowcontrol.DefaultEvictionStall, time.Since(since)-2*flowcontrol.DefaultTick)
		require.True(t, tr.Done(), "the server confirms")
		p.Done()
		wg.Go(func() {
			p3, err := c.Requeue(ctx, 1, nil, since)
			if assert.NoError(t, err) {
				mu.Lock()
				order = append(order, "evicted")
				mu.Unlock()
				tr.Again("pod", func() {})
				assert.False(t, tr.Done())
				p3.Done()
			}
		})
		synctest.Wait()
		ct.Start()
		assert.False(t, ct.Done())
		crit.Done()
		sat.Set(0)
		wg.Wait()
		assert.Equal(t, []string{"evicted", "newer"}, order, "the victim goes first")
		assert.Equal(t, flowcontrol.EvictionStats{Evicted: []uint64{0, 1}, Immune: []uint64{0, 0}}, ev.Stats())
		st := c.Stats()
		assert.Equal(t, ev.Stats(), *st.Eviction)
		assert.EqualValues(t, 1, st.Bands[1].Requeued)
		assert.EqualValues(t, 3, st.Bands[1].Dispatched, "the first release, the newer request, the victim again")
		c.Close()
		assert.True(t, errors.Is(<-runErr, flowcontrol.ErrClosed))
		assert.Zero(t, c.InFlight())
	})
}
