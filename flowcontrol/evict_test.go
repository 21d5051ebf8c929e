package flowcontrol_test

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/emirpasic/gods/v2/sets/treeset"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/flowcontrol"
)

// trackedReq is one tracked request in the victim-order model.
type trackedReq struct {
	id       int
	band     int
	endpoint string
	started  bool
	at       time.Duration // dispatch time on the fake clock
	t        *flowcontrol.Tracked
}

// better is the model's victim order: the least critical band, then the
// newest release (the later Track, which the generator gives distinct ids in
// release order).
func better(a, b *trackedReq) int {
	if c := cmp.Compare(b.band, a.band); c != 0 {
		return c
	}
	return cmp.Compare(b.id, a.id)
}

// victimOrderProperty tracks a random set of released requests on random
// endpoints and checks that one Check takes exactly the model's victims: on
// every endpoint holding a stalled request, the best victim of a less
// critical band released there before the newest stalled request of the
// most critical stalled band (gods' ordered set is the oracle); for a band held at the
// gateway, the best victim anywhere whose endpoint is not giving way
// already. Started requests are victims only with Started.
func victimOrderProperty(t *rapid.T) {
	bands := rapid.IntRange(2, 4).Draw(t, "bands")
	startedOK := rapid.Bool().Draw(t, "started-ok")
	n := rapid.IntRange(0, 24).Draw(t, "n")
	eps := []string{"a", "b", "c"}
	clock := newFakeClock()
	sat := newSat(rapid.Float64Range(0, 2).Draw(t, "sat"))
	held := rapid.IntRange(-1, bands-1).Draw(t, "held")
	kv := map[string]float64{}
	for _, ep := range eps {
		kv[ep] = rapid.SampledFrom([]float64{0.5, 0.89, 0.9, 1, math.NaN()}).Draw(t, "kv")
	}
	cfg := flowcontrol.EvictionConfig{Stall: 100 * time.Millisecond, Started: startedOK,
		KVUsage: func(ep string) float64 { return kv[ep] }}
	var acts []int
	ev, err := flowcontrol.NewEvictor(cfg, bands, sat, func() int { return held }, clock.Now)
	require.NoError(t, err)

	// Release times, oldest first, from 0 to 300 ms before the check.
	ages := make([]time.Duration, n)
	for i := range ages {
		ages[i] = time.Duration(rapid.IntRange(0, 300).Draw(t, "age")) * time.Millisecond
	}
	slices.SortFunc(ages, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	reqs := make([]*trackedReq, n)
	start := clock.Elapsed()
	for i := range reqs {
		r := &trackedReq{id: i, band: rapid.IntRange(0, bands-1).Draw(t, "band"),
			endpoint: rapid.SampledFrom(eps).Draw(t, "endpoint"), started: rapid.Bool().Draw(t, "started")}
		r.at = start + 300*time.Millisecond - ages[i]
		clock.Advance(r.at - clock.Elapsed())
		id := i
		r.t = ev.Track(r.band, r.endpoint, func() { acts = append(acts, id) })
		if r.started {
			r.t.Start()
		}
		reqs[i] = r
	}
	clock.Advance(start + 300*time.Millisecond - clock.Elapsed())
	now := clock.Elapsed()

	got := ev.Check()

	var want []int
	{
		busy := map[string]bool{}
		for _, ep := range eps {
			if !(kv[ep] >= flowcontrol.DefaultEvictionKVThreshold) {
				continue // not full: a held request waits for compute
			}
			// The most critical stalled band on ep, and its newest
			// stalled request: victims were released before it.
			h, last := -1, -1
			for _, r := range reqs {
				if r.endpoint == ep && !r.started && r.band < bands-1 && now-r.at >= cfg.Stall {
					if h < 0 || r.band < h {
						h, last = r.band, r.id
					} else if r.band == h {
						last = max(last, r.id)
					}
				}
			}
			if h < 0 {
				continue
			}
			cands := treeset.NewWith(better)
			for _, r := range reqs {
				if r.endpoint == ep && r.id < last && r.band > h && (!r.started || startedOK) {
					cands.Add(r)
				}
			}
			if v, ok := cands.Values(), !cands.Empty(); ok {
				want = append(want, v[0].id)
				busy[ep] = true
			}
		}
		if held >= 0 && held < bands-1 && sat.Saturation() >= flowcontrol.DefaultEvictionThreshold {
			cands := treeset.NewWith(better)
			for _, r := range reqs {
				if r.band > held && (!r.started || startedOK) && !busy[r.endpoint] && !slices.Contains(want, r.id) {
					cands.Add(r)
				}
			}
			if !cands.Empty() {
				want = append(want, cands.Values()[0].id)
			}
		}
	}
	slices.Sort(want)
	slices.Sort(acts)
	assert.Equal(t, want, acts, "victims")
	assert.Equal(t, len(want), got, "Check's count")
	st := ev.Stats()
	assert.Equal(t, n, st.Tracked)
	assert.Equal(t, len(want), st.Evicting)
	for _, id := range acts {
		assert.True(t, reqs[id].t.Done(), "a victim's Done confirms its eviction")
	}
	for _, r := range reqs {
		if !slices.Contains(acts, r.id) {
			assert.False(t, r.t.Done(), "a request not taken was not evicted")
		}
		assert.False(t, r.t.Done(), "a second Done counts for nothing")
	}
	st = ev.Stats()
	assert.Zero(t, st.Tracked)
	assert.Zero(t, st.Evicting)
}

func TestEvictorVictimOrder(t *testing.T) { rapid.Check(t, victimOrderProperty) }

// FuzzEvictorVictimOrder runs the victim-order property on fuzzed choices;
// its seed corpus runs with go test.
func FuzzEvictorVictimOrder(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 1, 0, 200, 7, 9, 1, 1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Fuzz(rapid.MakeFuzz(victimOrderProperty))
}

func TestEvictorConfigErrors(t *testing.T) {
	sat := newSat(1)
	for name, tc := range map[string]struct {
		cfg   flowcontrol.EvictionConfig
		bands int
		src   flowcontrol.SaturationSource
	}{
		"bands":          {bands: 0, src: sat},
		"Source":         {bands: 2},
		"KVUsage":        {bands: 2, src: sat},
		"KVThreshold":    {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, KVThreshold: 1.5}, bands: 2, src: sat},
		"Threshold":      {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, Threshold: -1}, bands: 2, src: sat},
		"Stall":          {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, Stall: -1}, bands: 2, src: sat},
		"Grace":          {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, Grace: -1}, bands: 2, src: sat},
		"MaxEvictions":   {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, MaxEvictions: -1}, bands: 2, src: sat},
		"ConfirmTimeout": {cfg: flowcontrol.EvictionConfig{KVUsage: fullKV, ConfirmTimeout: -1}, bands: 2, src: sat},
	} {
		_, err := flowcontrol.NewEvictor(tc.cfg, tc.bands, tc.src, nil, nil)
		require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig, name)
		assert.Contains(t, err.Error(), name)
	}
	ev, err := flowcontrol.NewEvictor(flowcontrol.EvictionConfig{KVUsage: fullKV}, 2, sat, nil, nil)
	require.NoError(t, err)
	cfg := ev.Config()
	assert.NotNil(t, cfg.KVUsage)
	cfg.KVUsage = nil
	assert.Equal(t, flowcontrol.EvictionConfig{Threshold: flowcontrol.DefaultEvictionThreshold,
		KVThreshold: flowcontrol.DefaultEvictionKVThreshold,
		Stall:       flowcontrol.DefaultEvictionStall, Grace: flowcontrol.DefaultEvictionGrace,
		MaxEvictions: flowcontrol.DefaultMaxEvictions, ConfirmTimeout: flowcontrol.DefaultEvictionConfirmTimeout}, cfg)
}

// TestEvictorPacing: one eviction in flight per endpoint, the next only
// Grace after the server confirmed the last; a request evicted
// MaxEvictions times is immune.
func TestEvictorPacing(t *testing.T) {
	clock := newFakeClock()
	sat := newSat(1)
	kv := 1.0
	cfg := flowcontrol.EvictionConfig{Stall: 10 * time.Millisecond, Grace: 50 * time.Millisecond, MaxEvictions: 1,
		KVUsage: func(string) float64 { return kv }}
	ev, err := flowcontrol.NewEvictor(cfg, 2, sat, nil, clock.Now)
	require.NoError(t, err)
	var taken []string
	track := func(name string, band int) *flowcontrol.Tracked {
		return ev.Track(band, "pod", func() { taken = append(taken, name) })
	}
	old := track("old", 1)
	clock.Advance(time.Millisecond)
	young := track("young", 1)
	clock.Advance(time.Millisecond)
	crit := track("critical", 0)
	assert.Zero(t, ev.Check(), "not stalled yet")
	assert.Equal(t, clock.Now().Add(cfg.Stall), ev.Next(), "the stall deadline")
	clock.Advance(cfg.Stall)
	assert.Equal(t, 1, ev.Check())
	assert.Equal(t, []string{"young"}, taken, "the newest first")
	clock.Advance(time.Second)
	assert.Zero(t, ev.Check(), "one eviction in flight per endpoint")
	require.True(t, young.Done())
	assert.Zero(t, ev.Check(), "the grace after the confirmation")
	assert.Equal(t, clock.Now().Add(cfg.Grace), ev.Next())
	clock.Advance(cfg.Grace - 1)
	assert.Zero(t, ev.Check())
	clock.Advance(1)
	young.Again("pod", func() { taken = append(taken, "young again") })
	assert.Equal(t, 1, ev.Check())
	assert.Equal(t, []string{"young", "old"}, taken, "young is immune after MaxEvictions 1 (and released after the held request now)")
	st := ev.Stats()
	assert.Equal(t, []uint64{0, 2}, st.Evicted)
	assert.Equal(t, []uint64{0, 2}, st.Immune)
	kv = 0.89
	require.True(t, old.Done())
	clock.Advance(time.Second)
	assert.Zero(t, ev.Check(), "below the KV threshold nothing is taken")
	crit.Start()
	kv = 1
	assert.Zero(t, ev.Check(), "a started request is not held")
	assert.False(t, crit.Done())
	assert.False(t, young.Done())
	assert.Equal(t, 0, ev.Stats().Tracked)
}

// TestEvictorConfirmTimeout: a victim whose Done never comes (a hung
// stream) holds its endpoint for ConfirmTimeout, not for ever.
func TestEvictorConfirmTimeout(t *testing.T) {
	clock := newFakeClock()
	cfg := flowcontrol.EvictionConfig{ConfirmTimeout: time.Second, KVUsage: fullKV}
	ev, err := flowcontrol.NewEvictor(cfg, 2, newSat(1), nil, clock.Now)
	require.NoError(t, err)
	var taken []string
	ev.Track(1, "pod", func() { taken = append(taken, "hung") })
	clock.Advance(time.Millisecond)
	ev.Track(1, "pod", func() { taken = append(taken, "hung") })
	ev.Track(1, "pod", func() { taken = append(taken, "next") })
	ev.Track(0, "pod", func() {})
	clock.Advance(flowcontrol.DefaultEvictionStall)
	assert.Equal(t, 1, ev.Check())
	assert.Equal(t, clock.Now().Add(flowcontrol.DefaultEvictionStall), ev.Next(), "the held request calls again a Stall later")
	clock.Advance(flowcontrol.DefaultEvictionStall)
	assert.Zero(t, ev.Check(), "its endpoint waits for the confirmation")
	assert.Equal(t, clock.Now().Add(time.Second-flowcontrol.DefaultEvictionStall), ev.Next(), "the confirmation's deadline")
	clock.Advance(time.Second - flowcontrol.DefaultEvictionStall - 1)
	assert.Zero(t, ev.Check())
	clock.Advance(1)
	assert.Equal(t, 1, ev.Check())
	assert.Equal(t, []string{"next", "hung"}, taken)
	assert.Equal(t, 2, ev.Stats().Evicting, "both still unconfirmed")
}

// TestDispatcherHeld: the held band is the most critical band that its
// gate keeps items back in.
func TestDispatcherHeld(t *testing.T) {
	sat := newSat(0)
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
		Config:   flowcontrol.Config{Bands: bandsOf(3, 8), Policy: flowcontrol.NewStatic(0.5), Source: sat},
		Dispatch: func(int, int) {},
	})
	require.NoError(t, err)
	assert.Equal(t, -1, d.Held())
	sat.Set(0.9)
	d.Step()
	require.NoError(t, d.Enqueue(2, 1))
	d.Step()
	assert.Equal(t, 2, d.Held())
	require.NoError(t, d.Enqueue(1, 2))
	require.NoError(t, d.Enqueue(0, 3))
	d.Step()
	assert.Equal(t, 1, d.Held(), "band 0 is never held: it is never gated")
	sat.Set(0)
	d.Step()
	d.Step()
	assert.Equal(t, -1, d.Held())
}

func ExampleEvictor() {
	// A host that drives its own clock: a simulator, or a test.
	now := time.Unix(0, 0)
	ev, _ := flowcontrol.NewEvictor(flowcontrol.EvictionConfig{KVUsage: func(string) float64 { return 0.97 }}, 2, saturationOf(1), nil,
		func() time.Time { return now })
	batch := ev.Track(1, "pod-a", func() { fmt.Println("cancel the batch request") })
	ev.Track(0, "pod-a", func() {}) // critical, waiting for its first token
	now = now.Add(flowcontrol.DefaultEvictionStall)
	ev.Check()
	// The server confirms: the connection closed. The batch request had
	// sent nothing to its client, so the host re-queues it.
	fmt.Println("evicted:", batch.Done())
	// Output:
	// cancel the batch request
	// evicted: true
}

// fullKV reads every endpoint's KV cache full.
func fullKV(string) float64 { return 1 }

type saturationOf float64

func (s saturationOf) Saturation() float64 { return float64(s) }

// TestEvictorDecline: an act that found nothing to cut is undone: not
// counted, not toward MaxEvictions, and the endpoint gives way again at
// once, with no confirmation to wait for and no grace.
func TestEvictorDecline(t *testing.T) {
	clock := newFakeClock()
	ev, err := flowcontrol.NewEvictor(flowcontrol.EvictionConfig{KVUsage: fullKV, MaxEvictions: 1}, 2, newSat(1), nil, clock.Now)
	require.NoError(t, err)
	var taken []string
	older := ev.Track(1, "pod", func() { taken = append(taken, "older") })
	var newer *flowcontrol.Tracked
	newer = ev.Track(1, "pod", func() { taken = append(taken, "newer"); newer.Decline() })
	ev.Track(0, "pod", func() {})
	clock.Advance(flowcontrol.DefaultEvictionStall)
	assert.Equal(t, 1, ev.Check())
	assert.Equal(t, flowcontrol.EvictionStats{Tracked: 3, Evicted: []uint64{0, 0}, Immune: []uint64{0, 0}}, ev.Stats())
	assert.Zero(t, newer.Evictions())
	clock.Advance(flowcontrol.DefaultEvictionStall) // the held request calls again
	newer.Start()                                   // and the declined one has started: no victim now
	assert.Equal(t, 1, ev.Check(), "no confirmation, no grace to wait for")
	assert.Equal(t, []string{"newer", "older"}, taken)
	assert.True(t, older.Done())
	assert.False(t, newer.Done())
	older.Decline() // after Done: nothing
	assert.Equal(t, []uint64{0, 1}, ev.Stats().Evicted)
}
