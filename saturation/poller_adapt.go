package saturation

import (
	"time"

	"go.uber.org/atomic"
)

// How the poller adapts its scrape timeout to what the machine sustains.
const (
	// TimeoutLatencyFactor: the effective scrape timeout is at least this
	// many times the median latency of the poller's recent scrapes. A
	// scrape that much slower than its peers is a pod failing, not a busy
	// gateway node; on a node where every scrape is slow, a fixed timeout
	// would fail every healthy pod.
	TimeoutLatencyFactor = 4
	// MaxTimeoutGrowth bounds the effective timeout at this many times
	// PollerConfig.Timeout, so that a pod that hangs is still found failed
	// within a bounded time, however slow the node.
	MaxTimeoutGrowth = 10
)

// latency tracks the median of the poller's scrape latencies (from taking
// a slot to the result) with a stochastic estimator: each sample above the
// estimate raises it by 1/16, each one below lowers it by 1/16, so it
// settles where half the samples lie on each side, in O(1) and without a
// window. A scrape that timed out counts with the time it was given (the
// timeout, above the median): a minority of hanging pods thus cannot raise
// the median, and so cannot lengthen the timeout that cuts them off; and
// since no sample exceeds the longest timeout, neither can the estimate
// (counting a timeout as "longer than anything" would let it grow without
// bound once most scrapes time out).
type latency struct {
	median atomic.Int64 // nanoseconds; 0 before the first sample
}

func (l *latency) observe(d time.Duration) {
	for {
		m := l.median.Load()
		var next int64
		switch {
		case m == 0:
			next = max(int64(d), 1)
		case int64(d) > m:
			next = m + m/16 + 1
		default:
			next = max(m-m/16, 1)
		}
		if l.median.CompareAndSwap(m, next) {
			return
		}
	}
}

// timeout is the effective scrape timeout: TimeoutLatencyFactor times the
// median latency, within [base, MaxTimeoutGrowth·base].
func (l *latency) timeout(base time.Duration) time.Duration {
	t := TimeoutLatencyFactor * time.Duration(l.median.Load())
	return min(max(t, base), MaxTimeoutGrowth*base)
}

// PollerStats is what the poller achieves, for logs and metrics (see
// Poller.Stats).
type PollerStats struct {
	// Pods is the number of endpoints.
	Pods int
	// Usable is the number of pods that counted on their merits at their
	// last scoring (PodReading.Usable; kept as it was when Run returned,
	// while Saturation reads 1).
	Usable int
	// Interval is the mean, over the pods scraped at least twice, of the
	// time between the starts of a pod's last two scrapes
	// (PodReading.Interval): the per-pod cadence the poller achieves.
	// Under Run it is PollerConfig.Interval when the poller keeps up and
	// longer when the pool is more than the machine can scrape every
	// Interval; zero before any pod's second scrape.
	Interval time.Duration
	// MaxInterval is the longest PodReading.Interval.
	MaxInterval time.Duration
	// Latency is the median scrape latency (from taking a concurrency
	// slot to the result) of the recent scrapes, on the runtime's clock
	// like the timeout it sets (not PollerConfig.Now); zero before the
	// first.
	Latency time.Duration
	// Timeout is the effective scrape timeout now: PollerConfig.Timeout,
	// or TimeoutLatencyFactor·Latency when that is longer, at most
	// MaxTimeoutGrowth·PollerConfig.Timeout.
	Timeout time.Duration
	// Round is the length of the last Scrape round (zero if none).
	Round time.Duration
}

// Stats reports the pool's usable pods and the cadence, latency and timeout
// the poller achieves. It takes the poller's lock and costs O(pods).
func (p *Poller) Stats() PollerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PollerStats{Pods: len(p.order), Usable: p.usable, Round: p.lastRound,
		Latency: time.Duration(p.lat.median.Load()), Timeout: p.lat.timeout(p.cfg.Timeout)}
	var sum time.Duration
	k := 0
	for _, pd := range p.order {
		if pd.Interval > 0 {
			sum += pd.Interval
			k++
			s.MaxInterval = max(s.MaxInterval, pd.Interval)
		}
	}
	if k > 0 {
		s.Interval = sum / time.Duration(k)
	}
	return s
}
