// Package flowhttp is the net/http side of flowgate: Handler, which puts each
// gated request in a flowcontrol.Controller band and calls the wrapped
// handler only when the controller releases it, and Gateway, which wires
// that handler to a saturation.Poller of the model servers, the in-flight
// credit and the metrics, so that a Go proxy gets flowgate's protection by
// writing only its routing:
//
//	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: backends})
//	...
//	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		b := pick(r)                      // the host's routing
//		defer gw.Forward(w, b.URL)()      // counted on b from now on
//		b.Proxy.ServeHTTP(w, r)
//	})
//	err = gw.ListenAndServe(ctx, ":8000", next, flowhttp.ServerConfig{})
//
// # Routing
//
// A host without a routing of its own asks the gateway's Router:
// gw.Router().Route(w) in next picks the endpoint with the fewest requests
// this gateway has in flight (those whose metrics read usable first, ties
// round-robin), except for a critical (band 0) request when the critical
// routing is on: that one goes, by the same rule, to an endpoint whose last
// reading leaves at least GatewayConfig.CriticalKVHeadroom of its KV cache
// free, when some endpoints have that room and others do not, and to the
// endpoints with the most free when none has it. The routing is on by
// default, at DefaultCriticalKVHeadroom, when the gateway writes the band
// into the forwarded body (Options.ForwardPriority PrioritySet): that is
// the operator's statement that the model servers schedule by priority
// (vLLM's --scheduling-policy priority), where a critical request passes
// every queued one but still needs KV blocks for its prompt, and vLLM
// preempts nobody to admit it. Without priority scheduling a critical
// request waits behind the queue wherever it goes, and the routing is off
// unless CriticalKVHeadroom sets it; NoCriticalKVRouting turns it off. A
// host with its own routing may ignore the Router: BandOf tells next the
// band the request waited in, and Router.Eligibility(band) which endpoints
// the critical routing would rank last (one reading for the whole pick).
//
// # Who may use which band
//
// A band is granted, not claimed. The host says who a caller is with
// Options.Identify (an API key it checks, an mTLS subject, a header its
// authenticating front proxy sets): the Identity names the most critical
// band the caller may use, its ceiling, and its fairness id. What a client
// writes itself (llm-d's objective header, x-llm-d-inference-objective or
// the legacy x-gateway-inference-objective, or its body's "priority") can
// only move its request to a less critical band than the ceiling, never
// raise it. A request that asks nothing goes to its ceiling.
//
// The zero value trusts no client: without Identify, every caller's ceiling
// is Options.DefaultObjective's band, by default the last, most sheddable
// one, so no header or body makes a request critical.
// Options.TrustObjectiveHeader restores llm-d's behaviour, the header
// trusted from every caller, for a gateway behind a front proxy that
// authenticates callers and sets the header; Gateway.Start logs which of
// the two it runs.
//
// Header values match an objective exactly up to ASCII case ("Critical" is
// "critical"; "CRİTİCAL", with U+0130, is nothing). Every line of both
// objective headers counts, each a comma-separated list, and the least
// critical known value wins: a front proxy that appends its value beside
// the client's is never overridden by a more critical one.
//
// A band with fairness (flowcontrol.BandConfig.Fairness; DefaultBands are
// round-robin) shares its releases between flows: the identity's, whatever
// fairness-id header the client sends; anonymous callers of a gateway with
// Identify share one flow; without Identify the fairness-id header names it.
//
// # The model
//
// A request is gated (by default: every method but GET, HEAD and OPTIONS, on
// any path; Options.Gated changes it). A gated request's body is read first
// (at most Options.MaxBodyBytes, at no less than Options.MinBodyRate after a
// grace period, with no pause longer than Options.BodyIdleTimeout), so a
// request waits with its whole body in memory and the wrapped handler never
// waits on a slow client while it holds a slot. Its band is then what it
// asks, but never more critical than its ceiling; what it asks is, in this
// order:
//
//  1. the objective header, looked up in Options.Objectives (default:
//     "critical" → band 0, "sheddable" → the last band, and every band's
//     name → that band);
//  2. Options.Classify, if set, for anything else;
//  3. the body's top-level integer "priority" (vLLM's request field;
//     BodyPriority), in Options.Priority's convention: vLLM's is lower
//     first, so priority p is band clamp(p, 0, bands−1); unless
//     Options.IgnoreBodyPriority;
//  4. nothing: the request goes to its ceiling.
//
// Memory is bounded by construction. Every body being read, waiting or
// being served (until the wrapped handler returns) holds its buffer in one
// budget, Options.MaxBodyMemory (DefaultMaxBodyMemory by default),
// charged before the buffer is allocated: a body that does not fit is
// refused 429 body-memory-full before more of it is read. A quarter of it
// (Options.CriticalReserve) is kept for requests granted band 0 before their
// body is read, so sheddable uploads cannot take the memory a critical
// request needs. While it waits, a body also counts against its band's byte budget
// (flowcontrol.BandConfig.MaxBytes). The request then waits in
// Controller.Wait; once released, the wrapped handler runs with the buffered
// body (its "priority", if it has one, rewritten with the granted band's
// value, or added or removed as Options.ForwardPriority says, so that a
// model server running priority scheduling orders and preempts by the
// gateway's band and never by the client's own value), and the controller's done is called when the handler
// returns — the response fully written, streamed or not — or the client
// left, or the handler panicked (the panic goes on after done, so
// http.ErrAbortHandler keeps its meaning).
//
// # Refusals
//
// A request flowhttp does not forward gets an OpenAI-shaped JSON error, the
// shape vLLM and the OpenAI SDKs read:
//
//	{"error":{"message":"flowgate: ...","type":"rate_limit_error","code":"queue-full"}}
//
// with the reason in the code and in the x-llm-d-request-dropped-reason
// header, and the band and the time waited in the message:
//
//	reason            status  retry
//	queue-full        429     Retry-After: 1 (the queue drains)
//	queue-bytes-full  429     Retry-After: 1
//	body-memory-full  429     Retry-After: 1, connection closed (the body was not read)
//	expired           503     x-should-retry: false: it already waited the band's MaxWait
//	                          (Retry-After: 1 for a request the gateway evicted and re-queued)
//	shutting-down     503     Retry-After: 1 (another replica may take it)
//	not-running       503     Retry-After: 1 (the controller was not started)
//	body-too-large    413     x-should-retry: false
//	body-timeout      408     x-should-retry: false, connection closed
//	overloaded        503     Retry-After: 1, connection closed (Gateway.Serve's reserved connections)
//	bad-body          400     x-should-retry: false (also: a body whose priority cannot be rewritten)
//
// Capacity refusals are 429 and "the pool cannot serve it now" is 503, as in
// llm-d. An expired request is 503 and not 429 because nothing about the
// client's rate caused it, and it carries x-should-retry: false because a
// retry would queue as long again: the OpenAI SDKs honour the header and
// skip their default retries. A client that leaves while its request waits
// gets no answer (nobody is listening); Options.OnFinish reports it with
// status 499, as nginx logs it.
//
// Every gated response the wrapped handler writes carries x-flowgate-band;
// copies of flowhttp's own headers in the handler's response (a backend that
// is itself behind flowgate) are removed, so a 429 from a backend cannot be
// mistaken for one of ours.
//
// # Eviction
//
// With GatewayConfig.Eviction on, the gateway may take back a forwarded
// request of a less critical band while a more critical one waits for its
// first byte on an endpoint whose KV cache reads full (the poller's
// vllm:kv_cache_usage_perc), or waits behind a gate on a saturated pool
// (flowcontrol.Evictor decides who and when). Forward tracks
// the request on its endpoint; the eviction cancels the context of the
// request the wrapped handler serves, so its upstream request is cancelled
// and the model server aborts it. The response's status and headers are
// held until its first body byte: until then nothing has reached the
// client, and an evicted attempt is dropped whole (the handler's 502 or
// abort included), its controller slot and endpoint count given back, and
// the request waits again at the head of its band and goes to the wrapped
// handler again, with the body flowhttp kept (still charged to
// MaxBodyMemory). The client sees one response, later; Result.Evictions
// counts the re-queues and OnFinish is called once. A started response is
// cut only with EvictionConfig.Started (Result.Reason "evicted").
//
// # Releases the saturation has not seen yet
//
// Scraped metrics lag the pool. The controller tells the poller of each
// release at once (a request not yet forwarded counts on an average
// endpoint), Forward moves it to its endpoint (the poller's in-flight
// credit), and the dispatcher paces a band that reopens with a backlog
// (Burst per tick, re-reading the saturation after each release), so the
// requests released between two scrapes close the gate before they fill the
// pool. GatewayConfig.NoCredit turns the credit off for comparison.
package flowhttp
