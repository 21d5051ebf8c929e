// Package flowhttp is the net/http gate in front of an inference server: it
// puts each gated request in a flowcontrol.Controller band and calls the
// wrapped handler only when the controller releases it.
//
//	h := flowhttp.Handler(ctrl, proxy, flowhttp.Options{})
//	http.ListenAndServe(":8000", h)
//
// # The model
//
// A request is gated (by default: every method but GET, HEAD and OPTIONS, on
// any path; Options.Gated changes it). A gated request's body is read first
// (at most Options.MaxBodyBytes, at no less than Options.MinBodyRate after a
// grace period), so a request waits with its whole body in memory and the
// wrapped handler never waits on a slow client while it holds a slot. Its
// band is then found, in this order:
//
//  1. the objective header, x-llm-d-inference-objective (or the legacy
//     x-gateway-inference-objective), looked up case-insensitively in
//     Options.Objectives (default: "critical" → band 0, "sheddable" → the
//     last band, and every band's name → that band);
//  2. Options.Classify, if set, for anything else;
//  3. Options.DefaultBand.
//
// The body's bytes count against the band's byte budget
// (flowcontrol.BandConfig.MaxBytes) while it waits. The request then waits in Controller.Wait; once released,
// the wrapped handler runs with the buffered body, and the controller's done
// is called when the handler returns — the response fully written, streamed
// or not — or the client left, or the handler panicked (the panic goes on
// after done, so http.ErrAbortHandler keeps its meaning).
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
//	expired           503     x-should-retry: false: it already waited the band's MaxWait
//	shutting-down     503     Retry-After: 1 (another replica may take it)
//	not-running       503     Retry-After: 1 (the controller was not started)
//	body-too-large    413     x-should-retry: false
//	body-timeout      408     x-should-retry: false, connection closed
//	bad-body          400     x-should-retry: false
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
// # Releases the saturation has not seen yet
//
// The Controller releases a request in its dispatcher's goroutine; the
// wrapped handler forwards it a scheduling delay later, on the request's
// goroutine. A saturation source that counts requests when they are
// forwarded (saturation.Poller's in-flight credit, through Dispatched) does
// not see a backlog the dispatcher is draining, so an open band can release
// all of it before the saturation moves. Charge the gap in the source the
// Controller reads: Controller.InFlight counts a release before its waiter
// wakes, so InFlight minus the requests the handler has forwarded is what
// the poller has not counted yet; examples/internal/gateway's releasedCredit
// does this, with Pacing.Recheck, in the example proxy.
package flowhttp
