// Package flowmetrics exports flowcontrol's state as Prometheus metrics, so that flowcontrol itself does not depend on client_golang.
package flowmetrics

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
)

// StatsSource is what the collector reads at scrape time; *flowcontrol.Controller
// and *flowcontrol.Dispatcher[T] satisfy it.
type StatsSource interface {
	Stats() flowcontrol.Stats
}

// Outcome label values, one per way a Wait ends (see flowcontrol.Controller.Wait).
const (
	OutcomeDispatched = "dispatched"
	OutcomeCancelled  = "cancelled"
	OutcomeExpired    = "expired"
	OutcomeClosed     = "closed"
	OutcomeRejected   = "rejected" // queue full
)

// outcomes is the order of the outcome label values in the wait histogram.
var outcomes = [...]string{OutcomeDispatched, OutcomeCancelled, OutcomeExpired, OutcomeClosed, OutcomeRejected}

// DefaultBuckets are the wait-time histogram buckets in seconds: 1 ms to
// about 2 min, doubling, so that both an uncongested pass (a tick) and a
// sheddable request held back under overload land in a bucket of their own.
var DefaultBuckets = prometheus.ExponentialBuckets(0.001, 2, 18)

// Options configures New. The zero value is usable.
type Options struct {
	// Namespace prefixes every metric name. Default "flowgate".
	Namespace string
	// BandNames labels bands; band i gets BandNames[i], or its index when
	// the slice is shorter. Names must be unique.
	BandNames []string
	// Buckets of the wait-time histogram, in seconds. Default DefaultBuckets.
	Buckets []float64
	// ConstLabels are added to every metric.
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector over a controller's Stats snapshot,
// taken once per scrape, plus a wait-time histogram fed by ObserveWait (or
// by Collector.Wait). Metrics, with namespace "flowgate":
//
//	flowgate_queue_depth{band}                   gauge   requests waiting in the band
//	flowgate_requests_total{band,outcome}        counter outcomes: dispatched, cancelled, expired, closed, rejected
//	flowgate_saturation                          gauge   sanitised saturation read at the last tick
//	flowgate_band_ceiling{band}                  gauge   the band's ceiling at the last tick
//	flowgate_band_duty_cycle_ticks{band}         gauge   the band's Every: opens on 1 tick in Every; 0 = blocked
//	flowgate_ticks_total                         counter dispatcher ticks
//	flowgate_wait_seconds{band,outcome}          histogram time spent in Wait
//
// Counter values are the dispatcher's own cumulative counts, so they match
// Stats() exactly and survive a collector being re-created.
type Collector struct {
	src   StatsSource
	names []string // label per band index, grown on demand

	queueDepth *prometheus.Desc
	requests   *prometheus.Desc
	saturation *prometheus.Desc
	ceiling    *prometheus.Desc
	every      *prometheus.Desc
	ticks      *prometheus.Desc

	wait *prometheus.HistogramVec
	// observers[band][outcome], resolved at construction so that
	// ObserveWait neither allocates nor hashes labels.
	observers [][len(outcomes)]prometheus.Observer
}

// New returns a collector reading src. bands is the number of bands the
// histogram is prepared for (ObserveWait ignores bands outside [0, bands)).
func New(src StatsSource, bands int, opts Options) (*Collector, error) {
	if src == nil {
		return nil, errors.New("flowmetrics: nil StatsSource")
	}
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
		src:   src,
		names: names,
		queueDepth: prometheus.NewDesc(ns+"_queue_depth",
			"Requests waiting in the band's queue.", []string{"band"}, cl),
		requests: prometheus.NewDesc(ns+"_requests_total",
			"Requests that left the band's queue, by outcome (dispatched, cancelled, expired, closed) or were refused because it was full (rejected).",
			[]string{"band", "outcome"}, cl),
		saturation: prometheus.NewDesc(ns+"_saturation",
			"Backend pool saturation as read (and sanitised) at the last dispatcher tick: 0 idle, 1 full, above 1 overloaded.", nil, cl),
		ceiling: prometheus.NewDesc(ns+"_band_ceiling",
			"The band's ceiling at the last tick: the saturation at which it starts being throttled.", []string{"band"}, cl),
		every: prometheus.NewDesc(ns+"_band_duty_cycle_ticks",
			"The band's duty cycle at the last tick: it may dispatch on one tick in this many; 1 = every tick, 0 = blocked.", []string{"band"}, cl),
		ticks: prometheus.NewDesc(ns+"_ticks_total", "Dispatcher ticks.", nil, cl),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   ns,
			Name:        "wait_seconds",
			Help:        "Time a request spent in flow control before it was dispatched or ended otherwise, by band and outcome.",
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
	ch <- c.saturation
	ch <- c.ceiling
	ch <- c.every
	ch <- c.ticks
	c.wait.Describe(ch)
}

// Collect implements prometheus.Collector: one Stats snapshot per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	ch <- prometheus.MustNewConstMetric(c.saturation, prometheus.GaugeValue, st.Saturation)
	ch <- prometheus.MustNewConstMetric(c.ticks, prometheus.CounterValue, float64(st.Ticks))
	for i, b := range st.Bands {
		name := c.band(i)
		ch <- prometheus.MustNewConstMetric(c.queueDepth, prometheus.GaugeValue, float64(b.Queued), name)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(b.Dispatched), name, OutcomeDispatched)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(b.Cancelled), name, OutcomeCancelled)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(b.Expired), name, OutcomeExpired)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(b.Closed), name, OutcomeClosed)
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(b.Rejected), name, OutcomeRejected)
		ch <- prometheus.MustNewConstMetric(c.ceiling, prometheus.GaugeValue, b.Gate.Ceiling, name)
		ch <- prometheus.MustNewConstMetric(c.every, prometheus.GaugeValue, float64(b.Gate.Every), name)
	}
	c.wait.Collect(ch)
}

// Outcome returns the outcome label of a Wait's error: OutcomeDispatched for
// nil, and "" for an error that is no flow-control outcome (an unknown band).
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

func outcomeIndex(err error) int {
	switch Outcome(err) {
	case OutcomeDispatched:
		return 0
	case OutcomeCancelled:
		return 1
	case OutcomeExpired:
		return 2
	case OutcomeClosed:
		return 3
	case OutcomeRejected:
		return 4
	}
	return -1
}

// ObserveWait records that a Wait on band ended with err after d. Bands
// outside those given to New and errors that are no outcome (unknown band)
// are ignored. It does not allocate.
func (c *Collector) ObserveWait(band int, err error, d time.Duration) {
	o := outcomeIndex(err)
	if band < 0 || band >= len(c.observers) || o < 0 {
		return
	}
	c.observers[band][o].Observe(d.Seconds())
}

// Waiter is the blocking call Wait wraps; *flowcontrol.Controller satisfies it.
type Waiter interface {
	Wait(ctx context.Context, band int) (done func(), err error)
}

// Wait calls w.Wait and records its duration and outcome in the histogram.
// It is the observer hook for hosts: flowcontrol has none of its own, so the
// caller's clock (time.Now) measures the whole call.
func (c *Collector) Wait(ctx context.Context, w Waiter, band int) (done func(), err error) {
	start := time.Now()
	done, err = w.Wait(ctx, band)
	c.ObserveWait(band, err, time.Since(start))
	return done, err
}
