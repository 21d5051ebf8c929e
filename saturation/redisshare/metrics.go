package redisshare

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a Prometheus collector over this view's state, labelled
// replica=<ReplicaID>. Register it yourself (reg.MustRegister(v.Collector()));
// each call returns a new collector over the same counters. Metrics:
//
//	flowgate_shared_inflight_up                  1 while the others' counts are served, 0 on fallback
//	flowgate_shared_inflight_peers               other live replicas seen by the last good sync
//	flowgate_shared_inflight_syncs_total         sync cycles run
//	flowgate_shared_inflight_sync_errors_total   sync cycles that failed (timeouts, connection errors)
//	flowgate_shared_inflight_bad_fields_total    counts read from Redis that did not parse and were ignored
//	flowgate_shared_inflight_underflows_total    decrements clamped at 0
//
// Collecting reads atomics only; it never touches Redis.
func (s *InFlight) Collector() prometheus.Collector {
	l := prometheus.Labels{"replica": s.id}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("flowgate_shared_inflight_"+name, help, nil, l)
	}
	return &collector{
		s:          s,
		up:         d("up", "1 while this replica serves the other replicas' in-flight counts from Redis, 0 while it falls back to its own."),
		peers:      d("peers", "Other live gateway replicas seen by the last good sync."),
		syncs:      d("syncs_total", "Sync cycles run (publish own counts, fetch the others')."),
		errors:     d("sync_errors_total", "Sync cycles that failed (Redis timeout, connection error)."),
		badFields:  d("bad_fields_total", "Counts read from Redis that did not parse and were ignored."),
		underflows: d("underflows_total", "Decrements that found the count at 0 and were clamped."),
	}
}

type collector struct {
	s                                               *InFlight
	up, peers, syncs, errors, badFields, underflows *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.peers, c.syncs, c.errors, c.badFields, c.underflows} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if c.s.State() == Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(c.s.Peers()))
	ch <- prometheus.MustNewConstMetric(c.syncs, prometheus.CounterValue, float64(c.s.syncs.Load()))
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.s.syncErrors.Load()))
	ch <- prometheus.MustNewConstMetric(c.badFields, prometheus.CounterValue, float64(c.s.badFields.Load()))
	ch <- prometheus.MustNewConstMetric(c.underflows, prometheus.CounterValue, float64(c.s.underflows.Load()))
}
