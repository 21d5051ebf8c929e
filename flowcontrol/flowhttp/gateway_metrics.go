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
	// Eviction's, described only with eviction on.
	bandNames   []string
	evictions   *prometheus.Desc
	immune      *prometheus.Desc
	wasted      *prometheus.Desc
	resent      *prometheus.Desc
	tracked     *prometheus.Desc
	evictingNow *prometheus.Desc
}

func newGatewayCollector(g *Gateway, o flowmetrics.Options) *gatewayCollector {
	ns := o.Namespace
	if ns == "" {
		ns = "flowgate"
	}
	name := func(n string) string { return prometheus.BuildFQName(ns, "", n) }
	ep := []string{"endpoint"}
	bd := []string{"band"}
	c := &gatewayCollector{
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
	if g.intake.evict != nil {
		c.bandNames = o.BandNames
		c.evictions = prometheus.NewDesc(name("evictions_total"),
			"Forwarded requests the evictor took back, by their band and what became of them: requeued (nothing had reached the client; it waited again), ended (its response had started: ended with an error), declined (it had finished, or started with started responses protected: nothing cut).",
			[]string{"band", "outcome"}, o.ConstLabels)
		c.immune = prometheus.NewDesc(name("eviction_immune_total"),
			"Requests evicted the most times allowed (EvictionConfig.MaxEvictions), which no further eviction takes.", bd, o.ConstLabels)
		c.wasted = prometheus.NewDesc(name("eviction_wasted_seconds_total"),
			"Time evicted requests had run at their endpoint, from Forward to their eviction: the servers' work thrown away.", bd, o.ConstLabels)
		c.resent = prometheus.NewDesc(name("eviction_resent_bytes_total"),
			"Request body bytes of re-queued victims, which an endpoint reads and prefills again.", bd, o.ConstLabels)
		c.tracked = prometheus.NewDesc(name("eviction_tracked"),
			"Forwarded requests the evictor tracks (forwarded and not finished).", nil, o.ConstLabels)
		c.evictingNow = prometheus.NewDesc(name("evictions_pending"),
			"Evictions whose request has not yet ended at its server (at most one per endpoint).", nil, o.ConstLabels)
	}
	return c
}

func (c *gatewayCollector) Describe(ch chan<- *prometheus.Desc) {
	c.g.col.Describe(ch)
	for _, d := range []*prometheus.Desc{c.memory, c.gap, c.score, c.waiting, c.kv, c.inflight, c.usable,
		c.interval, c.pace, c.timeout} {
		ch <- d
	}
	if c.evictions != nil {
		for _, d := range []*prometheus.Desc{c.evictions, c.immune, c.wasted, c.resent, c.tracked, c.evictingNow} {
			ch <- d
		}
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
	if ev, ok := c.g.Evictions(); ok {
		for i, name := range c.bandNames {
			for o, n := range [evictOutcomes][]uint64{ev.Requeued, ev.Ended, ev.Declined} {
				ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(n[i]), name, evictOutcomeNames[o])
			}
			ch <- prometheus.MustNewConstMetric(c.immune, prometheus.CounterValue, float64(ev.Immune[i]), name)
			ch <- prometheus.MustNewConstMetric(c.wasted, prometheus.CounterValue, ev.Wasted[i].Seconds(), name)
			ch <- prometheus.MustNewConstMetric(c.resent, prometheus.CounterValue, float64(ev.ResentBytes[i]), name)
		}
		ch <- prometheus.MustNewConstMetric(c.tracked, prometheus.GaugeValue, float64(ev.Tracked))
		ch <- prometheus.MustNewConstMetric(c.evictingNow, prometheus.GaugeValue, float64(ev.Evicting))
	}
}
