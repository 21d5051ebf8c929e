package vllm

import (
	"fmt"
	"math/bits"
	"time"
)

// Request is one inference request inside a replica. The caller sets ID, Input and Output;
// the rest is the replica's bookkeeping, readable for tests and metrics.
type Request struct {
	ID     uint64 // caller's identifier, echoed in events
	Input  int    // prompt tokens (>= 1)
	Output int    // tokens to generate (>= 1)
	// Priority is vLLM's request priority (lower is more urgent); it matters only
	// with Config.PriorityScheduling.
	Priority int

	seq     uint64 // arrival order at this replica (set by Add)
	aborted bool   // Abort was called during the step that schedules it

	computed    int // tokens whose KV is in the cache (reset to 0 by a preemption)
	generated   int // output tokens sampled so far (kept across a preemption)
	blocks      int // KV blocks held
	Preemptions int // times this request was preempted and recomputed
}

// Generated returns the output tokens sampled so far.
func (q *Request) Generated() int { return q.generated }

// Computed returns the tokens whose KV entries are in the cache.
func (q *Request) Computed() int { return q.computed }

// Blocks returns the KV blocks the request holds.
func (q *Request) Blocks() int { return q.blocks }

// known is every token of the sequence so far: the prompt plus what was generated. After
// a preemption all of them are recomputed as one prompt, as vLLM's recompute mode does.
func (q *Request) known() int { return q.Input + q.generated }

// EventKind says what happened to a request at the end of a step.
type EventKind uint8

const (
	// FirstToken: the request's first output token was sampled (its TTFT).
	FirstToken EventKind = iota + 1
	// Finished: the request sampled its last token and released its KV blocks.
	Finished
	// Preempted: the request lost its KV blocks and went back to the front of the waiting
	// queue; it will be recomputed. Reported by Begin, when it happens.
	Preempted
)

// Event is one request-level outcome of a step.
type Event struct {
	Kind EventKind
	Req  *Request
}

// Metrics are the gauges vLLM exports, as of the end of the last finished step.
type Metrics struct {
	Waiting      int     // vllm:num_requests_waiting (includes preempted requests)
	Running      int     // vllm:num_requests_running
	KVCacheUsage float64 // vllm:kv_cache_usage_perc = 1 − free/total, in [0, 1]
}

// Batch describes the step Begin scheduled.
type Batch struct {
	Requests      int // requests in the batch
	PrefillTokens int // prompt/recompute tokens
	DecodeTokens  int // decode tokens (one per decoding request)
	Admitted      int // requests moved from waiting to running by this step
	ContextTokens int // KV tokens attention reads: Σ (computed before + scheduled)
}

// add counts request q scheduled for n tokens in the batch.
func (b *Batch) add(q *Request, n int) {
	b.Requests++
	if n == 1 && q.generated > 0 && q.computed == q.known()-1 {
		b.DecodeTokens++
	} else {
		b.PrefillTokens += n
	}
	b.ContextTokens += q.computed + n
}

type scheduled struct {
	req    *Request
	tokens int
}

// Replica is one vLLM engine: a FCFS waiting queue, a running set, a paged KV cache and
// the V1 scheduler's continuous batching with chunked prefill and recompute preemption.
//
// It has no clock. A driver calls Begin, which schedules the next batch and returns how
// long that step takes, waits that long (virtual or real time), then calls Finish, which
// applies the step and returns the first-token and finished events. Requests added with
// Add while a step runs join the waiting queue for the next step, and the metrics are
// refreshed only by Finish, as vLLM refreshes its gauges once per step. Not safe for
// concurrent use.
type Replica struct {
	cfg     Config
	waiting deque
	running []*Request
	free    int
	batch   []scheduled
	inStep  bool
	last    Batch
	metrics Metrics
	steps   uint64
	seq     uint64
	shift   int // log2(BlockSize) when it is a power of two, else -1
}

// New returns an idle replica with an empty KV cache.
func New(cfg Config) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Replica{cfg: cfg, free: cfg.TotalBlocks, shift: -1}
	if bs := cfg.BlockSize; bs&(bs-1) == 0 {
		r.shift = bits.TrailingZeros(uint(bs))
	}
	return r, nil
}

// Config returns the replica's configuration.
func (r *Replica) Config() Config { return r.cfg }

func (r *Replica) blocksFor(tokens int) int {
	if r.shift >= 0 {
		return (tokens + r.cfg.BlockSize - 1) >> r.shift
	}
	return (tokens + r.cfg.BlockSize - 1) / r.cfg.BlockSize
}

// Add appends a new request to the back of the waiting queue. It fails (wrapping
// ErrInvalidRequest) for lengths below 1, a sequence longer than MaxModelLen, or one whose
// full KV footprint exceeds the whole cache (it would preempt itself forever).
func (r *Replica) Add(q *Request) error {
	switch {
	case q == nil:
		return fmt.Errorf("%w: nil request", ErrInvalidRequest)
	case q.Input < 1:
		return fmt.Errorf("%w: Input %d must be >= 1", ErrInvalidRequest, q.Input)
	case q.Output < 1:
		return fmt.Errorf("%w: Output %d must be >= 1", ErrInvalidRequest, q.Output)
	case q.Input > r.cfg.MaxModelLen-q.Output: // Input+Output > MaxModelLen, without overflowing
		return fmt.Errorf("%w: Input %d + Output %d exceeds MaxModelLen %d", ErrInvalidRequest, q.Input, q.Output, r.cfg.MaxModelLen)
	case r.blocksFor(q.Input+q.Output-1) > r.cfg.TotalBlocks:
		// The last sampled token is never computed, so a sequence caches Input+Output−1.
		return fmt.Errorf("%w: Input+Output %d needs more than the %d KV blocks", ErrInvalidRequest, q.Input+q.Output, r.cfg.TotalBlocks)
	}
	q.computed, q.generated, q.blocks, q.Preemptions, q.aborted = 0, 0, 0, 0, false
	r.seq++
	q.seq = r.seq
	r.enqueueWaiting(q, false)
	return nil
}

// before reports whether a goes before b in the priority policy's order.
func before(a, b *Request) bool {
	return a.Priority < b.Priority || a.Priority == b.Priority && a.seq < b.seq
}

// enqueueWaiting puts q into the waiting queue: FCFS at the back (front for a
// preempted request), or in (Priority, arrival) order under PriorityScheduling.
func (r *Replica) enqueueWaiting(q *Request, preempted bool) {
	if !r.cfg.PriorityScheduling {
		if preempted {
			r.waiting.pushFront(q)
		} else {
			r.waiting.pushBack(q)
		}
		return
	}
	r.waiting.insertSorted(q, before)
}

// Abort removes q wherever it is in the replica (the client gave up): from the
// waiting queue or the running set, freeing its KV blocks. A request in the step in
// progress leaves at Finish, with no events. It reports whether q was in the replica.
func (r *Replica) Abort(q *Request) bool {
	if r.waiting.remove(q) {
		return true
	}
	for i, v := range r.running {
		if v != q {
			continue
		}
		if r.inStep {
			for _, s := range r.batch {
				if s.req == q {
					q.aborted = true
					return true
				}
			}
		}
		copy(r.running[i:], r.running[i+1:])
		r.running[len(r.running)-1] = nil
		r.running = r.running[:len(r.running)-1]
		r.free += q.blocks
		q.blocks = 0
		return true
	}
	return false
}

// HasWork reports whether a step would schedule anything (a request waits or runs).
func (r *Replica) HasWork() bool { return len(r.running) > 0 || r.waiting.len() > 0 }

// InStep reports whether Begin was called without the matching Finish.
func (r *Replica) InStep() bool { return r.inStep }

// Metrics returns the gauges as of the end of the last finished step.
func (r *Replica) Metrics() Metrics { return r.metrics }

// Live returns the gauges of the current state (for tests and the final report; a
// gateway must use Metrics, which lags like the real exporter).
func (r *Replica) Live() Metrics {
	return Metrics{
		Waiting:      r.waiting.len(),
		Running:      len(r.running),
		KVCacheUsage: float64(r.cfg.TotalBlocks-r.free) / float64(r.cfg.TotalBlocks), // = 1 − free/total, exact at 0
	}
}

// FreeBlocks returns the KV blocks not held by any request.
func (r *Replica) FreeBlocks() int { return r.free }

// LastBatch describes the batch of the last Begin.
func (r *Replica) LastBatch() Batch { return r.last }

// Steps returns the number of finished steps.
func (r *Replica) Steps() uint64 { return r.steps }

// Running returns the running requests in scheduling order (oldest first). The slice is
// the replica's own; do not modify it.
func (r *Replica) Running() []*Request { return r.running }

// Waiting returns the waiting requests, front first, appended to dst.
func (r *Replica) Waiting(dst []*Request) []*Request { return r.waiting.appendTo(dst) }

// victim returns the index in running of the request a failed allocation preempts, as
// vLLM V1's scheduler picks it: under FCFS the most recently admitted one (the last of
// running), under PriorityScheduling the one with the largest (Priority, arrival) among
// all running requests, whether or not it was already scheduled in this step
// (vllm/v1/core/sched/scheduler.py: max(self.running, key=(priority, arrival_time))).
func (r *Replica) victim() int {
	j := len(r.running) - 1
	if r.cfg.PriorityScheduling {
		for k := range r.running {
			if before(r.running[j], r.running[k]) {
				j = k
			}
		}
	}
	return j
}

// preempt evicts running[j]: its blocks are freed, its progress is reset (recompute) and
// it goes back to the waiting queue (the front, under FCFS).
func (r *Replica) preempt(j int) *Request {
	v := r.running[j]
	copy(r.running[j:], r.running[j+1:])
	r.running[len(r.running)-1] = nil
	r.running = r.running[:len(r.running)-1]
	r.free += v.blocks
	v.blocks, v.computed = 0, 0
	v.Preemptions++
	r.enqueueWaiting(v, true)
	return v
}

// unschedule removes v from the batch being built and returns the tokens it had been
// given (vLLM gives them back to the step's token budget).
func (r *Replica) unschedule(v *Request) int {
	for k, sc := range r.batch {
		if sc.req == v {
			copy(r.batch[k:], r.batch[k+1:])
			r.batch[len(r.batch)-1] = scheduled{}
			r.batch = r.batch[:len(r.batch)-1]
			return sc.tokens
		}
	}
	return 0
}

// Begin schedules the next step the way vLLM's V1 scheduler does and returns its duration,
// the Preempted events it caused (appended to dst), and false when there is nothing to do.
//
//  1. Running requests, oldest first, each get min(remaining known tokens, token budget)
//     tokens: one for a decoding request, a (possibly partial) chunk for one in prefill.
//     Their KV blocks are allocated now; when the cache is out of blocks a victim is
//     preempted until the allocation fits: under FCFS the newest running request, under
//     PriorityScheduling the running request with the largest (Priority, arrival), one
//     already scheduled in this step included (it is unscheduled and its tokens return
//     to the budget). When the victim is the request being scheduled, no further running
//     request is scheduled in this step.
//  2. If nothing was preempted, waiting requests are admitted FCFS while running <
//     MaxNumSeqs and budget remains; a prompt longer than the budget is chunked. Admission
//     stops at the first request whose blocks cannot be allocated (with the what-if
//     Config.PreemptForWaiting, that request first preempts the running requests less
//     urgent than itself, largest first, until its blocks fit; after one that did,
//     admission stops).
func (r *Replica) Begin(dst []Event) (step time.Duration, events []Event, ok bool) {
	if r.inStep {
		return 0, dst, false
	}
	r.batch = r.batch[:0]
	budget := r.cfg.MaxBatchedTokens
	preempted := false
	var b Batch
	rebuild := false // a request scheduled earlier in this step was preempted
	for i := 0; i < len(r.running) && budget > 0; {
		q := r.running[i]
		n := min(q.known()-q.computed, budget)
		fits := true
		for {
			need := r.blocksFor(q.computed+n) - q.blocks
			if need <= r.free {
				r.free -= need
				q.blocks += need
				break
			}
			j := r.victim()
			if j < i {
				// Already scheduled in this step (PriorityScheduling only: under
				// FCFS the victim is the last, at or after i): unschedule it.
				budget += r.unschedule(r.running[j])
				rebuild = true
				i--
			}
			v := r.preempt(j)
			preempted = true
			dst = append(dst, Event{Kind: Preempted, Req: v})
			if v == q {
				fits = false
				break
			}
		}
		if !fits {
			// q preempted itself: no running request is lower in the policy's
			// order, and vLLM stops scheduling running requests for this step.
			break
		}
		r.batch = append(r.batch, scheduled{q, n})
		b.add(q, n)
		budget -= n
		i++
	}
	admitted := 0
	if !preempted {
		for r.waiting.len() > 0 && len(r.running) < r.cfg.MaxNumSeqs && budget > 0 {
			q := r.waiting.front()
			n := min(q.known()-q.computed, budget)
			need := r.blocksFor(q.computed+n) - q.blocks
			evicted := false // q preempted running requests for its blocks
			if need > r.free && r.cfg.PreemptForWaiting && r.cfg.PriorityScheduling {
				for need > r.free && len(r.running) > 0 {
					j := r.victim()
					v := r.running[j]
					if !before(q, v) {
						break // nothing running is less urgent than q
					}
					if t := r.unschedule(v); t > 0 {
						budget += t
						rebuild = true
					}
					r.preempt(j)
					dst = append(dst, Event{Kind: Preempted, Req: v})
					evicted = true
				}
				n = min(q.known()-q.computed, budget)
				need = r.blocksFor(q.computed+n) - q.blocks
			}
			if need > r.free {
				break
			}
			r.free -= need
			q.blocks += need
			r.waiting.popFront()
			r.running = append(r.running, q)
			r.batch = append(r.batch, scheduled{q, n})
			b.add(q, n)
			budget -= n
			admitted++
			if evicted {
				// As after a preemption in the running pass, nothing more is
				// admitted in this step (the victims would be re-admitted).
				break
			}
		}
	}
	if rebuild {
		// A request counted in b was unscheduled (by the running pass's
		// preemption, or by PreemptForWaiting's): count the batch again.
		b = Batch{}
		for _, sc := range r.batch {
			b.add(sc.req, sc.tokens)
		}
	}
	if len(r.batch) == 0 {
		r.last = Batch{}
		return 0, dst, false
	}
	b.Admitted = admitted
	r.last = b
	r.inStep = true
	return (r.cfg.Step.Duration(b.PrefillTokens, b.DecodeTokens, b.ContextTokens, b.Admitted)), dst, true
}

// Finish applies the step Begin scheduled: every scheduled request computes its tokens;
// one whose known tokens are all computed samples its next token (the first one is a
// FirstToken event); one that sampled its last token finishes and frees its blocks. The
// metrics snapshot is refreshed. Events are appended to dst.
func (r *Replica) Finish(dst []Event) []Event {
	if !r.inStep {
		return dst
	}
	r.inStep = false
	r.steps++
	done := false
	for _, s := range r.batch {
		q := s.req
		if q.aborted {
			r.free += q.blocks
			q.blocks = 0
			done = true
			continue
		}
		q.computed += s.tokens
		if q.computed < q.known() {
			continue // a chunk of a longer prefill
		}
		q.generated++
		if q.generated == 1 {
			dst = append(dst, Event{Kind: FirstToken, Req: q})
		}
		if q.generated >= q.Output {
			r.free += q.blocks
			q.blocks = 0
			done = true
			dst = append(dst, Event{Kind: Finished, Req: q})
		}
	}
	clear(r.batch)
	r.batch = r.batch[:0]
	if done {
		keep := r.running[:0]
		for _, q := range r.running {
			if q.generated < q.Output && !q.aborted {
				keep = append(keep, q)
			}
		}
		clear(r.running[len(keep):])
		r.running = keep
	}
	r.metrics = r.Live()
	return dst
}

// Step runs Begin and Finish back to back (for drivers that apply a step's effects at its
// start); it returns the duration and all events, or ok false when idle.
func (r *Replica) Step(dst []Event) (time.Duration, []Event, bool) {
	d, dst, ok := r.Begin(dst)
	if !ok {
		return 0, dst, false
	}
	return d, r.Finish(dst), true
}
