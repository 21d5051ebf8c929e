package fakevllm

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// TestEngineAbortProperty drives an engine's steps by hand (no loop, no
// clock) through random adds, step halves and aborts. Checked after each
// action: an abort between steps frees exactly the request's KV blocks and
// drops it from the waiting or running count at once, in the exported gauges
// too; one during a step frees them at the step's end; the blocks held plus
// the free ones are the cache; no request is both aborted and completed. At
// the end, with the rest drained, the cache is empty and the counts are zero.
func TestEngineAbortProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := vllm.DefaultConfig()
		cfg.TotalBlocks = rapid.IntRange(8, 40).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 4).Draw(t, "seqs")
		cfg.MaxBatchedTokens = rapid.IntRange(16, 256).Draw(t, "budget")
		cfg.PriorityScheduling = rapid.Bool().Draw(t, "priority")
		e, err := build(cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		var (
			all      []*stream
			aborted  = map[*stream]bool{}
			inStep   bool
			events   []vllm.Event
			capacity = cfg.TotalBlocks * cfg.BlockSize
		)
		check := func(what string) {
			gone := map[*vllm.Request]bool{}
			pending := 0 // aborted during this step, freed at its end
			for s := range aborted {
				gone[&s.req] = true
				pending += s.req.Blocks()
			}
			held := 0
			for _, q := range append(e.rep.Waiting(nil), e.rep.Running()...) {
				if !gone[q] { // one aborted in this step stays in the running set to its end
					held += q.Blocks()
				}
			}
			if got := held + pending + e.rep.FreeBlocks(); got != cfg.TotalBlocks {
				t.Fatalf("%s: %d blocks held + %d pending + %d free != %d", what, held, pending, e.rep.FreeBlocks(), cfg.TotalBlocks)
			}
			for s := range aborted {
				if s.finished.Load() {
					t.Fatalf("%s: request %d aborted and completed", what, s.req.ID)
				}
			}
		}
		abort := func(s *stream) {
			free, live := e.rep.FreeBlocks(), e.rep.Live()
			waiting := false
			for _, q := range e.rep.Waiting(nil) {
				waiting = waiting || q == &s.req
			}
			inBatch := false // computed in the step in progress: freed at its end
			if inStep {
				for _, q := range e.rep.Running() {
					inBatch = inBatch || q == &s.req && q.Blocks() > 0
				}
			}
			blocks, was := s.req.Blocks(), e.streams[s.req.ID] == s
			if got := e.abort(s); got != was {
				t.Fatalf("abort of request %d: %v, want %v", s.req.ID, got, was)
			}
			if !was {
				return
			}
			aborted[s] = true
			now := e.rep.Live()
			if !inStep && e.metrics != now {
				t.Fatalf("abort of %d between steps: the gauges %+v != the model %+v", s.req.ID, e.metrics, now)
			}
			switch {
			case waiting:
				if now.Waiting != live.Waiting-1 || now.Running != live.Running || e.rep.FreeBlocks() != free {
					t.Fatalf("abort of waiting %d: %+v -> %+v, free %d -> %d", s.req.ID, live, now, free, e.rep.FreeBlocks())
				}
			case !inBatch:
				if now.Running != live.Running-1 || now.Waiting != live.Waiting || e.rep.FreeBlocks() != free+blocks {
					t.Fatalf("abort of running %d (%d blocks): %+v -> %+v, free %d -> %d", s.req.ID, blocks, live, now, free, e.rep.FreeBlocks())
				}
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				in := rapid.IntRange(1, capacity/2).Draw(t, "input")
				out := rapid.IntRange(1, 40).Draw(t, "output")
				if in+out > capacity {
					t.Skip("does not fit the cache")
				}
				s, err := e.add(in, out, rapid.IntRange(0, 2).Draw(t, "prio"))
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, s)
				check("add")
			},
			"step": func(t *rapid.T) {
				if inStep {
					events = e.finish(events[:0])
					inStep = false
					if e.metrics != e.rep.Live() {
						t.Fatalf("after a step the gauges %+v != the model %+v", e.metrics, e.rep.Live())
					}
					for s := range aborted {
						if s.req.Blocks() != 0 {
							t.Fatalf("request %d aborted during the step holds %d blocks after it", s.req.ID, s.req.Blocks())
						}
					}
				} else {
					_, events, inStep = e.begin(events[:0])
				}
				check("step")
			},
			"abort": func(t *rapid.T) {
				if len(all) == 0 {
					t.Skip("nothing added")
				}
				abort(rapid.SampledFrom(all).Draw(t, "victim"))
				check("abort")
			},
			"": func(t *rapid.T) { check("") },
		})
		// Drain: abort a random half of what is left, run the rest out.
		for _, s := range all {
			if rapid.Bool().Draw(t, "abort at end") {
				abort(s)
			}
		}
		for steps := 0; ; steps++ {
			if inStep {
				events = e.finish(events[:0])
				inStep = false
			}
			if _, events, inStep = e.begin(events[:0]); !inStep && !e.rep.HasWork() {
				break
			}
			// A step that only preempted returns false with work left
			// (the replica's Begin); the next one schedules it.
			if steps > 100000 {
				t.Fatal("the model does not drain")
			}
		}
		check("drained")
		if e.rep.FreeBlocks() != cfg.TotalBlocks || e.metrics != (vllm.Metrics{}) || len(e.streams) != 0 {
			t.Fatalf("drained: free %d of %d, gauges %+v, %d streams left", e.rep.FreeBlocks(), cfg.TotalBlocks, e.metrics, len(e.streams))
		}
		done := 0
		for _, s := range all {
			if s.finished.Load() {
				done++
			}
		}
		if done+len(aborted) != len(all) || e.completed.Load() != uint64(done) || e.aborted.Load() != uint64(len(aborted)) {
			t.Fatalf("%d requests: %d completed (counted %d), %d aborted (counted %d)", len(all), done, e.completed.Load(), len(aborted), e.aborted.Load())
		}
	})
}
