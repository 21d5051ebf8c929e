package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
)

// evictShort is a short overloaded run in which the library's default
// eviction fires often (codegen@24 reads saturated most of the time).
func evictShort(policy string) Config {
	c := short(workload.Codegen, 24, policy)
	c.Evict = true
	// A replica gives way from half its KV cache: not a setting to
	// ship (at the default, 0.9, codegen's held requests wait for
	// compute and nothing is taken), but one under which a short run
	// evicts often enough to test the mechanics.
	c.Eviction.KVThreshold = 0.5
	return c
}

// onReplica counts the requests of gateway gi the simulator believes are on
// replica r: dispatched there and not ended.
func onReplica(s *sim, gi, r int) int64 {
	var n int64
	for i := range s.reqs {
		q := &s.reqs[i]
		if int(q.gw) == gi && int(q.replica) == r && q.dispatch >= 0 && q.done < 0 && !q.timedOut && !q.cut {
			n++
		}
	}
	return n
}

// liveOn counts the requests replica r holds (waiting or running) that are
// not aborted: what the in-flight counts must match.
func liveOn(s *sim, r int) int64 {
	n := int64(len(s.replicas[r].Waiting(nil)))
	for _, v := range s.replicas[r].Running() {
		if v.Generated() < v.Output && !abortedIn(s, v.ID, v) {
			n++
		}
	}
	return n
}

// abortedIn reports whether replica request v is no longer request id's
// current one (an evicted request aborted inside the step in progress stays
// in the running set until the step ends) or its request has ended.
func abortedIn(s *sim, id uint64, v *vllm.Request) bool {
	q := &s.reqs[id]
	return q.vr != v || q.timedOut || q.cut
}

// fataler is what checkEvictAccounting needs of *testing.T and *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// checkEvictAccounting: after every event, each gateway's in-flight count on
// each replica equals its requests there (a victim whose count were returned
// twice, or never, breaks it), the total equals what the replica holds, and
// no replica idles while it holds work with no step or kick pending. At the
// end every request has exactly one outcome: completed, timed out or cut.
func checkEvictAccounting(t fataler, c Config) Result {
	var bad string
	c.onEventHook = func(s *sim) {
		if bad != "" {
			return
		}
		for r := range s.replicas {
			var total int64
			for gi, g := range s.gws {
				if n := onReplica(s, gi, r); g.inflight[r] != n {
					bad = "gateway in-flight count differs from its requests on the replica"
					return
				}
				total += g.inflight[r]
			}
			if total != s.total[r] || total != liveOn(s, r) {
				bad = "in-flight total differs from what the replica holds"
				return
			}
			if !s.busy[r] && !s.kicked[r] && s.replicas[r].HasWork() {
				bad = "a replica idles with work"
				return
			}
		}
	}
	s, err := run(c)
	if err != nil {
		t.Fatal(err)
	}
	if bad != "" {
		t.Fatalf("%s (at %v)", bad, time.Duration(s.now))
	}
	res := s.result()
	cl := []Class{res.Critical, res.Sheddable}
	ended := 0
	for _, k := range cl {
		ended += k.Completed + k.Timeouts + k.Cut + k.Rejected + k.Shed
	}
	if ended != len(s.reqs) || res.Unfinished != 0 {
		t.Fatalf("%d requests, %d outcomes, %d unfinished", len(s.reqs), ended, res.Unfinished)
	}
	dispatches := 0
	for i := range s.reqs {
		q := &s.reqs[i]
		n := 0
		for _, b := range []bool{q.done >= 0, q.timedOut, q.cut, q.rejected} {
			if b {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("request %d: %d outcomes", i, n)
		}
		if q.tr != nil {
			dispatches += 1 + q.tr.Evictions()
			if q.cut {
				dispatches-- // cut, not dispatched again
			}
		}
	}
	if res.Evictions != res.Requeued+res.Cut {
		t.Fatalf("evictions %d != requeued %d + cut %d", res.Evictions, res.Requeued, res.Cut)
	}
	for r, rep := range s.replicas {
		if rep.HasWork() || rep.FreeBlocks() != rep.Config().TotalBlocks || s.total[r] != 0 {
			t.Fatalf("replica %d not empty at the end", r)
		}
	}
	var disp uint64
	for _, g := range s.gws {
		if g.d == nil {
			disp += uint64(g.direct)
			continue
		}
		for _, b := range g.d.Stats().Bands {
			if b.Queued != 0 {
				t.Fatalf("items still queued")
			}
			disp += b.Dispatched
		}
		st := g.ev.Stats()
		if st.Tracked != 0 || st.Evicting != 0 {
			t.Fatalf("evictor still tracks %d, %d evicting", st.Tracked, st.Evicting)
		}
	}
	// A request dispatched again after an eviction that its client then
	// abandoned in the queue was dispatched once less than it was tracked.
	if c.ClientTimeout == 0 && c.Policy != None && int(disp) != dispatches {
		t.Fatalf("dispatcher dispatched %d, requests were sent %d times", disp, dispatches)
	}
	return res
}

// TestEvictAccounting: with eviction on, every request ends in exactly one
// outcome and no victim's in-flight count is returned twice, for flowgate's
// policy and None, with and without client timeouts, started streams cut or
// not, one gateway or two.
func TestEvictAccounting(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := evictShort(rapid.SampledFrom([]string{SoftReflective, None, Static}).Draw(t, "policy"))
		c.Duration = 8 * time.Second
		c.Seed = rapid.Uint64Range(1, 1000).Draw(t, "seed")
		c.Gateways = rapid.IntRange(1, 2).Draw(t, "gateways")
		if rapid.Bool().Draw(t, "timeout") {
			c.ClientTimeout = time.Duration(rapid.IntRange(1, 6).Draw(t, "timeoutSeconds")) * time.Second
		}
		c.SheddableStream = rapid.Bool().Draw(t, "sheddableStream")
		c.Eviction = flowcontrol.EvictionConfig{
			Started:      rapid.Bool().Draw(t, "started"),
			Stall:        time.Duration(rapid.IntRange(0, 300).Draw(t, "stallMs")) * time.Millisecond,
			MaxEvictions: rapid.IntRange(0, 3).Draw(t, "max"),
			Threshold:    rapid.SampledFrom([]float64{0, 0.5, 1.1}).Draw(t, "threshold"),
		}
		checkEvictAccounting(t, c)
	})
}

// TestEvictFires: the default eviction does fire on an overloaded short run
// (the accounting test above exercises something), re-queues its victims,
// and with sheddable streams and Started it cuts some.
func TestEvictFires(t *testing.T) {
	c := evictShort(SoftReflective)
	res := checkEvictAccounting(t, c)
	require.NotZero(t, res.Evictions)
	require.Equal(t, res.Evictions, res.Requeued)
	require.Zero(t, res.Cut)
	require.Greater(t, res.WastedShare, 0.0)
	c.SheddableStream, c.Eviction.Started = true, true
	res = checkEvictAccounting(t, c)
	require.NotZero(t, res.Cut)
	require.Equal(t, res.Cut, res.Sheddable.Cut)
}

// TestEvictSameSeedSameResult: eviction on, the same seed gives the same
// result (the checks are events in the documented order, on virtual time).
func TestEvictSameSeedSameResult(t *testing.T) {
	for _, pol := range []string{SoftReflective, None} {
		c := evictShort(pol)
		c.Gateways = 2
		a, err := Run(c)
		require.NoError(t, err)
		require.NotZero(t, a.Evictions, pol)
		b, err := Run(c)
		require.NoError(t, err)
		require.Equal(t, a, b, pol)
	}
}

// TestEvictUnderCapacityChangesNothing: under capacity the evictor never
// acts, and every figure equals the run without it.
func TestEvictUnderCapacityChangesNothing(t *testing.T) {
	for _, c := range []Config{
		short(workload.Codegen, 4, SoftReflective),
		short(workload.Chat, 20, SoftReflective),
		short(workload.Codegen, 4, None),
	} {
		c.Duration = 20 * time.Second
		c.ClientTimeout = 300 * time.Second
		off, err := Run(c)
		require.NoError(t, err)
		c.Evict = true
		on, err := Run(c)
		require.NoError(t, err)
		require.Zero(t, on.Evictions, "%s@%g %s", c.Workload.Name, c.QPS, c.Policy)
		require.True(t, on.Evict)
		on.Evict = false
		require.Equal(t, off, on, "%s@%g %s", c.Workload.Name, c.QPS, c.Policy)
	}
}

// TestEvictConfigErrors: eviction is refused for llm-d parity, and bad tuning
// is a config error.
func TestEvictConfigErrors(t *testing.T) {
	c := evictShort(LLMDStatic)
	_, err := Run(c)
	require.ErrorIs(t, err, ErrInvalidConfig)
	c = evictShort(SoftReflective)
	c.Eviction.Stall = -time.Second
	_, err = Run(c)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig)
}
