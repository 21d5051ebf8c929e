package redisshare

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a Prometheus collector over this view's state, labelled
// replica=<ReplicaID>. Register it yourself (reg.MustRegister(v.Collector()));
// each call returns a new collector over the same counters. Metrics:
//
//	flowgate_shared_inflight_up                      1 while the others' counts are served, 0 on fallback
//	flowgate_shared_inflight_peers                   other live replicas seen by the last good sync
//	flowgate_shared_inflight_syncs_total             sync cycles run
//	flowgate_shared_inflight_sync_errors_total       sync cycles that failed (timeouts, connection errors)
//	flowgate_shared_inflight_sync_timeouts_total     ... of which on their deadline (the timeout)
//	flowgate_shared_inflight_sync_timeout_seconds    the configured per-sync timeout (Options.Timeout)
//	flowgate_shared_inflight_sync_duration_seconds   histogram of sync durations, failed ones included
//	flowgate_shared_inflight_duplicate_id            1 while another live instance publishes under this id
//	flowgate_shared_inflight_duplicate_id_syncs_total syncs that found that
//	flowgate_shared_inflight_bad_fields_total        counts read from Redis that did not parse and were ignored
//	flowgate_shared_inflight_underflows_total        decrements clamped at 0
//	flowgate_shared_inflight_refused_total{reason}   what syncs did not take from Redis: "count" (clamped
//	                                                 to MaxPeerCount), "name" (past MaxEndpoints), "hash" (a
//	                                                 peer's hash of more fields than that), "peer" (past MaxPeers)
//
// sync_errors_total / syncs_total is the failure rate; the duration
// histogram against sync_timeout_seconds shows how close the successful
// ones come to the timeout. Collecting reads atomics only; it never
// touches Redis.
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
		timeouts:   d("sync_timeouts_total", "Sync cycles that failed on their deadline (the sync timeout)."),
		timeout:    d("sync_timeout_seconds", "The per-sync timeout while syncs succeed (Options.Timeout)."),
		duration:   d("sync_duration_seconds", "Duration of sync cycles, failed ones included."),
		dup:        d("duplicate_id", "1 while another live instance publishes under this replica's id (both overwrite one hash: the pool undercounts)."),
		dupSyncs:   d("duplicate_id_syncs_total", "Sync cycles that found another live instance publishing under this replica's id."),
		badFields:  d("bad_fields_total", "Counts read from Redis that did not parse and were ignored."),
		underflows: d("underflows_total", "Decrements that found the count at 0 and were clamped."),
		refused: prometheus.NewDesc("flowgate_shared_inflight_refused_total",
			"What syncs did not take from Redis, by reason: count (a peer's count clamped to MaxPeerCount), name (an endpoint name past MaxEndpoints), hash (a peer's hash of more fields than MaxEndpoints, not read), peer (a replica past MaxPeers, not read).",
			[]string{"reason"}, l),
	}
}

// The reasons of flowgate_shared_inflight_refused_total, indexes of
// InFlight.refused.
const (
	refusedCount = iota
	refusedName
	refusedHash
	refusedPeer
)

var refusedReasons = [...]string{"count", "name", "hash", "peer"}

type collector struct {
	s                                              *InFlight
	up, peers, syncs, errors, timeouts, timeout    *prometheus.Desc
	duration, dup, dupSyncs, badFields, underflows *prometheus.Desc
	refused                                        *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.peers, c.syncs, c.errors, c.timeouts, c.timeout,
		c.duration, c.dup, c.dupSyncs, c.badFields, c.underflows, c.refused} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, b2f(c.s.State() == Up))
	ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(c.s.Peers()))
	counter(c.syncs, c.s.syncs.Load())
	counter(c.errors, c.s.syncErrors.Load())
	counter(c.timeouts, c.s.syncTimeouts.Load())
	ch <- prometheus.MustNewConstMetric(c.timeout, prometheus.GaugeValue, c.s.timeout.Seconds())
	buckets, n, sum := c.s.syncSeconds.snapshot()
	ch <- prometheus.MustNewConstHistogram(c.duration, n, sum, buckets)
	ch <- prometheus.MustNewConstMetric(c.dup, prometheus.GaugeValue, b2f(c.s.dup.Load()))
	counter(c.dupSyncs, c.s.dupSyncs.Load())
	counter(c.badFields, c.s.badFields.Load())
	counter(c.underflows, c.s.underflows.Load())
	for i, r := range refusedReasons {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(c.s.refused[i].Load()), r)
	}
}

// Refused returns how many counts, names, hashes and peers syncs did not
// take from Redis as they were (see Options.MaxPeerCount, MaxEndpoints,
// MaxPeers), by reason: "count", "name", "hash", "peer".
func (s *InFlight) Refused(reason string) int64 {
	for i, r := range refusedReasons {
		if r == reason {
			return s.refused[i].Load()
		}
	}
	return 0
}
