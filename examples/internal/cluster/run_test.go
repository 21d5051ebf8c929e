package cluster

import (
	"errors"
	"fmt"
	"github.com/flowgate/flowgate/flowcontrol"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/examples/internal/workload"
)

func short(w workload.Workload, qps float64, policy string) Config {
	return Config{Workload: w, QPS: qps, Policy: policy, Duration: 30 * time.Second, Seed: 7, CV: -1, Credit: true}
}

// checkInvariants: every request ends exactly once (completed, rejected or left
// unfinished), timestamps are ordered, the pool is empty and its KV cache whole, and the
// dispatchers dispatched exactly what was accepted.
func checkInvariants(t *testing.T, s *sim) {
	t.Helper()
	dispatched := 0
	for i := range s.reqs {
		q := &s.reqs[i]
		require.False(t, q.rejected, "request %d rejected", i)
		require.GreaterOrEqual(t, q.done, int64(0), "request %d finished", i)
		require.LessOrEqual(t, q.arrive, q.dispatch)
		require.LessOrEqual(t, q.dispatch, q.first)
		require.LessOrEqual(t, q.first, q.done, "TTFT <= E2E")
		require.Equal(t, q.vr.Output, q.vr.Generated())
		dispatched++
	}
	for _, r := range s.replicas {
		require.False(t, r.HasWork())
		require.Equal(t, r.Config().TotalBlocks, r.FreeBlocks())
	}
	total := uint64(0)
	for _, g := range s.gws {
		switch {
		case g.d != nil:
			for _, b := range g.d.Stats().Bands {
				require.Zero(t, b.Queued)
				require.Zero(t, b.Dropped())
				require.Zero(t, b.Rejected)
				total += b.Dispatched
			}
		case g.l != nil:
			for _, b := range g.l.Stats().Bands {
				require.Zero(t, b.Queued)
				require.Zero(t, b.Expired+b.Cancelled+b.Rejected)
				total += b.Dispatched
			}
		default:
			total += uint64(g.direct)
		}
		for r := range g.inflight {
			require.Zero(t, g.inflight[r], "in-flight count returns to 0")
		}
	}
	require.Equal(t, uint64(dispatched), total, "each request dispatched exactly once")
	res := s.result()
	require.Equal(t, len(s.reqs), res.Critical.Requests+res.Sheddable.Requests)
	require.Equal(t, len(s.reqs), res.Critical.Completed+res.Sheddable.Completed)
	require.Zero(t, res.Unfinished)
	require.InDelta(t, 1, res.ShareDeadZone+res.ShareProportional+res.ShareHardBlock, 1e-9)
}

func TestShortRunInvariants(t *testing.T) {
	for _, c := range []Config{
		short(workload.Codegen, 16, SoftReflective),
		short(workload.Codegen, 24, Static),
		short(workload.Chat, 80, SoftReflective),
		short(workload.Codegen, 24, None),
		short(workload.Codegen, 24, LLMDStatic),
		short(workload.Codegen, 24, LLMDSoftReflective),
		short(workload.Reasoning, 1.2, LLMDSoftReflective),
		short(workload.Codegen, 16, Floor),
	} {
		s, err := run(c)
		require.NoError(t, err)
		checkInvariants(t, s)
	}
	// Two gateways share the pool and the traffic.
	c := short(workload.Codegen, 16, SoftReflective)
	c.Gateways = 2
	s, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, s)
	for _, g := range s.gws {
		require.NotZero(t, g.d.Stats().Bands[0].Dispatched+g.d.Stats().Bands[1].Dispatched, "each gateway carries traffic")
	}
	// The floor is the same critical arrivals, without the sheddable ones.
	full, err := run(short(workload.Codegen, 16, None))
	require.NoError(t, err)
	floor, err := run(short(workload.Codegen, 16, Floor))
	require.NoError(t, err)
	var fullCrit []int64
	for _, q := range full.reqs {
		if q.critical {
			fullCrit = append(fullCrit, q.arrive)
		}
	}
	var floorArr []int64
	for _, q := range floor.reqs {
		require.True(t, q.critical)
		floorArr = append(floorArr, q.arrive)
	}
	require.Equal(t, fullCrit, floorArr)
}

// TestClientTimeouts: with clients that give up, every request ends exactly once
// (completed, or timed out — in the gateway queue or at a replica, which frees its KV
// blocks), and no completion took longer than the timeout.
func TestClientTimeouts(t *testing.T) {
	for _, pol := range []string{None, LLMDStatic, LLMDSoftReflective, Static, SoftReflective} {
		c := short(workload.Codegen, 24, pol)
		c.Credit = false
		c.ClientTimeout = 4 * time.Second
		s, err := run(c)
		require.NoError(t, err)
		res := s.result()
		timeouts := res.Critical.Timeouts + res.Sheddable.Timeouts
		require.NotZero(t, timeouts, pol)
		require.Equal(t, len(s.reqs), res.Critical.Completed+res.Sheddable.Completed+timeouts, pol)
		require.Zero(t, res.Unfinished)
		for i := range s.reqs {
			q := &s.reqs[i]
			require.NotEqual(t, q.timedOut, q.done >= 0, "request %d: completed xor timed out", i)
			if q.done >= 0 {
				require.LessOrEqual(t, q.done-q.arrive, int64(c.ClientTimeout))
			}
		}
		for _, r := range s.replicas {
			require.False(t, r.HasWork(), pol)
			require.Equal(t, r.Config().TotalBlocks, r.FreeBlocks(), "%s: aborted requests freed their blocks", pol)
		}
		for _, g := range s.gws {
			for r := range g.inflight {
				require.Zero(t, g.inflight[r])
			}
			if g.d != nil {
				for _, b := range g.d.Stats().Bands {
					require.Zero(t, b.Queued)
				}
			}
		}
		require.InDelta(t, res.TotalGoodput, float64(res.Critical.Completed+res.Sheddable.Completed)/c.Duration.Seconds(), 1e-9)
	}
}

// TestBackendPriorityHelpsCritical: with vLLM's priority scheduling and no gateway flow
// control, critical requests overtake sheddable ones in the replicas' queues.
func TestBackendPriorityHelpsCritical(t *testing.T) {
	c := short(workload.Codegen, 24, None)
	fcfs, err := Run(c)
	require.NoError(t, err)
	c.BackendPriority = true
	prio, err := Run(c)
	require.NoError(t, err)
	require.Less(t, prio.Critical.TTFTp99, fcfs.Critical.TTFTp99)
	require.Greater(t, prio.Sheddable.TTFTp99, prio.Critical.TTFTp99)
}

func TestSameSeedSameResult(t *testing.T) {
	c := short(workload.Codegen, 16, SoftReflective)
	a, err := Run(c)
	require.NoError(t, err)
	b, err := Run(c)
	require.NoError(t, err)
	require.Equal(t, a, b)
	c.Seed++
	d, err := Run(c)
	require.NoError(t, err)
	require.NotEqual(t, a, d, "the seed matters")
}

// TestTickSkippingIsExact compares the event loop that skips ticks on which no band can
// release (and replays them when an input changes) with one that runs every tick: the
// results must be identical.
func TestTickSkippingIsExact(t *testing.T) {
	var cs []Config
	for _, gws := range []int{1, 2, 4} {
		for _, c := range []Config{
			short(workload.Codegen, 16, SoftReflective),
			short(workload.Codegen, 24, Static),
			short(workload.Codegen, 24, StaticBlockCritical),
			short(workload.Chat, 20, SoftReflective),
			short(workload.Codegen, 24, LLMDStatic),
			short(workload.Codegen, 16, LLMDSoftReflective),
			short(workload.Reasoning, 1.2, LLMDSoftReflective),
		} {
			c.Gateways = gws
			c.ClientTimeout = 10 * time.Second
			cs = append(cs, c)
		}
		if gws > 1 {
			// A shared in-flight view: exact, or synced every 5 ms.
			for _, exact := range []bool{true, false} {
				c := short(workload.Codegen, 16, SoftReflective)
				c.Gateways = gws
				c.ClientTimeout = 10 * time.Second
				c.SharedInFlightExact, c.SharedInFlight = exact, 5*time.Millisecond
				cs = append(cs, c)
			}
		}
	}
	for _, c := range cs {
		c.Duration = 15 * time.Second
		requireSkipExact(t, c)
	}
}

// requireSkipExact runs c twice, skipping the ticks on which no band can release and
// running every tick, and requires identical results.
func requireSkipExact(t *testing.T, c Config) {
	t.Helper()
	c.CatchUp = 1 << 30
	skip, err := Run(c)
	require.NoError(t, err)
	c.noSkip = true
	every, err := Run(c)
	require.NoError(t, err)
	what := fmt.Sprintf("%s@%g %s, %d gateways, shared %v/%v, admission %v", c.Workload.Name, c.QPS, c.Policy, c.Gateways, c.SharedInFlight, c.SharedInFlightExact, c.Admission)
	// The mean saturation is summed in a different order (n·s at once vs s n times).
	require.InDelta(t, every.MeanSaturation, skip.MeanSaturation, 1e-9, what)
	every.MeanSaturation = skip.MeanSaturation
	require.Equal(t, every, skip, what)
}

// TestRegimeSharesComeFromTheDispatchersGate checks, on every tick the dispatcher runs,
// that the gate the shares are counted with is the gate the dispatcher reports.
func TestRegimeSharesComeFromTheDispatchersGate(t *testing.T) {
	c := short(workload.Codegen, 24, SoftReflective)
	c.Duration = 10 * time.Second
	c.noSkip = true // see every tick, including those the loop would skip
	seen := [3]int{}
	c.onTick = func(s *sim, g *gateway, sat float64) {
		st := g.d.Stats()
		require.Equal(t, sat, st.Saturation, "the tick read the saturation it was accounted at")
		require.Equal(t, s.policy.Gate(BandSheddable, bands, sat), st.Bands[BandSheddable].Gate)
		require.Equal(t, 1, st.Bands[BandCritical].Gate.Every, "critical is never gated")
		seen[regimeOf(st.Bands[BandSheddable].Gate)]++
	}
	_, err := Run(c)
	require.NoError(t, err)
	require.NotZero(t, seen[1], "the run visits the proportional regime")
	require.NotZero(t, seen[2], "and the hard block")
}

func TestLightLoadThroughputEqualsOfferedLoad(t *testing.T) {
	c := short(workload.Chat, 20, SoftReflective)
	c.Duration = 60 * time.Second
	s, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, s)
	res := s.result()
	offered := float64(res.Critical.Requests) / c.Duration.Seconds()
	// Chat requests take ~10 s, so the last ones finish after the window: compare
	// completions by the window's end with arrivals that had 30 s to finish.
	late := 0
	for i := range s.reqs {
		q := &s.reqs[i]
		if q.critical && q.arrive <= int64(c.Duration-30*time.Second) && q.done > int64(c.Duration) {
			late++
		}
	}
	require.Zero(t, late, "under light load every request that had time finished")
	require.InEpsilon(t, offered, res.Critical.Throughput, 0.25)
	require.Greater(t, res.ShareDeadZone, 0.99, "the soft-reflective ceiling is (nearly) a no-op at light load")
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Workload: workload.Chat, QPS: 0, Policy: Static, Duration: time.Second},
		{Workload: workload.Chat, QPS: 1, Policy: "fifo", Duration: time.Second},
		{Workload: workload.Chat, QPS: 1, Policy: Static, Duration: 0},
		{Workload: workload.Chat, QPS: 1, Policy: Static, Duration: time.Second, Gateways: -1},
		{Workload: workload.Chat, QPS: 1, Policy: Static, Duration: time.Second, Burst: -1},
	}
	for i, c := range bad {
		_, err := Run(c)
		require.True(t, errors.Is(err, ErrInvalidConfig), "case %d: %v", i, err)
	}
}

// TestCatchUpCapDoesNotChangeResults: replaying at most 4,096 skipped ticks (the default)
// gives the same results as replaying all of them, on runs with long blocked stretches.
func TestCatchUpCapDoesNotChangeResults(t *testing.T) {
	for _, c := range []Config{
		short(workload.Codegen, 24, Static),
		short(workload.Reasoning, 1.2, SoftReflective),
	} {
		c.Credit = false
		capped, err := Run(c)
		require.NoError(t, err)
		c.CatchUp = 1 << 30
		all, err := Run(c)
		require.NoError(t, err)
		require.Equal(t, all, capped)
	}
}

// TestEventHeapOrder: the heap pops events in compareEvents order (time, kind, index,
// sequence), whatever the push order.
func TestEventHeapOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h eventHeap
		var all []event
		for i := range rapid.IntRange(0, 200).Draw(t, "n") {
			e := event{at: rapid.Int64Range(0, 5).Draw(t, "at"), seq: uint64(i),
				kind: evKind(rapid.IntRange(0, int(evKick)).Draw(t, "kind")), idx: int32(rapid.IntRange(0, 3).Draw(t, "idx"))}
			h.push(e)
			all = append(all, e)
			if rapid.Bool().Draw(t, "pop") && !h.empty() {
				got := h.pop()
				min := slices.MinFunc(all, compareEvents)
				if got != min {
					t.Fatalf("popped %+v, want %+v", got, min)
				}
				all = slices.DeleteFunc(all, func(x event) bool { return x == got })
			}
		}
		slices.SortFunc(all, compareEvents)
		for _, want := range all {
			if got := h.pop(); got != want {
				t.Fatalf("popped %+v, want %+v", got, want)
			}
		}
		if !h.empty() {
			t.Fatal("heap not empty")
		}
	})
}

// TestAdmissionShedsSheddableOnly: with the admission stage in front of the
// queues, above capacity some sheddable requests are shed, no critical one;
// a shed request never reaches a queue or a replica; every other request
// completes; and the run is exact under tick skipping.
func TestAdmissionShedsSheddableOnly(t *testing.T) {
	for _, policy := range []string{None, SoftReflective} {
		c := short(workload.Codegen, 32, policy)
		c.Duration = 15 * time.Second
		c.Admission = true
		s, err := run(c)
		require.NoError(t, err)
		shed, dispatchedOrDone := 0, 0
		for i := range s.reqs {
			q := &s.reqs[i]
			if q.shed {
				shed++
				require.False(t, q.critical, "request %d: a critical request was shed", i)
				require.Equal(t, int64(-1), q.dispatch, "a shed request was dispatched")
				require.Equal(t, int32(-1), q.replica)
				continue
			}
			require.GreaterOrEqual(t, q.done, int64(0), "request %d finished", i)
			dispatchedOrDone++
		}
		res := s.result()
		require.Equal(t, shed, res.Sheddable.Shed)
		require.Zero(t, res.Critical.Shed)
		require.Positive(t, shed, "%s: nothing shed at twice the capacity", policy)
		require.Equal(t, len(s.reqs), shed+dispatchedOrDone)

		requireSkipExact(t, c)
	}
}

// TestTenantsNoisyNeighbour: with -tenants, B's arrivals are the same with and
// without A (TenantBAlone), every critical arrival is B's, A sends about Tenants
// times B's sheddable rate, every request still ends once, and under round-robin
// B's sheddable tail is far below fcfs's (the fairness actually reorders the band).
func TestTenantsNoisyNeighbour(t *testing.T) {
	c := short(workload.Codegen, 16, SoftReflective)
	c.Duration = 2 * time.Minute // long enough for the sheddable band to back up
	c.Tenants, c.Fairness = 10, flowcontrol.FairnessFCFS
	fcfs, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, fcfs)
	c.TenantBAlone = true
	alone, err := run(c)
	require.NoError(t, err)
	var bWith, bAlone []int64
	var aShed, bShed int
	for _, q := range fcfs.reqs {
		if q.tenantB {
			bWith = append(bWith, q.arrive)
		}
		switch {
		case q.critical:
			require.True(t, q.tenantB, "a critical arrival was A's")
		case q.tenantB:
			bShed++
		default:
			aShed++
		}
	}
	for _, q := range alone.reqs {
		require.True(t, q.tenantB, "TenantBAlone kept an arrival of A")
		bAlone = append(bAlone, q.arrive)
	}
	require.Equal(t, bWith, bAlone, "B's arrivals differ with and without A")
	require.InDelta(t, 10, float64(aShed)/float64(bShed), 2.5, "A:B sheddable rate")

	c.TenantBAlone, c.Fairness = false, flowcontrol.FairnessRoundRobin
	rr, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, rr)
	require.Less(t, rr.result().TenantBSheddableTTFTp99, fcfs.result().TenantBSheddableTTFTp99/2)
}

// TestTenantsLongShort: with LongShort, A's requests are the ones costing more than
// the median (so about half of the arrivals, and the longer ones), fair-share gives
// the two tenants equal token shares of a backlogged sheddable band (within ±10 %)
// where fcfs gives the long tenant its larger demand, and every request ends once.
func TestTenantsLongShort(t *testing.T) {
	c := short(workload.Codegen, 24, SoftReflective)
	c.Duration = 2 * time.Minute
	c.LongShort, c.Fairness = true, flowcontrol.FairnessShare
	fs, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, fs)
	var a, b int
	var costA, costB float64
	for _, q := range fs.reqs {
		cost := q.vr.Input + q.vr.Output
		if q.tenantB {
			b++
			costB += float64(cost)
			require.LessOrEqual(t, cost, fs.medianCost)
		} else {
			a++
			costA += float64(cost)
			require.Greater(t, cost, fs.medianCost)
		}
	}
	require.InDelta(t, 1, float64(a)/float64(b), 0.15, "request rates A:B")
	require.Greater(t, costA/float64(a), 1.3*costB/float64(b), "A's requests are the long ones")
	share := fs.result().TenantATokenShare
	require.InDelta(t, 0.5, share, 0.05, "fair-share token share of the long tenant")

	c.Fairness = flowcontrol.FairnessFCFS
	fcfs, err := run(c)
	require.NoError(t, err)
	checkInvariants(t, fcfs)
	require.Greater(t, fcfs.result().TenantATokenShare, 0.6, "fcfs serves the long tenant's larger demand")

	c.Tenants = 10
	_, err = Run(c)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
