package saturation

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPollerScrape43KB: CPU per scrape of the 43 KB vLLM page, client
// and in-process server together (process CPU time over the scrapes), by
// pool size, one Scrape round per op on the fake clock. parse-only is the
// baseline in the same run: ParseMetrics of the same page from memory.
func BenchmarkPollerScrape43KB(b *testing.B) {
	page := vllmPage43KB()
	b.Run("parse-only", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(page)))
		c0 := cpuTime(b)
		for b.Loop() {
			if _, err := ParseMetrics(bytes.NewReader(page), VLLM()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime(b)-c0).Microseconds())/float64(b.N), "cpu-µs/scrape")
	})
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			eps, _ := scalePool(b, n, false)
			clk := newFakeClock()
			p, err := NewPoller(PollerConfig{Endpoints: eps, Now: clk.Now, Timeout: scaleTimeout,
				Scorer: Scorer{Staleness: 2 * scaleTimeout}})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			if err := p.Scrape(context.Background()); err != nil { // warm the connections
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(page) * n))
			c0, w0 := cpuTime(b), time.Now()
			for b.Loop() {
				if err := p.Scrape(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			scrapes := float64(b.N * n)
			b.ReportMetric(float64((cpuTime(b)-c0).Microseconds())/scrapes, "cpu-µs/scrape")
			b.ReportMetric(scrapes/time.Since(w0).Seconds(), "scrapes/s")
		})
	}
}

// BenchmarkPollerRun1000: Run over 1,000 pods of the 43 KB page at default
// settings on the real clock; an op is one sweep (every pod scraped once
// more). It reports the per-pod interval the poller achieved (Stats, mean
// and max), against the 50 ms asked, the usable pods at the end and the
// effective timeout.
func BenchmarkPollerRun1000(b *testing.B) {
	const n = 1000
	eps, _ := scalePool(b, n, false)
	p, err := NewPoller(PollerConfig{Endpoints: eps})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	sweep := func(k int64) {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			done := true
			for _, r := range p.Readings() {
				if r.Scrapes < k {
					done = false
					break
				}
			}
			if done {
				return
			}
			<-tick.C
		}
	}
	sweep(2) // warm-up
	k := int64(2)
	b.ReportAllocs()
	for b.Loop() {
		k++
		sweep(k)
	}
	st := p.Stats()
	b.ReportMetric(float64(st.Interval.Microseconds())/1000, "interval-ms")
	b.ReportMetric(float64(st.MaxInterval.Microseconds())/1000, "max-interval-ms")
	b.ReportMetric(float64(st.Usable), "usable-pods")
	b.ReportMetric(float64(st.Timeout.Microseconds())/1000, "timeout-ms")
}
