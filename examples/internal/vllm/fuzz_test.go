package vllm

import (
	"errors"
	"math"
	"testing"
	"time"
)

// FuzzConfigAndAdd fuzzes Config.Validate against a model of its rules and
// Replica.Add's request validation (lengths, MaxModelLen, KV footprint —
// with lengths near the int range, where a sum overflows); a request Add
// accepts, on a small enough model, is then stepped until it finishes,
// exactly once, with the KV cache conserved.
func FuzzConfigAndAdd(f *testing.F) {
	d := DefaultConfig()
	f.Add(d.TotalBlocks, d.BlockSize, d.MaxBatchedTokens, d.MaxNumSeqs, d.MaxModelLen, int64(d.Step.Base), int64(0), d.Step.PrefillNs, d.Step.DecodeNs, d.Step.ContextNs, 1000, 200)
	f.Add(8, 4, 16, 2, 64, int64(time.Millisecond), int64(0), 1.0, 1.0, 0.0, 20, 12)
	f.Add(0, 16, 1, 1, 2, int64(1), int64(0), 0.0, 0.0, 0.0, 1, 1)
	f.Add(8, 4, 16, 2, 64, int64(0), int64(0), 0.0, 0.0, 0.0, 1, 1)
	f.Add(8, 4, 16, 2, 64, int64(-1), int64(-1), math.NaN(), math.Inf(1), -1.0, 1, 1)
	f.Add(8, 4, 16, 2, 64, int64(1), int64(0), 0.0, 0.0, 0.0, math.MaxInt, 1) // Input+Output overflows
	f.Add(8, 4, 16, 2, 64, int64(1), int64(0), 0.0, 0.0, 0.0, 40, 0)
	f.Add(2, 4, 16, 2, 64, int64(1), int64(0), 0.0, 0.0, 0.0, 8, 2) // needs 3 blocks of 2
	f.Fuzz(func(t *testing.T, blocks, blockSize, budget, seqs, maxLen int, base, perAdmit int64, prefill, decode, ctx float64, input, output int) {
		cfg := Config{TotalBlocks: blocks, BlockSize: blockSize, MaxBatchedTokens: budget, MaxNumSeqs: seqs, MaxModelLen: maxLen,
			Step: StepModel{Base: time.Duration(base), PerAdmit: time.Duration(perAdmit), PrefillNs: prefill, DecodeNs: decode, ContextNs: ctx}}
		finite := func(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }
		valid := blocks > 0 && blockSize > 0 && budget > 0 && seqs > 0 && maxLen > 1 &&
			base >= 0 && perAdmit >= 0 && finite(prefill) && finite(decode) && finite(ctx) &&
			(base > 0 || prefill > 0 || decode > 0)
		r, err := New(cfg)
		if valid != (err == nil) || (err == nil) != (cfg.Validate() == nil) {
			t.Fatalf("New(%+v): %v; model says valid=%v", cfg, err, valid)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not ErrInvalidConfig", err)
			}
			return
		}
		q := &Request{ID: 1, Input: input, Output: output}
		// Model of Add, in arithmetic that cannot overflow.
		ok := input >= 1 && output >= 1 && input <= maxLen-output
		if ok {
			cached := int64(input) + int64(output) - 1
			ok = (cached+int64(blockSize)-1)/int64(blockSize) <= int64(blocks)
		}
		err = r.Add(q)
		if ok != (err == nil) {
			t.Fatalf("Add(Input %d, Output %d) on %+v: %v; model says ok=%v", input, output, cfg, err, ok)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v is not ErrInvalidRequest", err)
			}
			return
		}
		if input+output > 4096 || budget < 1 {
			return // valid, but too long to step through in a fuzz iteration
		}
		finished := 0
		var events []Event
		for steps := 0; r.HasWork(); steps++ {
			if steps > 3*(input+output)+10 {
				t.Fatalf("request not finished after %d steps", steps)
			}
			_, events, _ = r.Begin(events[:0])
			events = r.Finish(events)
			for _, e := range events {
				if e.Kind == Finished {
					finished++
				}
			}
			checkBlocks(t, r, true)
		}
		if finished != 1 || q.Generated() != output || r.FreeBlocks() != blocks {
			t.Fatalf("finished %d times, generated %d of %d, free blocks %d of %d", finished, q.Generated(), output, r.FreeBlocks(), blocks)
		}
	})
}
