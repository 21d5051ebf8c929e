// Package flowcontrol decides which already-admitted request an inference
// proxy sends to its model servers next.
//
// # The model
//
// Requests wait in priority bands, band 0 the most critical (see
// BandConfig). Each band is a lock-free ring (package queue), so producers —
// request handlers — never block and never take a lock. One goroutine runs
// the dispatcher's ticks: on each tick it reads the backend pool's
// saturation once from a SaturationSource (0 idle, 1 full, above 1
// overloaded), sanitises it with Sanitize (the one rule: NaN → 1, negative →
// 0, above MaxSaturation → MaxSaturation), and asks the CeilingPolicy for
// every band's Gate.
//
// A Gate says how often the band may release: Every 1 means on every tick,
// Every n on one tick in n, 0 blocked. The policies are pure functions of
// (band, bands, saturation): Static (a constant ceiling, every band open
// below one threshold and blocked at it), SoftReflective (band i's ceiling
// 1 − i·s/(N−1), a duty cycle of round(s/ceiling) above it, blocked at 0)
// and PriorityHoldback (llm-d's priority-holdback-policy: a fixed ceiling
// per band, by rank, priority value or an explicit map). A user's
// PolicyFunc is as safe as they are: safety is the dispatcher's.
//
// # The discipline
//
// The dispatcher applies one discipline to every policy (see Dispatcher):
//
//   - a band's duty cycle counts the ticks since it last released and opens
//     it when the count reaches Every (not tick % Every), so its longest gap
//     is bounded by the largest Every it saw however the saturation moves;
//     a gated band releases up to Burst items, FIFO, when it opens;
//   - an open band without a backlog has no budget: everything queued goes,
//     and a Controller.Wait on an open, empty band is released in the
//     caller's goroutine;
//   - a band that reopens with a backlog releases Burst per tick, re-reading
//     its gate after each release, until it is empty: scraped saturation
//     lags, so a backlog released at once would flood the servers before any
//     reading showed it;
//   - band 0 is never gated, whatever the policy says, unless
//     Config.BlockCritical (llm-d's meaning).
//
// Between ticks, an Enqueue wakes the dispatcher at once, so an item on an
// open band does not wait for the next tick. With every band empty the
// dispatcher sleeps, and on waking credits the ticks it slept through: idle
// costs no CPU and changes no count. A timer that fires late runs the ticks
// it missed (a bounded number), so rates hold on a busy machine.
//
// llm-d's own discipline (one item per cycle, strict priority, halting at
// the first gated band) is reproduced, for comparison only, in package
// flowcontrol/llmd.
//
// # Outcomes
//
// Every request that enters a band ends in exactly one outcome: dispatched,
// or dropped as cancelled (its owner gave up), expired (it waited past the
// band's MaxWait) or closed (Close). A request that never enters is refused
// with a sentinel error: ErrQueueFull, ErrClosed, ErrUnknownBand, and, for
// Controller.Wait, ErrNotRunning, ErrCancelled for a context already done,
// or ErrShed from the optional admission stage (ControllerConfig.Admitter;
// Probabilistic is llm-d's).
// Stats counts each of them; ControllerConfig.OnOutcome reports each queued
// outcome with the time waited, before the waiter wakes (package
// flowmetrics builds its metrics on it).
//
// # Two faces
//
// Dispatcher[T] is the generic core: items of any type, released through a
// Dispatch callback and dropped through OnDrop, driven by Step (one tick, for
// simulators on virtual time) or Run (the real clock). Controller is the
// blocking facade a proxy handler uses:
//
//	p, err := c.Wait(ctx, band) // sleeps until the band releases it
//	if err != nil { ... }       // refused, expired, cancelled, closed
//	defer p.Done()              // the request has finished
//
// A Wait whose context ends while queued returns at once and gives its place
// back at the next tick, even in a blocked band; the Controller resolves the
// race between that cancellation and a release with a compare-and-swap on
// the waiter's ticket, so each Wait sees exactly one result.
//
// # Eviction: taking back what has left
//
// Gating decides what leaves the gateway; it cannot undo what has left.
// When a server's KV cache is full of less critical work released earlier
// (long decodes), a critical request waits in the server's queue, which
// preempts nobody for it. An Evictor takes such work back (see Evictor for
// the rule): while a request of a more critical band is held — released
// without a first byte for EvictionConfig.Stall on an endpoint whose KV
// cache is full, or queued behind a gate while the pool reads saturated —
// it picks a released request of a less critical band (the least critical
// band first, then the newest: the least work lost) and calls the act the
// host gave for it, which cancels it at its server (vLLM and SGLang abort
// a request whose client disconnects and free its KV cache). Eviction
// frees memory, not compute: a request that waits for a long prefill or a
// full batch on a server with room in its cache is left to wait. One
// eviction is in flight per endpoint; the next waits for the server's
// confirmation plus a grace of one scrape, so the freed capacity shows
// before it is judged again.
//
// A victim whose response had not started is not failed: the host
// re-queues it at the head of its band (Controller.Requeue) and forwards
// it again, so its client sees only a later first token. A started
// response is never cut unless EvictionConfig.Started. A request is
// evicted at most MaxEvictions times; its band's MaxWait, counted from its
// first Wait, still bounds its whole wait.
//
//	c, _ := flowcontrol.NewController(flowcontrol.ControllerConfig{
//		Config:   cfg,
//		Eviction: flowcontrol.EvictionConfig{Enabled: true, KVUsage: kvOf},
//	})
//	...
//	p, err := c.Wait(ctx, band)
//	upstream, cancel := context.WithCancel(ctx)
//	t := c.Evictor().Track(band, endpoint, cancel)
//	... forward with upstream; t.Start() at the first byte to the client
//	if t.Done() && !started {
//		p.Done()
//		p, err = c.Requeue(ctx, band, nil, waitedSince) // and forward again
//	}
//
// flowhttp.Gateway does all of this for HTTP when its eviction is on.
//
// # Flows: fairness between tenants inside a band
//
// By default a band is one FIFO (Fairness "fcfs"). A band with Fairness
// "round-robin" or "fair-share" keys its items by flow — a tenant, the
// fairness id of a request — given with EnqueueFlow or
// Controller.WaitRequest:
//
//	r := &flowcontrol.Request{Flow: tenant, Cost: promptTokens + maxTokens}
//	p, err := c.WaitRequest(ctx, band, r)
//	if err != nil { ... }       // also ErrFlowFull: the tenant's FlowCapacity
//	defer p.Done()              // charges r.Served − r.Cost to the tenant
//	...
//	r.Served = tokensServed
//
// round-robin releases one item per active flow in turn. fair-share is
// start-time fair queuing on cost: the flow whose head has the least virtual
// start tag goes next, a flow that becomes active starts at the current
// virtual time (no credit for having been idle, no debt for its history
// beyond its last item), and the real cost reported at Done corrects the
// flow's finish tag. FlowCapacity bounds what one flow may hold, so a noisy
// tenant is refused before it fills the band; Ordering "edf" releases a
// flow's items earliest deadline first. Ingress is still the band's
// lock-free ring: the per-flow queues belong to the ticking goroutine, which
// drains the ring into them at each tick. Flows idle for FlowIdle are
// forgotten.
//
// # Concurrency
//
// Enqueue and Wait are safe from any number of goroutines. Ticks (Step,
// Flush, Run) are serialised; Dispatch, OnDrop and OnOutcome run on the
// ticking goroutine and must not call Step, Flush or Close. Stats may be
// read at any time; its counters are exact whenever nothing is in progress.
// The hot path allocates nothing in steady state, a released Wait
// included: its Permit is a value.
package flowcontrol
