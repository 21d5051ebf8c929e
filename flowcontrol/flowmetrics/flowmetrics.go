package flowmetrics

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
)

// StatsSource is what the collector reads at scrape time; *flowcontrol.Controller
// and *flowcontrol.Dispatcher[T] satisfy it. A source that also has a
// BandConfigs or Bands method returning []flowcontrol.BandConfig has its band
// names checked against Options.BandNames by Bind.
type StatsSource interface {
	Stats() flowcontrol.Stats
}

// Outcome label values, one per way a Wait ends (see flowcontrol.Controller.Wait).
const (
	OutcomeDispatched = "dispatched"
	OutcomeCancelled  = "cancelled"
	OutcomeExpired    = "expired"
	OutcomeClosed     = "closed"
	OutcomeRejected   = "rejected" // queue full: a refusal, never queued
)

// outcomes is the order of the outcome label values in the wait histogram:
// the outcomes of a Wait that entered the queue.
var outcomes = [...]string{OutcomeDispatched, OutcomeCancelled, OutcomeExpired, OutcomeClosed}

// Refusal reason label values of flowgate_refused_total: why a call never
// entered the queue.
const (
	ReasonQueueFull  = "queue_full"
	ReasonClosed     = "closed"
	ReasonCancelled  = "cancelled"
	ReasonNotRunning = "not_running"
	ReasonShed       = "shed" // refused by the controller's Admitter
	// ReasonFlowFull: the request's flow held its band's FlowCapacity
	// (flowcontrol.ErrFlowFull). Not part of queue_full.
	ReasonFlowFull = "flow_full"
)

// DefaultMaxFlowLabels is Options.MaxFlowLabels' default: the most distinct
// fairness_id label values the collector reports across all bands; further
// flows are summed under OtherFlow.
const DefaultMaxFlowLabels = 1000

// OtherFlow is the fairness_id label of the flows beyond MaxFlowLabels.
const OtherFlow = "other"

// DefaultBuckets are the wait-time histogram buckets in seconds: 1 ms to
// about 2 min, doubling, so that both an uncongested pass (a tick) and a
// sheddable request held back under overload land in a bucket of their own.
var DefaultBuckets = prometheus.ExponentialBuckets(0.001, 2, 18)

// Options configures New. The zero value is usable.
type Options struct {
	// Namespace prefixes every metric name. Empty means "flowgate".
	Namespace string
	// BandNames labels bands; band i gets BandNames[i], or its index when
	// the slice is shorter (nil labels every band by its index). Names must
	// be unique, so that two bands never share a series.
	BandNames []string
	// Buckets are the wait-time histogram's bucket bounds, in seconds.
	// Nil means DefaultBuckets.
	Buckets []float64
	// ConstLabels are added to every metric. Nil adds none.
	ConstLabels prometheus.Labels
	// MaxFlowLabels caps the fairness_id label values of the per-flow
	// metrics (0 = DefaultMaxFlowLabels): flow ids come from request
	// headers, so their number is the client's to choose, not the
	// operator's.
	MaxFlowLabels int
}

// FlowSource is a StatsSource that also reports its flows;
// *flowcontrol.Controller and *flowcontrol.Dispatcher[T] satisfy it. A
// bound source that is a FlowSource gets the per-flow metrics.
type FlowSource interface {
	Flows(band int) []flowcontrol.FlowStats
}

// Collector is a prometheus.Collector over a controller's Stats snapshot,
// taken once per scrape, plus a wait-time histogram fed by OnOutcome (the
// controller's outcome hook). Metrics, with namespace "flowgate":
//
//	flowgate_queue_depth{band}                   gauge   requests waiting in the band
//	flowgate_requests_total{band,outcome}        counter queued requests by outcome: dispatched, cancelled, expired, closed
//	flowgate_requeued_total{band}                counter requests put back at the head of the band after an eviction (each then counted again by outcome)
//	flowgate_refused_total{band,reason}          counter calls refused before the queue: queue_full, closed, cancelled, not_running, shed
//	flowgate_unknown_band_total                  counter calls refused for naming no band
//	flowgate_saturation                          gauge   sanitised saturation read at the last tick
//	flowgate_band_ceiling{band}                  gauge   the band's ceiling at the last tick
//	flowgate_band_duty_cycle_ticks{band}         gauge   the band's Every: opens on 1 tick in Every; 0 = blocked
//	flowgate_ticks_total                         counter dispatcher ticks
//	flowgate_wait_seconds{band,outcome}          histogram time queued requests waited, by outcome
//	flowgate_flow_queue_depth{band,fairness_id}  gauge   requests of the flow waiting in the band (bands with fairness)
//	flowgate_flow_dispatched_total{band,fairness_id} counter requests of the flow released
//
// The per-flow metrics cover the flows the band knows (seen within its
// FlowIdle). Their fairness_id label takes at most MaxFlowLabels values: a
// flow keeps its label for as long as it is reported at consecutive
// scrapes; flows beyond the cap are summed under fairness_id="other"
// (whose counter may go down when a flow leaves it: read it as a scale,
// not a rate). A forgotten flow's counter restarts from 0 when it comes back.
//
// Counter values are the dispatcher's own cumulative counts, so they match
// Stats() exactly and survive a collector being re-created. The histogram
// counts the same queued outcomes as flowgate_requests_total, one
// observation per OnOutcome call, so at rest wait_seconds_count{band,outcome}
// equals requests_total{band,outcome} (as long as the collector was the
// controller's hook from the start). Refusals never waited: they are counted,
// not timed.
//
// Wiring: the collector exists before the controller (its OnOutcome goes in
// the controller's config) and is bound to it after:
//
//	col, _ := flowmetrics.New(2, flowmetrics.Options{BandNames: []string{"critical", "sheddable"}})
//	c, _ := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: cfg, OnOutcome: col.OnOutcome})
//	if err := col.Bind(c); err != nil { ... }
//	registry.MustRegister(col)
type Collector struct {
	src   atomic.Pointer[StatsSource] // set once by Bind
	names []string                    // label per band index

	queueDepth *prometheus.Desc
	requests   *prometheus.Desc
	requeued   *prometheus.Desc
	refused    *prometheus.Desc
	unknown    *prometheus.Desc
	saturation *prometheus.Desc
	ceiling    *prometheus.Desc
	every      *prometheus.Desc
	ticks      *prometheus.Desc

	flowDepth      *prometheus.Desc
	flowDispatched *prometheus.Desc
	maxFlows       int
	flowMu         sync.Mutex       // serialises the label assignment of concurrent scrapes
	flowLabels     map[flowKey]bool // flows holding a label since the last scrape

	wait *prometheus.HistogramVec
	// observers[band][outcome], resolved at construction so that
	// OnOutcome neither allocates nor hashes labels.
	observers [][len(outcomes)]prometheus.Observer
}

// New returns a collector for a controller of the given number of bands;
// Bind it to the controller (or dispatcher) whose Stats it reports.
func New(bands int, opts Options) (*Collector, error) {
	if bands < 1 || bands > flowcontrol.MaxBands {
		return nil, fmt.Errorf("flowmetrics: bands must be in 1..%d, got %d", flowcontrol.MaxBands, bands)
	}
	ns := opts.Namespace
	if ns == "" {
		ns = "flowgate"
	}
	buckets := opts.Buckets
	if buckets == nil {
		buckets = DefaultBuckets
	}
	// client_golang panics on these when the histogram is first used;
	// refuse them here instead.
	for i, b := range buckets {
		if b != b || (i > 0 && !(b > buckets[i-1])) {
			return nil, fmt.Errorf("flowmetrics: Buckets must be strictly increasing numbers, got %v", buckets)
		}
	}
	if opts.MaxFlowLabels < 0 {
		return nil, fmt.Errorf("flowmetrics: MaxFlowLabels must be ≥ 0 (0 = default %d), got %d", DefaultMaxFlowLabels, opts.MaxFlowLabels)
	}
	if len(opts.BandNames) > bands {
		return nil, fmt.Errorf("flowmetrics: BandNames has %d names for %d bands", len(opts.BandNames), bands)
	}
	names := make([]string, bands)
	seen := map[string]bool{}
	for i := range names {
		names[i] = strconv.Itoa(i)
		if i < len(opts.BandNames) && opts.BandNames[i] != "" {
			names[i] = opts.BandNames[i]
		}
		if !utf8.ValidString(names[i]) {
			return nil, fmt.Errorf("flowmetrics: BandNames[%d] %q is not valid UTF-8", i, names[i])
		}
		if seen[names[i]] {
			return nil, fmt.Errorf("flowmetrics: BandNames: duplicate band label %q", names[i])
		}
		seen[names[i]] = true
	}
	cl := opts.ConstLabels
	c := &Collector{
		names: names,
		queueDepth: prometheus.NewDesc(ns+"_queue_depth",
			"Requests waiting in the band's queue.", []string{"band"}, cl),
		requests: prometheus.NewDesc(ns+"_requests_total",
			"Requests that entered the band's queue and left it, by outcome: dispatched, cancelled, expired, closed.",
			[]string{"band", "outcome"}, cl),
		requeued: prometheus.NewDesc(ns+"_requeued_total",
			"Requests put back at the head of the band after an eviction (Requeue); each is counted again in requests_total when it leaves.",
			[]string{"band"}, cl),
		refused: prometheus.NewDesc(ns+"_refused_total",
			"Calls refused before the band's queue, by reason: queue_full, closed, cancelled (context already done), not_running, shed (refused by the admitter).",
			[]string{"band", "reason"}, cl),
		unknown: prometheus.NewDesc(ns+"_unknown_band_total",
			"Calls refused because they named no band.", nil, cl),
		saturation: prometheus.NewDesc(ns+"_saturation",
			"Backend pool saturation as read (and sanitised) at the last dispatcher tick: 0 idle, 1 full, above 1 overloaded.", nil, cl),
		ceiling: prometheus.NewDesc(ns+"_band_ceiling",
			"The band's ceiling at the last tick: the saturation at which it starts being throttled.", []string{"band"}, cl),
		every: prometheus.NewDesc(ns+"_band_duty_cycle_ticks",
			"The band's duty cycle at the last tick: it may dispatch on one tick in this many; 1 = every tick, 0 = blocked.", []string{"band"}, cl),
		ticks: prometheus.NewDesc(ns+"_ticks_total", "Dispatcher ticks.", nil, cl),
		flowDepth: prometheus.NewDesc(ns+"_flow_queue_depth",
			"Requests of the flow (fairness id) waiting in the band's queue; flows beyond the label cap are summed as other.",
			[]string{"band", "fairness_id"}, cl),
		flowDispatched: prometheus.NewDesc(ns+"_flow_dispatched_total",
			"Requests of the flow (fairness id) released from the band; flows beyond the label cap are summed as other.",
			[]string{"band", "fairness_id"}, cl),
		maxFlows:   opts.MaxFlowLabels,
		flowLabels: map[flowKey]bool{},
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   ns,
			Name:        "wait_seconds",
			Help:        "Time a request spent in the band's queue before it was dispatched or ended otherwise, by band and outcome.",
			Buckets:     buckets,
			ConstLabels: cl,
		}, []string{"band", "outcome"}),
	}
	// An invalid namespace or constant label (bad name, bad UTF-8, a clash
	// with the band or outcome label) makes a descriptor invalid: report it
	// now rather than at the host's registration (MustRegister panics).
	if err := prometheus.NewPedanticRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("flowmetrics: Namespace or ConstLabels: %w", err)
	}
	c.observers = make([][len(outcomes)]prometheus.Observer, bands)
	for b := range bands {
		for o, name := range outcomes {
			c.observers[b][o] = c.wait.WithLabelValues(names[b], name)
		}
	}
	return c, nil
}

// Bind sets the source whose Stats the collector reports at each scrape.
// The source must have exactly the collector's number of bands, and, if it
// tells its band names (a Bands or BandConfigs method, as Controller and
// Dispatcher have) and Options.BandNames were given, the same names. Bind
// may be called once; until then a scrape reports only the histogram.
func (c *Collector) Bind(src StatsSource) error {
	if src == nil {
		return errors.New("flowmetrics: Bind: nil StatsSource")
	}
	if n := len(src.Stats().Bands); n != len(c.names) {
		return fmt.Errorf("flowmetrics: Bind: the collector was made for %d bands, the source has %d", len(c.names), n)
	}
	var configs []flowcontrol.BandConfig
	switch s := src.(type) {
	case interface {
		Bands() []flowcontrol.BandConfig
	}:
		configs = s.Bands()
	case interface {
		BandConfigs() []flowcontrol.BandConfig
	}:
		configs = s.BandConfigs()
	}
	for i, bc := range configs {
		if c.names[i] != strconv.Itoa(i) && c.names[i] != bc.Name {
			return fmt.Errorf("flowmetrics: Bind: BandNames[%d] is %q, the source's band %d is named %q", i, c.names[i], i, bc.Name)
		}
	}
	if !c.src.CompareAndSwap(nil, &src) {
		return errors.New("flowmetrics: Bind: already bound")
	}
	return nil
}

// band returns the label of band i; bands beyond those given to New (a
// source with more bands than announced) are labelled by their index.
func (c *Collector) band(i int) string {
	if i < len(c.names) {
		return c.names[i]
	}
	return strconv.Itoa(i)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queueDepth
	ch <- c.requests
	ch <- c.requeued
	ch <- c.refused
	ch <- c.unknown
	ch <- c.saturation
	ch <- c.ceiling
	ch <- c.every
	ch <- c.ticks
	ch <- c.flowDepth
	ch <- c.flowDispatched
	c.wait.Describe(ch)
}

// Collect implements prometheus.Collector: one Stats snapshot per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	defer c.wait.Collect(ch)
	p := c.src.Load()
	if p == nil {
		return
	}
	st := (*p).Stats()
	ch <- prometheus.MustNewConstMetric(c.saturation, prometheus.GaugeValue, st.Saturation)
	ch <- prometheus.MustNewConstMetric(c.ticks, prometheus.CounterValue, float64(st.Ticks))
	ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.CounterValue, float64(st.UnknownBand))
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for i, b := range st.Bands {
		name := c.band(i)
		ch <- prometheus.MustNewConstMetric(c.queueDepth, prometheus.GaugeValue, float64(b.Queued), name)
		counter(c.requests, b.Dispatched, name, OutcomeDispatched)
		counter(c.requests, b.Cancelled, name, OutcomeCancelled)
		counter(c.requests, b.Expired, name, OutcomeExpired)
		counter(c.requests, b.Closed, name, OutcomeClosed)
		counter(c.requeued, b.Requeued, name)
		counter(c.refused, b.Rejected, name, ReasonQueueFull)
		counter(c.refused, b.Refused.Closed, name, ReasonClosed)
		counter(c.refused, b.Refused.Cancelled, name, ReasonCancelled)
		counter(c.refused, b.Refused.NotRunning, name, ReasonNotRunning)
		counter(c.refused, b.Refused.Shed, name, ReasonShed)
		counter(c.refused, b.FlowFull, name, ReasonFlowFull)
		ch <- prometheus.MustNewConstMetric(c.ceiling, prometheus.GaugeValue, b.Gate.Ceiling, name)
		ch <- prometheus.MustNewConstMetric(c.every, prometheus.GaugeValue, float64(b.Gate.Every), name)
	}
	if fsrc, ok := (*p).(FlowSource); ok {
		c.collectFlows(ch, fsrc, len(st.Bands))
	}
}

// flowKey is a flow of a band.
type flowKey struct {
	band int
	id   string
}

// collectFlows reports the per-flow metrics, capping the fairness_id
// values: flows that held a label at the last scrape keep it, new flows
// take the free ones, the rest are summed under OtherFlow.
func (c *Collector) collectFlows(ch chan<- prometheus.Metric, src FlowSource, bands int) {
	limit := c.maxFlows
	if limit == 0 {
		limit = DefaultMaxFlowLabels
	}
	snap := make([][]flowcontrol.FlowStats, bands)
	for b := range bands {
		snap[b] = src.Flows(b)
	}
	c.flowMu.Lock()
	defer c.flowMu.Unlock()
	next := make(map[flowKey]bool, len(c.flowLabels))
	for b, fs := range snap {
		for _, f := range fs {
			if k := (flowKey{b, f.Flow}); c.flowLabels[k] {
				next[k] = true
			}
		}
	}
	for b, fs := range snap {
		name := c.band(b)
		var otherDepth, otherDispatched float64
		other := false
		for _, f := range fs {
			k := flowKey{b, f.Flow}
			// Label values must be valid UTF-8 (MustNewConstMetric
			// panics otherwise) and must not clash with OtherFlow;
			// ids come from request headers, so such ids go to other.
			labelable := f.Flow != OtherFlow && utf8.ValidString(f.Flow)
			if labelable && !next[k] && len(next) < limit {
				next[k] = true
			}
			if !labelable || !next[k] {
				other = true
				otherDepth += float64(f.Queued)
				otherDispatched += float64(f.Dispatched)
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.flowDepth, prometheus.GaugeValue, float64(f.Queued), name, f.Flow)
			ch <- prometheus.MustNewConstMetric(c.flowDispatched, prometheus.CounterValue, float64(f.Dispatched), name, f.Flow)
		}
		if other {
			ch <- prometheus.MustNewConstMetric(c.flowDepth, prometheus.GaugeValue, otherDepth, name, OtherFlow)
			ch <- prometheus.MustNewConstMetric(c.flowDispatched, prometheus.CounterValue, otherDispatched, name, OtherFlow)
		}
	}
	c.flowLabels = next
}

// Outcome returns the outcome label of a Wait's error, for a host's own
// logs: OutcomeDispatched for nil, OutcomeRejected for a full queue, and ""
// for an error that is no flow-control outcome (an unknown band, not
// running).
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeDispatched
	case errors.Is(err, flowcontrol.ErrCancelled):
		return OutcomeCancelled
	case errors.Is(err, flowcontrol.ErrExpired):
		return OutcomeExpired
	case errors.Is(err, flowcontrol.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, flowcontrol.ErrQueueFull):
		return OutcomeRejected
	}
	return ""
}

// queuedIndex is the histogram index of a queued Wait's outcome, or -1.
func queuedIndex(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flowcontrol.ErrCancelled):
		return 1
	case errors.Is(err, flowcontrol.ErrExpired):
		return 2
	case errors.Is(err, flowcontrol.ErrClosed):
		return 3
	}
	return -1
}

// OnOutcome records that a queued Wait on band ended with outcome after
// waiting waited. It has the signature of flowcontrol.ControllerConfig's
// OnOutcome, which is where it belongs. Bands outside those given to New
// and errors that are no queued outcome are ignored. It does not allocate.
func (c *Collector) OnOutcome(band int, outcome error, waited time.Duration) {
	o := queuedIndex(outcome)
	if band < 0 || band >= len(c.observers) || o < 0 {
		return
	}
	c.observers[band][o].Observe(waited.Seconds())
}
