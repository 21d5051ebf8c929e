package vllm

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidConfig is wrapped by every error New returns for a bad Config.
var ErrInvalidConfig = errors.New("vllm: invalid config")

// ErrInvalidRequest is wrapped by every error Add returns for a request the replica could
// never serve (bad lengths, or a sequence that cannot fit in the KV cache at all).
var ErrInvalidRequest = errors.New("vllm: invalid request")

// StepModel is the linear latency model of one engine step (one forward pass of the batch):
//
//	step = Base + PrefillNs·prefill_tokens + DecodeNs·decode_tokens + ContextNs·context_tokens
//	       + PerAdmit·admitted_requests
//
// where context_tokens is the KV cache the batch's attention reads (for each scheduled
// request, the tokens already computed plus the tokens computed in this step) and
// admitted_requests counts the requests that moved from waiting to running in this step
// (new ones and preempted ones resuming): the engine's per-request work on the step's
// critical path.
type StepModel struct {
	Base      time.Duration // fixed cost of a step: weight read, scheduling, sampling
	PrefillNs float64       // per prompt (or recompute) token in the batch, nanoseconds
	DecodeNs  float64       // per decode token in the batch, nanoseconds
	ContextNs float64       // per context token read by attention, nanoseconds
	PerAdmit  time.Duration // per request admitted into the running set in this step
}

// Duration returns the modelled duration of a step with the given token counts, rounded to
// the nanosecond (deterministic: no accumulation of float error across steps).
func (m StepModel) Duration(prefill, decode, context, admitted int) time.Duration {
	ns := float64(m.Base) + m.PrefillNs*float64(prefill) + m.DecodeNs*float64(decode) +
		m.ContextNs*float64(context) + float64(m.PerAdmit)*float64(admitted)
	return time.Duration(math.Round(ns))
}

// Config describes one vLLM replica: its KV cache and scheduler limits and its step model.
type Config struct {
	TotalBlocks      int // KV-cache blocks on the GPU
	BlockSize        int // tokens per KV block (vLLM default 16)
	MaxBatchedTokens int // token budget of one step (max_num_batched_tokens)
	MaxNumSeqs       int // running requests at most (max_num_seqs)
	MaxModelLen      int // prompt + output tokens of one request at most
	Step             StepModel
	// PriorityScheduling is vLLM's --scheduling-policy priority: the waiting queue is
	// ordered by (Request.Priority, arrival), preempted requests included, and the
	// preemption victim is the running request with the largest (Priority, arrival)
	// among all running ones, one already scheduled in the step included (it is
	// unscheduled), as vLLM V1's scheduler does. False is the default FCFS policy.
	PriorityScheduling bool
	// PreemptForWaiting is a what-if, not vLLM's behaviour: with PriorityScheduling, a
	// waiting request at the head of the queue whose blocks cannot be allocated
	// preempts running requests less urgent than itself (the largest (Priority,
	// arrival) first) until they can. vLLM V1 never preempts to admit a waiting
	// request (vllm-project/vllm#40004, open); the simulator's -preempt-for-waiting
	// measures what such a server would give.
	PreemptForWaiting bool
}

// Qwen3-14B on one H100-SXM-80GB, derived in CALIBRATION.md (see examples/sim/README.md
// for the arithmetic and for why each coefficient has the value it has).
const (
	// kvBytesPerToken = 2 (K,V) · 40 layers · 8 KV heads · 128 head_dim · 2 bytes (bf16).
	kvBytesPerToken = 2 * 40 * 8 * 128 * 2
	// kvCacheGiB = 72 (0.9 · 80 GB) − 27.5 (weights) − 5.5 (activations) − 0.15 (graphs).
	kvCacheGiB = 72 - 27.5 - 5.5 - 0.15
)

// H100Qwen3_14BBlocks is the KV capacity of one replica in 16-token blocks: 38.85 GiB over
// 2.5 MiB per block = 15,912 blocks (≈ 254.6k tokens).
var H100Qwen3_14BBlocks = int(math.Floor(kvCacheGiB * (1 << 30) / (16 * kvBytesPerToken)))

// DefaultConfig returns the calibrated replica: Qwen3-14B, tensor parallel 1, on one
// H100-SXM-80GB under vLLM's H100 defaults (8192 batched tokens, 1024 sequences).
func DefaultConfig() Config {
	return Config{
		TotalBlocks:      H100Qwen3_14BBlocks,
		BlockSize:        16,
		MaxBatchedTokens: 8192,
		MaxNumSeqs:       1024,
		MaxModelLen:      40960,
		Step:             DefaultStepModel(),
	}
}

// FittedStepModel is the step model fitted to the published hardware points with llm-d
// parity as the baseline (issue 11; examples/sim/README.md's "Calibration: step time" has the grid
// search and the fit table): prefill 59 µs/token (26.4 GFLOP at 45 % of 989 TFLOP/s,
// inside the 45–50 % MFU estimate, above the 44.5 µs bound of 60 % MFU), decode
// 35 µs/token, context read 145 ns/token (160 KiB at 1.13 TB/s, a third of the HBM peak;
// the bound is 49 ns), no per-request charge. The simulator's default.
func FittedStepModel() StepModel {
	return StepModel{
		Base:      13600 * time.Microsecond,
		PrefillNs: 59000,
		DecodeNs:  35000,
		ContextNs: 145,
	}
}

// DefaultStepModel is the step model of DefaultConfig, the calibration before issue 11
// (prefill chosen to place the codegen knee): the fake vLLM server and the proxy demo
// still use it. The simulator's default is FittedStepModel; this one is reachable with
// -step-base 13.6ms -step-prefill-ns 71000 -step-decode-ns 48000 -step-context-ns 55.
func DefaultStepModel() StepModel {
	return StepModel{
		Base:      13600 * time.Microsecond,
		PrefillNs: 71000,
		DecodeNs:  48000,
		ContextNs: 55,
	}
}

// Validate reports the first invalid field, naming it.
func (c Config) Validate() error {
	switch {
	case c.TotalBlocks <= 0:
		return fmt.Errorf("%w: TotalBlocks %d must be > 0", ErrInvalidConfig, c.TotalBlocks)
	case c.BlockSize <= 0:
		return fmt.Errorf("%w: BlockSize %d must be > 0", ErrInvalidConfig, c.BlockSize)
	case c.MaxBatchedTokens <= 0:
		return fmt.Errorf("%w: MaxBatchedTokens %d must be > 0", ErrInvalidConfig, c.MaxBatchedTokens)
	case c.MaxNumSeqs <= 0:
		return fmt.Errorf("%w: MaxNumSeqs %d must be > 0", ErrInvalidConfig, c.MaxNumSeqs)
	case c.MaxModelLen <= 1:
		return fmt.Errorf("%w: MaxModelLen %d must be > 1", ErrInvalidConfig, c.MaxModelLen)
	case c.Step.Base < 0 || c.Step.PerAdmit < 0 || !(c.Step.PrefillNs >= 0) || !(c.Step.DecodeNs >= 0) || !(c.Step.ContextNs >= 0):
		return fmt.Errorf("%w: Step coefficients must be finite and >= 0", ErrInvalidConfig)
	case math.IsInf(c.Step.PrefillNs, 0) || math.IsInf(c.Step.DecodeNs, 0) || math.IsInf(c.Step.ContextNs, 0):
		return fmt.Errorf("%w: Step coefficients must be finite and >= 0", ErrInvalidConfig)
	case c.Step.Base == 0 && c.Step.PrefillNs == 0 && c.Step.DecodeNs == 0:
		return fmt.Errorf("%w: Step must have a positive Base, PrefillNs or DecodeNs (a step cannot take no time)", ErrInvalidConfig)
	}
	return nil
}
