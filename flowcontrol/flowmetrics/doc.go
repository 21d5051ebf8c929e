// Package flowmetrics exports a flowcontrol.Controller's state as Prometheus
// metrics, so that flowcontrol itself does not depend on client_golang.
//
// Two feeds make one Collector. At each scrape it takes one Stats snapshot
// of the controller it is bound to (queue depths, outcome and refusal
// counters, the last saturation and gates); and the controller calls its
// OnOutcome hook once per queued request, before the waiter wakes, which
// feeds the wait-time histogram. Because the hook lives in flowcontrol, a
// host that calls Controller.Wait directly gets a complete histogram: there
// is no wrapper to forget.
//
// The collector is made first, installed as ControllerConfig.OnOutcome,
// then bound to the controller with Bind, which checks that both have the
// same bands. See Collector for the metric names.
package flowmetrics
