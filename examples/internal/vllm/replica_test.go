package vllm

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func smallConfig(blocks, blockSize, budget, seqs int) Config {
	return Config{
		TotalBlocks: blocks, BlockSize: blockSize, MaxBatchedTokens: budget, MaxNumSeqs: seqs,
		MaxModelLen: 1 << 20, Step: DefaultStepModel(),
	}
}

// checkBlocks asserts the KV accounting: free + Σ held == total, waiting requests hold no
// blocks, and each running request holds exactly the blocks its computed tokens need.
func checkBlocks(t require.TestingT, r *Replica, afterFinish bool) {
	held := 0
	for _, q := range r.Running() {
		held += q.blocks
		if afterFinish {
			require.Equal(t, r.blocksFor(q.computed), q.blocks, "request %d holds blocks for its computed tokens", q.ID)
		}
	}
	for _, q := range r.Waiting(nil) {
		require.Zero(t, q.blocks, "waiting request %d holds no blocks", q.ID)
	}
	require.Equal(t, r.cfg.TotalBlocks, r.free+held, "KV blocks conserved")
	require.GreaterOrEqual(t, r.free, 0)
	require.LessOrEqual(t, len(r.Running()), r.cfg.MaxNumSeqs)
}

func TestKVBlocksConservedAndEveryRequestFinishesOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 16).Draw(t, "blockSize")
		cfg := smallConfig(rapid.IntRange(4, 64).Draw(t, "blocks"), bs,
			rapid.IntRange(1, 96).Draw(t, "budget"), rapid.IntRange(1, 8).Draw(t, "seqs"))
		r, err := New(cfg)
		require.NoError(t, err)
		maxTokens := cfg.TotalBlocks * cfg.BlockSize
		finished := map[uint64]int{}
		first := map[uint64]int{}
		tally := func(events []Event) {
			for _, e := range events {
				switch e.Kind {
				case Finished:
					finished[e.Req.ID]++
				case FirstToken:
					first[e.Req.ID]++
				}
			}
		}
		var added []*Request
		var events []Event
		ops := rapid.IntRange(1, 80).Draw(t, "ops")
		for i := 0; i < ops; i++ {
			if rapid.Bool().Draw(t, "add") {
				in := rapid.IntRange(1, maxTokens-1).Draw(t, "in")
				out := rapid.IntRange(1, maxTokens-in+1).Draw(t, "out")
				q := &Request{ID: uint64(len(added)), Input: in, Output: out}
				require.NoError(t, r.Add(q))
				added = append(added, q)
				continue
			}
			events = events[:0]
			var ok bool
			_, events, ok = r.Begin(events)
			checkBlocks(t, r, false)
			if ok {
				events = r.Finish(events)
				checkBlocks(t, r, true)
			}
			tally(events)
			m := r.Metrics()
			if ok {
				require.Equal(t, r.Live(), m, "metrics refreshed at the end of each step")
				require.InDelta(t, 1-float64(r.free)/float64(cfg.TotalBlocks), m.KVCacheUsage, 1e-12)
			}
		}
		// Drain: the oldest running request always progresses (preemption takes the
		// newest), so the replica must empty.
		for steps := 0; r.HasWork(); steps++ {
			require.Less(t, steps, 1_000_000, "replica drains")
			_, events, _ = r.Step(events[:0])
			checkBlocks(t, r, true)
			tally(events)
		}
		require.Equal(t, cfg.TotalBlocks, r.FreeBlocks(), "empty replica holds no blocks")
		for _, q := range added {
			require.Equal(t, 1, finished[q.ID], "request %d finishes exactly once", q.ID)
			require.Equal(t, 1, first[q.ID], "request %d has exactly one first token", q.ID)
			require.Equal(t, q.Output, q.Generated())
		}
	})
}

func TestChunkedPrefillSplitsByTokenBudget(t *testing.T) {
	r, err := New(DefaultConfig())
	require.NoError(t, err)
	require.NoError(t, r.Add(&Request{ID: 1, Input: 20000, Output: 3}))
	var ev []Event
	want := []Batch{
		{Requests: 1, PrefillTokens: 8192, ContextTokens: 8192, Admitted: 1},
		{Requests: 1, PrefillTokens: 8192, ContextTokens: 16384},
		{Requests: 1, PrefillTokens: 3616, ContextTokens: 20000},
		{Requests: 1, DecodeTokens: 1, ContextTokens: 20001},
		{Requests: 1, DecodeTokens: 1, ContextTokens: 20002},
	}
	wantKinds := [][]EventKind{nil, nil, {FirstToken}, nil, {Finished}}
	for i, w := range want {
		d, evs, ok := r.Step(ev[:0])
		require.True(t, ok)
		require.Equal(t, w, r.LastBatch(), "step %d", i)
		require.Equal(t, r.cfg.Step.Duration(w.PrefillTokens, w.DecodeTokens, w.ContextTokens, w.Admitted), d)
		var kinds []EventKind
		for _, e := range evs {
			kinds = append(kinds, e.Kind)
		}
		require.Equal(t, wantKinds[i], kinds, "step %d", i)
	}
	require.False(t, r.HasWork())

	// A decoding request takes its token first; the prompt gets the rest of the budget.
	r, _ = New(DefaultConfig())
	require.NoError(t, r.Add(&Request{ID: 1, Input: 10, Output: 100}))
	_, _, _ = r.Step(nil) // prefill of 10, first token
	require.NoError(t, r.Add(&Request{ID: 2, Input: 9000, Output: 5}))
	_, _, _ = r.Step(nil)
	require.Equal(t, Batch{Requests: 2, DecodeTokens: 1, PrefillTokens: 8191, ContextTokens: 11 + 8191, Admitted: 1}, r.LastBatch())
	_, _, _ = r.Step(nil)
	require.Equal(t, Batch{Requests: 2, DecodeTokens: 1, PrefillTokens: 809, ContextTokens: 12 + 9000}, r.LastBatch())
}

func TestPreemptionNewestFirstWithRecompute(t *testing.T) {
	// 10 blocks of 16 tokens. A and B (64-token prompts) take 4 blocks each; as they decode
	// the cache runs out and the newest (B) must be preempted.
	r, err := New(smallConfig(10, 16, 8192, 8))
	require.NoError(t, err)
	a := &Request{ID: 1, Input: 64, Output: 60}
	b := &Request{ID: 2, Input: 64, Output: 60}
	c := &Request{ID: 3, Input: 8, Output: 1}
	require.NoError(t, r.Add(a))
	require.NoError(t, r.Add(b))
	var ev []Event
	var preemptedAt int
	for step := 1; step < 200 && preemptedAt == 0; step++ {
		_, evs, ok := r.Begin(ev[:0])
		require.True(t, ok)
		for _, e := range evs {
			if e.Kind == Preempted {
				require.Same(t, b, e.Req, "the newest running request is preempted")
				preemptedAt = step
			}
		}
		checkBlocks(t, r, false)
		if preemptedAt != 0 {
			// B is at the front of the waiting queue with its progress reset, and the
			// waiting gauge will count it.
			require.NoError(t, r.Add(c))
			w := r.Waiting(nil)
			require.Equal(t, []*Request{b, c}, w)
			require.Zero(t, b.Computed())
			require.Zero(t, b.Blocks())
			require.Equal(t, 1, b.Preemptions)
			require.Greater(t, b.Generated(), 0, "generated tokens are kept for recompute")
			require.Equal(t, []*Request{a}, r.Running())
			require.Equal(t, 1, r.LastBatch().Requests, "no admission in a step that preempted")
		}
		r.Finish(nil)
		checkBlocks(t, r, true)
	}
	require.NotZero(t, preemptedAt, "the cache must run out")
	require.Equal(t, 2, r.Metrics().Waiting, "num_requests_waiting includes the preempted request")
	require.Equal(t, 1, r.Metrics().Running)

	// Drain: B recomputes 64+generated tokens as one prompt, never gets a second first
	// token, and everyone finishes once.
	genAtPreempt := b.Generated()
	sawRecompute := false
	done := map[uint64]int{}
	for r.HasWork() {
		_, evs, _ := r.Begin(ev[:0])
		for _, s := range r.batch {
			if s.req == b && s.req.computed == 0 {
				require.Equal(t, 64+genAtPreempt, s.tokens, "recompute prefills prompt + generated tokens")
				sawRecompute = true
			}
		}
		evs = r.Finish(evs)
		for _, e := range evs {
			require.NotEqual(t, Preempted, e.Kind, "no further preemption is needed")
			if e.Kind == FirstToken {
				require.NotSame(t, b, e.Req, "no second first token after recompute")
			}
			if e.Kind == Finished {
				done[e.Req.ID]++
			}
		}
	}
	require.True(t, sawRecompute)
	require.Equal(t, map[uint64]int{1: 1, 2: 1, 3: 1}, done)
	require.Equal(t, 10, r.FreeBlocks())
}

func TestPreemptionOfTheOnlyNewestIsItself(t *testing.T) {
	// 4 blocks of 4 tokens. A (8-token prompt, 2 blocks) and B (4 tokens, 1 block) run;
	// A's first decode takes the last block, so B, the newest, cannot grow and preempts
	// itself: it is not in the batch, and it waits at the front of the queue.
	r, _ := New(smallConfig(4, 4, 100, 4))
	a := &Request{ID: 1, Input: 8, Output: 9}
	b := &Request{ID: 2, Input: 4, Output: 5}
	require.NoError(t, r.Add(a))
	require.NoError(t, r.Add(b))
	_, _, ok := r.Step(nil)
	require.True(t, ok)
	require.Equal(t, 1, r.FreeBlocks())
	_, evs, ok := r.Begin(nil)
	require.True(t, ok)
	require.Equal(t, []Event{{Kind: Preempted, Req: b}}, evs)
	require.Equal(t, Batch{Requests: 1, DecodeTokens: 1, ContextTokens: 9}, r.LastBatch())
	require.Equal(t, []*Request{b}, r.Waiting(nil))
	require.Equal(t, 1, r.FreeBlocks(), "B's block was returned; A took the other")
	r.Finish(nil)
	checkBlocks(t, r, true)
}

func TestAdmissionStopsAtFirstRequestThatDoesNotFit(t *testing.T) {
	r, _ := New(smallConfig(10, 16, 8192, 8))
	require.NoError(t, r.Add(&Request{ID: 1, Input: 100, Output: 50})) // 7 blocks
	_, _, _ = r.Step(nil)
	require.NoError(t, r.Add(&Request{ID: 2, Input: 80, Output: 1})) // 5 blocks: does not fit in 3
	require.NoError(t, r.Add(&Request{ID: 3, Input: 16, Output: 1})) // 1 block: would fit
	_, _, _ = r.Begin(nil)
	require.Equal(t, 1, r.LastBatch().Requests, "FCFS: request 3 waits behind request 2")
	require.Equal(t, 2, len(r.Waiting(nil)))
	r.Finish(nil)
}

func TestMaxNumSeqsBoundsRunning(t *testing.T) {
	r, _ := New(smallConfig(100, 16, 8192, 2))
	for i := range 5 {
		require.NoError(t, r.Add(&Request{ID: uint64(i), Input: 4, Output: 10}))
	}
	_, _, _ = r.Step(nil)
	require.Equal(t, Metrics{Waiting: 3, Running: 2, KVCacheUsage: 0.02}, r.Metrics())
}

func TestMetricsLagUntilStepEnds(t *testing.T) {
	r, _ := New(DefaultConfig())
	require.NoError(t, r.Add(&Request{ID: 1, Input: 100, Output: 2}))
	require.Equal(t, Metrics{}, r.Metrics(), "no step has ended yet")
	_, _, _ = r.Begin(nil)
	require.NoError(t, r.Add(&Request{ID: 2, Input: 100, Output: 2}))
	require.Equal(t, Metrics{}, r.Metrics())
	r.Finish(nil)
	m := r.Metrics()
	require.Equal(t, 1, m.Waiting)
	require.Equal(t, 1, m.Running)
	require.InDelta(t, 7.0/float64(H100Qwen3_14BBlocks), m.KVCacheUsage, 1e-12)
}

func TestStepModelFormula(t *testing.T) {
	m := StepModel{Base: 10 * time.Millisecond, PrefillNs: 40000, DecodeNs: 30000, ContextNs: 50, PerAdmit: time.Millisecond}
	require.Equal(t, 10*time.Millisecond+100*40*time.Microsecond+3*30*time.Microsecond+1000*50*time.Nanosecond+2*time.Millisecond,
		m.Duration(100, 3, 1000, 2))
	require.Equal(t, 15912, H100Qwen3_14BBlocks)
}

func TestValidation(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.TotalBlocks = 0 },
		func(c *Config) { c.BlockSize = -1 },
		func(c *Config) { c.MaxBatchedTokens = 0 },
		func(c *Config) { c.MaxNumSeqs = 0 },
		func(c *Config) { c.MaxModelLen = 1 },
		func(c *Config) { c.Step.DecodeNs = -1 },
		func(c *Config) { c.Step = StepModel{} },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		_, err := New(c)
		require.ErrorIs(t, err, ErrInvalidConfig, "case %d", i)
		require.Contains(t, err.Error(), "vllm: ")
	}
	r, _ := New(smallConfig(4, 16, 64, 4))
	for _, q := range []*Request{nil, {Input: 0, Output: 1}, {Input: 1, Output: 0}, {Input: 60, Output: 6}} {
		require.ErrorIs(t, r.Add(q), ErrInvalidRequest)
	}
}

// TestLightLoadThroughputEqualsOfferedLoad drives one replica on virtual time with a
// Poisson stream well under capacity: every request completes, TTFT <= E2E, and the
// completion rate over the window equals the arrival rate.
func TestLightLoadThroughputEqualsOfferedLoad(t *testing.T) {
	r, _ := New(DefaultConfig())
	rng := rand.New(rand.NewPCG(1, 2))
	const qps, window = 3.0, 300 * time.Second
	type rec struct{ arrive, first, done time.Duration }
	var reqs []*Request
	var recs []rec
	next := time.Duration(rng.ExpFloat64() / qps * 1e9)
	now := time.Duration(0)
	stepEnd := time.Duration(-1)
	var ev []Event
	for {
		// Next event: an arrival or the end of the running step.
		if stepEnd >= 0 && (stepEnd <= next || next > window) {
			now = stepEnd
			ev = r.Finish(ev[:0])
			for _, e := range ev {
				switch e.Kind {
				case FirstToken:
					recs[e.Req.ID].first = now
				case Finished:
					recs[e.Req.ID].done = now
				}
			}
			stepEnd = -1
		} else if next <= window {
			now = next
			q := &Request{ID: uint64(len(reqs)), Input: 200 + rng.IntN(1800), Output: 50 + rng.IntN(300)}
			require.NoError(t, r.Add(q))
			reqs = append(reqs, q)
			recs = append(recs, rec{arrive: now})
			next = now + time.Duration(rng.ExpFloat64()/qps*1e9)
		} else if !r.HasWork() {
			break
		}
		if stepEnd < 0 {
			if d, _, ok := r.Begin(nil); ok {
				stepEnd = now + d
			}
		}
	}
	inWindow := 0
	for i, c := range recs {
		require.Positive(t, c.first, "request %d got a first token", i)
		require.LessOrEqual(t, c.arrive, c.first)
		require.LessOrEqual(t, c.first, c.done, "TTFT <= E2E")
		if c.done <= window {
			inWindow++
		}
	}
	offered := float64(len(recs)) / window.Seconds()
	got := float64(inWindow) / window.Seconds()
	require.InDelta(t, qps, offered, 0.5, "the stream has the configured rate")
	require.InEpsilon(t, offered, got, 0.02, "throughput equals offered load under light load")
}

func TestErrorsAreTyped(t *testing.T) {
	_, err := New(Config{})
	require.True(t, errors.Is(err, ErrInvalidConfig))
}

func TestPrioritySchedulingOrdersWaitingAndPreemptsLowestPriority(t *testing.T) {
	cfg := smallConfig(10, 16, 8192, 8)
	cfg.PriorityScheduling = true
	r, err := New(cfg)
	require.NoError(t, err)
	// Waiting order is (priority, arrival): the urgent requests jump the queue.
	lo1 := &Request{ID: 1, Input: 64, Output: 60, Priority: 1}
	hi1 := &Request{ID: 2, Input: 64, Output: 60, Priority: 0}
	lo2 := &Request{ID: 3, Input: 8, Output: 1, Priority: 1}
	hi2 := &Request{ID: 4, Input: 8, Output: 1, Priority: 0}
	for _, q := range []*Request{lo1, hi1, lo2, hi2} {
		require.NoError(t, r.Add(q))
	}
	require.Equal(t, []*Request{hi1, hi2, lo1, lo2}, r.Waiting(nil))
	// hi1 and lo1 hold 4 blocks each; as they decode the cache runs out and the victim
	// is the lowest-priority one, lo1, although hi1 is not the newest by admission
	// (FCFS would pick the newest).
	var victims []*Request
	for r.HasWork() {
		_, evs, _ := r.Begin(nil)
		for _, e := range evs {
			if e.Kind == Preempted {
				victims = append(victims, e.Req)
				w := r.Waiting(nil)
				for i := 1; i < len(w); i++ {
					require.False(t, before(w[i], w[i-1]), "waiting stays in (priority, arrival) order")
				}
			}
		}
		checkBlocks(t, r, false)
		r.Finish(nil)
		checkBlocks(t, r, true)
	}
	require.NotEmpty(t, victims)
	for _, v := range victims {
		require.Equal(t, 1, v.Priority, "only low-priority requests are preempted while one runs")
	}
	require.Equal(t, 10, r.FreeBlocks())
}

func TestAbortFreesBlocksWherever(t *testing.T) {
	r, err := New(smallConfig(20, 16, 8192, 8))
	require.NoError(t, err)
	a := &Request{ID: 1, Input: 64, Output: 50}
	b := &Request{ID: 2, Input: 64, Output: 50}
	c := &Request{ID: 3, Input: 64, Output: 50}
	require.NoError(t, r.Add(a))
	require.NoError(t, r.Add(b))
	_, _, ok := r.Step(nil) // a and b run
	require.True(t, ok)
	require.NoError(t, r.Add(c))
	require.True(t, r.Abort(c), "from the waiting queue")
	require.Empty(t, r.Waiting(nil))
	require.True(t, r.Abort(b), "from the running set, between steps")
	require.Equal(t, []*Request{a}, r.Running())
	checkBlocks(t, r, true)
	_, _, ok = r.Begin(nil)
	require.True(t, ok)
	require.True(t, r.Abort(a), "during the step that schedules it")
	evs := r.Finish(nil)
	require.Empty(t, evs, "an aborted request has no events")
	require.Empty(t, r.Running())
	require.Equal(t, 20, r.FreeBlocks())
	require.False(t, r.Abort(a), "no longer there")
	require.False(t, r.HasWork())
}

// TestPriorityVictimMayBeScheduledAlready: as in vLLM V1 (scheduler.py, max over
// self.running by (priority, arrival_time)), the victim of a failed allocation is the
// lowest-priority running request even when it was already scheduled earlier in the
// step: it is unscheduled (its tokens return to the budget) and the urgent request
// being scheduled keeps its place. lo is admitted first, so it is scheduled first.
func TestPriorityVictimMayBeScheduledAlready(t *testing.T) {
	cfg := smallConfig(10, 16, 8192, 8)
	cfg.PriorityScheduling = true
	r, err := New(cfg)
	require.NoError(t, err)
	lo := &Request{ID: 1, Input: 64, Output: 50, Priority: 1}
	hi := &Request{ID: 2, Input: 80, Output: 50, Priority: 0}
	require.NoError(t, r.Add(lo))
	_, _, ok := r.Step(nil) // lo prefills: 4 blocks
	require.True(t, ok)
	require.NoError(t, r.Add(hi))
	_, _, ok = r.Step(nil) // lo's 65th token takes a 5th block, hi prefills into the last 5
	require.True(t, ok)
	require.Zero(t, r.FreeBlocks())
	// lo (scheduled first) needs no block; hi's 81st token needs one: lo is the victim.
	_, evs, ok := r.Begin(nil)
	require.True(t, ok)
	require.Equal(t, []Event{{Kind: Preempted, Req: lo}}, evs)
	require.Equal(t, []*Request{hi}, r.Running())
	require.Equal(t, Batch{Requests: 1, DecodeTokens: 1, ContextTokens: 81}, r.LastBatch(), "lo's token left the batch")
	evs = r.Finish(nil)
	require.Empty(t, evs)
	require.Equal(t, 2, hi.Generated(), "hi sampled at its prefill and decoded once since")
	checkBlocks(t, r, true)
}

// TestPriorityPreemptionOrder: whatever the requests, priorities and limits, with
// PreemptForWaiting or without, every request a step preempts is later in the
// (priority, arrival) order than every request still running after it (the victim is
// always the largest running one, scheduled in the step or not), the batch holds only
// running requests within the token budget, and the KV accounting holds; the replica
// still drains.
func TestPriorityPreemptionOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 16).Draw(t, "blockSize")
		cfg := smallConfig(rapid.IntRange(4, 64).Draw(t, "blocks"), bs,
			rapid.IntRange(1, 96).Draw(t, "budget"), rapid.IntRange(1, 8).Draw(t, "seqs"))
		cfg.PriorityScheduling = true
		cfg.PreemptForWaiting = rapid.Bool().Draw(t, "preemptForWaiting")
		r, err := New(cfg)
		require.NoError(t, err)
		maxTokens := cfg.TotalBlocks * cfg.BlockSize
		check := func(evs []Event) {
			for _, e := range evs {
				if e.Kind != Preempted {
					continue
				}
				for _, q := range r.Running() {
					require.True(t, before(q, e.Req), "running %d (prio %d) is before victim %d (prio %d)", q.ID, q.Priority, e.Req.ID, e.Req.Priority)
				}
			}
			tokens := 0
			for _, sc := range r.batch {
				require.Contains(t, r.Running(), sc.req)
				tokens += sc.tokens
			}
			require.LessOrEqual(t, tokens, cfg.MaxBatchedTokens)
			b := r.LastBatch()
			require.Equal(t, len(r.batch), b.Requests)
			require.Equal(t, tokens, b.PrefillTokens+b.DecodeTokens)
		}
		ops := rapid.IntRange(1, 80).Draw(t, "ops")
		id := uint64(0)
		for range ops {
			if rapid.Bool().Draw(t, "add") {
				in := rapid.IntRange(1, maxTokens-1).Draw(t, "in")
				out := rapid.IntRange(1, maxTokens-in+1).Draw(t, "out")
				id++
				require.NoError(t, r.Add(&Request{ID: id, Input: in, Output: out, Priority: rapid.IntRange(0, 2).Draw(t, "prio")}))
				continue
			}
			_, evs, ok := r.Begin(nil)
			checkBlocks(t, r, false)
			if ok {
				check(evs)
				r.Finish(nil)
				checkBlocks(t, r, true)
			}
		}
		for steps := 0; r.HasWork(); steps++ {
			require.Less(t, steps, 1_000_000, "replica drains")
			_, evs, ok := r.Begin(nil)
			if ok {
				check(evs)
				r.Finish(nil)
			}
			checkBlocks(t, r, true)
		}
		require.Equal(t, cfg.TotalBlocks, r.FreeBlocks())
	})
}

// TestPreemptForWaitingAdmitsTheUrgentRequest: a low-priority request fills the cache;
// an urgent one arrives. vLLM (PreemptForWaiting off) leaves it waiting while the cache
// is full; the what-if preempts the running low-priority request in the same step and
// admits the urgent one, which never preempts a request more urgent than itself.
func TestPreemptForWaitingAdmitsTheUrgentRequest(t *testing.T) {
	for _, what := range []bool{false, true} {
		cfg := smallConfig(10, 16, 8192, 8)
		cfg.PriorityScheduling = true
		cfg.PreemptForWaiting = what
		r, err := New(cfg)
		require.NoError(t, err)
		lo := &Request{ID: 1, Input: 144, Output: 10, Priority: 1} // 9 blocks, then a 10th
		hi := &Request{ID: 2, Input: 32, Output: 5, Priority: 0}   // 2 blocks
		require.NoError(t, r.Add(lo))
		_, _, ok := r.Step(nil)
		require.True(t, ok)
		require.Equal(t, 1, r.FreeBlocks())
		require.NoError(t, r.Add(hi))
		_, evs, ok := r.Begin(nil)
		require.True(t, ok)
		if !what {
			require.Empty(t, evs)
			require.Equal(t, []*Request{hi}, r.Waiting(nil), "vLLM: the urgent request waits for blocks")
			require.Equal(t, []*Request{lo}, r.Running())
		} else {
			require.Equal(t, []Event{{Kind: Preempted, Req: lo}}, evs)
			require.Equal(t, []*Request{hi}, r.Running(), "admitted in the step that preempted lo")
			require.Equal(t, []*Request{lo}, r.Waiting(nil))
			require.Equal(t, Batch{Requests: 1, PrefillTokens: 32, ContextTokens: 32, Admitted: 1}, r.LastBatch(), "lo's token left the batch")
		}
		checkBlocks(t, r, false)
		r.Finish(nil)
		checkBlocks(t, r, true)

		// An urgent request never preempts one as urgent: a second priority-0
		// request waits behind hi's blocks.
		if what {
			big := &Request{ID: 3, Input: 144, Output: 5, Priority: 0}
			require.NoError(t, r.Add(big))
			_, evs, _ = r.Begin(nil)
			require.Empty(t, evs)
			require.Contains(t, r.Waiting(nil), big)
			r.Finish(nil)
		}
	}
}
