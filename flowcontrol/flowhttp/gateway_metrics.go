package flowhttp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

// gatewayCollector is Gateway.Collector: flowmetrics' collector plus what
// only the gateway knows.
type gatewayCollector struct {
	g        *Gateway
	memory   *prometheus.Desc
	gap      *prometheus.Desc
	score    *prometheus.Desc
	waiting  *prometheus.Desc
	kv       *prometheus.Desc
	inflight *prometheus.Desc
	usable   *prometheus.Desc
	interval *prometheus.Desc // per endpoint
	pace     *prometheus.Desc // the pool's mean
	timeout  *prometheus.Desc
}

func newGatewayCollector(g *Gateway, o flowmetrics.Options) *gatewayCollector {
	ns := o.Namespace
	if ns == "" {
		ns = "flowgate"
	}
	name := func(n string) string { return prometheus.BuildFQName(ns, "", n) }
	ep := []string{"endpoint"}
	return &gatewayCollector{
		g: g,
		memory: prometheus.NewDesc(name("body_memory_bytes"),
			"Bytes of buffers held for gated request bodies being read, waiting or served (bounded by Options.MaxBodyMemory).", nil, o.ConstLabels),
		gap: prometheus.NewDesc(name("released_unforwarded"),
			"Requests the controller released that the host has not yet forwarded (charged by the in-flight credit).", nil, o.ConstLabels),
		score: prometheus.NewDesc(name("endpoint_saturation"),
			"The endpoint's saturation score at the poller's last rescore (1: saturated, stale or unreachable).", ep, o.ConstLabels),
		waiting: prometheus.NewDesc(name("endpoint_requests_waiting"),
			"The endpoint's waiting requests at its last good scrape.", ep, o.ConstLabels),
		kv: prometheus.NewDesc(name("endpoint_kv_cache_usage"),
			"The endpoint's KV-cache usage at its last good scrape.", ep, o.ConstLabels),
		inflight: prometheus.NewDesc(name("endpoint_inflight"),
			"Requests this gateway forwarded to the endpoint and not finished.", ep, o.ConstLabels),
		usable: prometheus.NewDesc(name("endpoints_usable"),
			"Endpoints whose last reading the poller could use (fresh and valid).", nil, o.ConstLabels),
		interval: prometheus.NewDesc(name("endpoint_scrape_interval_seconds"),
			"Time between the starts of the endpoint's last two scrapes: the cadence the poller achieved for it.", ep, o.ConstLabels),
		pace: prometheus.NewDesc(name("poller_scrape_interval_seconds"),
			"Mean over the endpoints of the time between the starts of their last two scrapes (the poller's Interval when it keeps up, longer when it cannot).", nil, o.ConstLabels),
		timeout: prometheus.NewDesc(name("poller_scrape_timeout_seconds"),
			"The poller's effective scrape timeout: its Timeout, or a multiple of the median scrape latency when that is longer.", nil, o.ConstLabels),
	}
}

func (c *gatewayCollector) Describe(ch chan<- *prometheus.Desc) {
	c.g.col.Describe(ch)
	for _, d := range []*prometheus.Desc{c.memory, c.gap, c.score, c.waiting, c.kv, c.inflight, c.usable,
		c.interval, c.pace, c.timeout} {
		ch <- d
	}
}

func (c *gatewayCollector) Collect(ch chan<- prometheus.Metric) {
	c.g.col.Collect(ch)
	ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(c.g.intake.mem.inUse()))
	gap := c.g.ctrl.InFlight() - c.g.intake.forwarded.Load()
	ch <- prometheus.MustNewConstMetric(c.gap, prometheus.GaugeValue, float64(max(gap, 0)))
	usable := 0
	for _, r := range c.g.poller.Readings() {
		i, ok := c.g.endpoints.byMetric[r.Endpoint]
		if !ok {
			continue
		}
		base := c.g.endpoints.bases[i]
		if r.Usable {
			usable++
		}
		ch <- prometheus.MustNewConstMetric(c.score, prometheus.GaugeValue, r.Score, base)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, r.Waiting, base)
		ch <- prometheus.MustNewConstMetric(c.kv, prometheus.GaugeValue, r.KVUsage, base)
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(c.g.poller.InFlight(r.Endpoint)), base)
		ch <- prometheus.MustNewConstMetric(c.interval, prometheus.GaugeValue, r.Interval.Seconds(), base)
	}
	ch <- prometheus.MustNewConstMetric(c.usable, prometheus.GaugeValue, float64(usable))
	st := c.g.poller.Stats()
	ch <- prometheus.MustNewConstMetric(c.pace, prometheus.GaugeValue, st.Interval.Seconds())
	ch <- prometheus.MustNewConstMetric(c.timeout, prometheus.GaugeValue, st.Timeout.Seconds())
}
