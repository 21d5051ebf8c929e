package gateway

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// llm-d's flow-control metric names (Options.LLMDMetrics), exported in
// place of flowgate's families of the same facts (llmdReplaces), so that
// dashboards and autoscaling triggers written for llm-d work unchanged and
// each fact is served once:
//
//	llm_d_epp_flow_control_queue_size{fairness_id,priority}                    gauge
//	llm_d_epp_flow_control_request_queue_duration_seconds{fairness_id,priority,outcome} histogram
//	llm_d_epp_flow_control_requests_total{outcome,priority}                     counter
//	llm_d_epp_flow_control_pool_saturation                                      gauge
//
// priority is the band's configured priority; fairness_id is always
// "default-flow": the outcome hook these are fed from carries the band, not
// the flow (flowmetrics' flowgate_flow_* series are the per-tenant view). Outcomes use
// llm-d's names: Dispatched, RejectedCapacity (queue or byte budget full),
// RejectedOther (shutting down, whether queued or arriving, and not
// running), EvictedTTL (max wait), EvictedContextCancelled (the client left
// while queued). Requests refused on their body before queueing
// (too large, too slow, unreadable) are not flow-control outcomes and are
// not counted here.
// llmdReplaces are flowgate's families that say what llm-d's four say:
// with LLMDMetrics, /metrics leaves them out.
var llmdReplaces = map[string]bool{
	"flowgate_queue_depth":    true, // llm_d_epp_flow_control_queue_size
	"flowgate_saturation":     true, // llm_d_epp_flow_control_pool_saturation
	"flowgate_requests_total": true, // llm_d_epp_flow_control_requests_total
	"flowgate_wait_seconds":   true, // llm_d_epp_flow_control_request_queue_duration_seconds
}

// withoutFamilies gathers g less the families named in drop.
func withoutFamilies(g prometheus.Gatherer, drop map[string]bool) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := g.Gather()
		out := fams[:0]
		for _, f := range fams {
			if !drop[f.GetName()] {
				out = append(out, f)
			}
		}
		return out, err
	})
}

const (
	llmdNamespace = "llm_d_epp"
	llmdSubsystem = "flow_control"
	llmdFlow      = "default-flow"
)

type llmdMetrics struct {
	p        *Proxy
	prios    []string
	queue    *prometheus.Desc
	sat      *prometheus.Desc
	total    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newLLMDMetrics(p *Proxy) *llmdMetrics {
	m := &llmdMetrics{p: p}
	for _, b := range p.cfg.Bands {
		m.prios = append(m.prios, strconv.Itoa(b.Priority))
	}
	name := func(n string) string { return prometheus.BuildFQName(llmdNamespace, llmdSubsystem, n) }
	m.queue = prometheus.NewDesc(name("queue_size"), "Requests waiting in flow control, by flow and priority.", []string{"fairness_id", "priority"}, nil)
	m.sat = prometheus.NewDesc(name("pool_saturation"), "The pool's saturation as flow control reads it.", nil, nil)
	m.total = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: llmdNamespace, Subsystem: llmdSubsystem, Name: "requests_total",
		Help: "Requests that went through flow control, by outcome and priority."}, []string{"outcome", "priority"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: llmdNamespace, Subsystem: llmdSubsystem,
		Name: "request_queue_duration_seconds", Help: "Time requests spent in flow control, by flow, priority and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}, []string{"fairness_id", "priority", "outcome"})
	return m
}

// llmdOutcome names a flowhttp result as llm-d does; "" for a request that
// never reached flow control.
func llmdOutcome(res flowhttp.Result) string {
	switch err := res.Err; {
	case err == nil:
		return "Dispatched"
	case errors.Is(err, flowcontrol.ErrQueueFull), errors.Is(err, flowhttp.ErrBytesFull):
		return "RejectedCapacity"
	case errors.Is(err, flowcontrol.ErrExpired):
		return "EvictedTTL"
	case errors.Is(err, flowcontrol.ErrCancelled):
		return "EvictedContextCancelled"
	case errors.Is(err, flowcontrol.ErrNotRunning), errors.Is(err, flowcontrol.ErrClosed):
		return "RejectedOther"
	}
	return ""
}

func (m *llmdMetrics) observe(res flowhttp.Result) {
	o := llmdOutcome(res)
	if o == "" {
		return
	}
	prio := m.prios[res.Band]
	m.total.WithLabelValues(o, prio).Inc()
	m.duration.WithLabelValues(llmdFlow, prio, o).Observe(res.Waited.Seconds())
}

func (m *llmdMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.queue
	ch <- m.sat
	m.total.Describe(ch)
	m.duration.Describe(ch)
}

func (m *llmdMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.p.gw.Controller().Stats()
	for i, b := range st.Bands {
		ch <- prometheus.MustNewConstMetric(m.queue, prometheus.GaugeValue, float64(b.Queued), llmdFlow, m.prios[i])
	}
	ch <- prometheus.MustNewConstMetric(m.sat, prometheus.GaugeValue, m.p.gw.Saturation())
	m.total.Collect(ch)
	m.duration.Collect(ch)
}
