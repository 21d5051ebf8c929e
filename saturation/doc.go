// Package saturation provides sources of backend-pool saturation for a
// dispatcher to gate on: settable values, combinators, smoothing, an
// in-flight counter, and a poller of the Prometheus metrics pages of vLLM or
// SGLang servers. It knows nothing of queues or bands.
//
// # Sources
//
// A Source reports one number: 0 idle, 1 full, above 1 overloaded. The
// dispatcher calls Saturation once per tick, so every Source here is safe
// for concurrent use and reads without I/O, locks or allocation. Func adapts
// a function; Value is a settable number for hosts that compute saturation
// themselves.
//
// # One sanitising rule, and where it lives
//
// Sources report raw values: a Value set to NaN reads NaN, a Func returning
// −3 reads −3. The one rule that turns any float64 into a saturation a
// policy can use is flowcontrol.Sanitize (NaN → 1, negative → 0, above
// flowcontrol.MaxSaturation → that cap), and the dispatcher applies it once
// per tick, between the source and the gate. This package does not import
// flowcontrol and does not repeat the rule. What it does guarantee is that
// no source of its own invents a NaN from sane inputs, and that the
// composites below have a documented answer for every input.
//
// # Composites
//
// Max reports the largest of its sources and Mean their unweighted mean. In
// both, a NaN input counts as 1 (no information is not idle: it can raise
// the result but never hide a larger value); Mean also counts a negative
// input as 0, so that one broken source cannot cancel another, and reports
// +Inf if an input is +Inf or the sum overflows. Neither ever reports NaN.
//
// EWMA smooths a source with a half-life in time rather than in samples, so
// the result does not depend on how often it is read. It averages a NaN
// sample as 1 and a negative one as 0; a +Inf sample is passed through for
// that read without entering the average. It therefore never gets stuck:
// after any input, the next finite sample moves the average again.
//
// InFlight counts requests dispatched and not yet finished, over a
// capacity. It moves the instant a request is sent, which scraped metrics
// cannot; combine it with a poller through Max.
//
// # The poller and its score
//
// Poller scrapes each pod's metrics page and scores the pool with Scorer,
// the reference gateway's formula:
//
//	pod  = max(waiting / QueueDepthThreshold, kv / KVUtilThreshold)   defaults 5 and 0.8
//	pool = unweighted mean of pod over the pods
//
// A pod whose reading is stale (older than Scorer.Staleness), missing (never scraped, or failed with FailFast), or unusable (a
// NaN, infinite or negative value) scores 1.0, as if full: a pod the poller
// cannot see is not assumed idle. PodReading.Reason records why a pod is not
// usable. Scorer.IgnoreStale leaves such pods out of the mean instead. A
// pool with no pods, or none counted, is 1.
//
// Beyond the reference formula, Scorer can anticipate what the gauges show
// late, from what vLLM also exports (ParseMetrics reads the mean prompt and
// output lengths of finished requests from vllm:request_prompt_tokens and
// vllm:request_generation_tokens): Scorer.PromptTokenThreshold weighs the
// waiting requests by their prompt tokens (flowhttp.Gateway ships it at
// DefaultPromptTokenThreshold), Scorer.Projection scores KV usage at the
// running requests' expected completion or steady batch, and
// Scorer.PoolMax takes the most saturated pod instead of the mean.
//
// In-flight credit (Scorer.InFlightCredit) closes the gap between a dispatch
// and the next scrape: requests this host has sent to a pod beyond what the
// pod's metrics show (waiting + running) count as waiting. The host tells the
// poller with Poller.Dispatched when it sends a request to a pod and
// Poller.Finished when the request ends; each is one compare-and-swap and at
// most one atomic add (no lock, no rescoring), and the very next Saturation
// read includes the request, so a burst released between two scrapes raises
// the pool's value as it is released instead of when the pods' metrics finally
// show it. The credit is Scorer.Pod's: a credited request counts as a
// waiting one in every term, the prompt-token term included. Saturation
// stays O(1) in the number of pods (Poller.Saturation states the
// precision). A host that does not know where a request went (a plain
// flowcontrol.Controller) tells the poller of releases instead (Poller.Inc,
// Poller.Dec): they count against the pool (Scorer.PoolReleased). Requests
// other gateway replicas have
// in flight (the shared view of package redisshare) go in
// PollerConfig.PeerInFlight, read at results and rescores.
// Poller.ReadingSeq counts the scrape results applied, so a dispatcher can
// tell when a new reading arrived.
//
// Run scrapes every endpoint on its own schedule, every Interval, with the
// endpoints' phases spread over the first interval; each scrape runs under
// its own timeout once it holds one of MaxConcurrency slots, and each result
// updates the pool value as it arrives. The pool is also rescored every
// Interval, so readings age and in-flight counts are refreshed between
// results.
//
// The schedule adapts to what the machine sustains. A pool larger than it
// can scrape every Interval is reached less often, each pod in turn; a busy
// node slows every scrape, and the effective timeout follows: the longer of
// Timeout and TimeoutLatencyFactor times the median scrape latency, at
// most MaxTimeoutGrowth times Timeout. Staleness is judged against that
// achieved cadence: the time the poller itself kept a pod waiting (for a
// slot, for a Scrape round to come back to it, on its failed scrapes) does
// not age the pod's reading, so a healthy pod is never stale because of the
// poller's backlog; a pod that fails ceil(Staleness/Interval) scrapes in a
// row ages on the plain clock again and scores 1.
// Poller.Stats reports the usable pods, the per-pod interval achieved (mean
// and max), the median latency and the effective timeout; PodReading.Interval
// and PodReading.Owed give them per pod. Once Run returns the pool reads 1,
// whatever is rescored, until a Scrape.
//
// Poller.Scrape runs one synchronous scrape round, for tests and simulations;
// Scorer's methods are pure (time is an argument), so a simulator scores its
// model on virtual time without a poller at all.
//
// ParseMetrics reads the Prometheus text format and OpenMetrics text
// leniently (a BOM, CRLF line ends, exemplars, timestamps, "# EOF" and
// families of any type are accepted) and parses only the metric families the
// scorer needs, with expfmt.
//
// # Errors
//
// Every constructor error caused by a bad argument or field wraps
// ErrInvalidConfig and names the field; each field's documentation states
// its range. Scrape errors are typed (ErrHTTPStatus, ErrBodyTooLarge,
// ErrParse, ErrMissingMetric, ErrBadValue, context.DeadlineExceeded) and
// kept per pod in PodReading.Err.
//
// # Wiring
//
//	poller, err := saturation.NewPoller(saturation.PollerConfig{Endpoints: urls})
//	...
//	go poller.Run(ctx)
//	inflight, _ := saturation.NewInFlight(capacity)
//	src := saturation.Max(poller, inflight) // the dispatcher reads src once per tick
package saturation
