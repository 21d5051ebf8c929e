package flowmetrics_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type satValue struct{ bits atomic.Uint64 }

func (s *satValue) set(f float64)       { s.bits.Store(uint64(f * 1e6)) }
func (s *satValue) Saturation() float64 { return float64(s.bits.Load()) / 1e6 }

// bandsOf returns n bands of the given capacity, band i with maxWait[i]
// (no limit where maxWait is shorter).
func bandsOf(n, capacity int, maxWait ...time.Duration) []flowcontrol.BandConfig {
	b := make([]flowcontrol.BandConfig, n)
	for i := range b {
		b[i].Capacity = capacity
		if i < len(maxWait) {
			b[i].MaxWait = maxWait[i]
		}
	}
	return b
}

// newBound makes a collector, a controller with the collector as its
// outcome hook, and binds them.
func newBound(t *testing.T, cfg flowcontrol.ControllerConfig, opts flowmetrics.Options) (*flowcontrol.Controller, *flowmetrics.Collector) {
	t.Helper()
	col, err := flowmetrics.New(len(cfg.Bands), opts)
	require.NoError(t, err)
	cfg.OnOutcome = col.OnOutcome
	c, err := flowcontrol.NewController(cfg)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, col.Bind(c))
	return c, col
}

func waitQueued(t *testing.T, c *flowcontrol.Controller, band, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Bands[band].Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("band %d: queued %d, want %d", band, c.Stats().Bands[band].Queued, n)
		}
		runtime.Gosched()
	}
}

// scrape fetches /metrics over real HTTP and parses it with expfmt.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value returns the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "family %s missing", name)
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	t.Fatalf("%s%v not found", name, want)
	return nil
}

// TestScrapeMatchesStats drives a controller through every outcome by hand
// (Step, fake clock), scrapes the collector over HTTP and checks every value
// against the Stats snapshot.
func TestScrapeMatchesStats(t *testing.T) {
	var now atomic.Int64
	base := time.Unix(1000, 0)
	clock := func() time.Time { return base.Add(time.Duration(now.Load())) }
	sat := &satValue{}
	bands := bandsOf(2, 2, 0, time.Second)
	bands[0].Name, bands[1].Name = "critical", "sheddable"
	c, col := newBound(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bands, Source: sat, Now: clock, Policy: flowcontrol.NewSoftReflective()}, Stepped: true},
		flowmetrics.Options{BandNames: []string{"critical", "sheddable"}})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	// Overloaded: band 0 flows, band 1 is blocked (ceiling 0).
	sat.set(2)
	c.Step()

	var wg sync.WaitGroup
	errs := make([]error, 4)
	permits := make([]flowcontrol.Permit, 4)
	wait := func(i int, ctx context.Context, band int) {
		defer wg.Done()
		permits[i], errs[i] = c.Wait(ctx, band)
	}

	// Cancelled: a waiter gives up while band 1 is blocked; the next tick
	// (band 1 open again) skips it.
	ctxCancel, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go wait(0, ctxCancel, 1)
	waitQueued(t, c, 1, 1)
	cancel()
	wg.Wait()
	require.ErrorIs(t, errs[0], flowcontrol.ErrCancelled)
	sat.set(0)
	c.Step()
	waitQueued(t, c, 1, 0)

	// Expired and rejected: band 1 blocked again and filled to capacity.
	sat.set(2)
	c.Step()
	wg.Add(2)
	go wait(1, context.Background(), 1)
	go wait(2, context.Background(), 1)
	waitQueued(t, c, 1, 2)
	_, err := c.Wait(context.Background(), 1)
	require.ErrorIs(t, err, flowcontrol.ErrQueueFull)

	// Dispatched: band 0 flows at any saturation.
	wg.Add(1)
	go wait(3, context.Background(), 0)
	waitQueued(t, c, 0, 1)
	now.Add(int64(2 * time.Second))
	// One Step dispatches band 0 and expires both band-1 waiters, but
	// Queued counts a waiter from its slot's reservation, a moment before
	// its push: on a busy machine that Step found band 0's ring still
	// empty, and the test hung in wg.Wait. So Step until all three have
	// their outcome (bounded); the Stats checked below are the snapshot's.
	deadline := time.Now().Add(time.Minute)
	for st := c.Stats(); st.Bands[0].Dispatched != 1 || st.Bands[1].Expired != 2; st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("a minute of Steps: dispatched %d (want 1), expired %d (want 2)", st.Bands[0].Dispatched, st.Bands[1].Expired)
		}
		c.Step()
		runtime.Gosched()
	}
	wg.Wait()
	require.ErrorIs(t, errs[1], flowcontrol.ErrExpired)
	require.ErrorIs(t, errs[2], flowcontrol.ErrExpired)
	require.NoError(t, errs[3])
	permits[3].Done()

	// Requeued: the released request is taken back (evicted) and queued
	// again at the head of its band, then released a second time.
	requeued := make(chan error, 1)
	go func() {
		p, err := c.Requeue(context.Background(), 0, nil, clock())
		p.Done()
		requeued <- err
	}()
	waitQueued(t, c, 0, 1)
	c.Step()
	require.NoError(t, <-requeued)

	st := c.Stats()
	require.Equal(t, uint64(2), st.Bands[0].Dispatched)
	require.Equal(t, uint64(1), st.Bands[0].Requeued)
	require.Equal(t, uint64(2), st.Bands[1].Expired)
	require.Equal(t, uint64(1), st.Bands[1].Cancelled)
	require.Equal(t, uint64(1), st.Bands[1].Rejected)

	fams := scrape(t, srv.URL)
	require.Equal(t, st.Saturation, value(t, fams, "flowgate_saturation", nil).GetGauge().GetValue())
	require.Equal(t, 2.0, st.Saturation)
	require.Equal(t, float64(st.Ticks), value(t, fams, "flowgate_ticks_total", nil).GetCounter().GetValue())
	for i, name := range []string{"critical", "sheddable"} {
		b := st.Bands[i]
		lb := map[string]string{"band": name}
		require.Equal(t, float64(b.Queued), value(t, fams, "flowgate_queue_depth", lb).GetGauge().GetValue())
		require.Equal(t, b.Gate.Ceiling, value(t, fams, "flowgate_band_ceiling", lb).GetGauge().GetValue())
		require.Equal(t, float64(b.Gate.Every), value(t, fams, "flowgate_band_duty_cycle_ticks", lb).GetGauge().GetValue())
		require.Equal(t, float64(b.Requeued), value(t, fams, "flowgate_requeued_total", lb).GetCounter().GetValue())
		for reason, want := range map[string]uint64{
			"queue_full": b.Rejected, "closed": b.Refused.Closed, "cancelled": b.Refused.Cancelled, "not_running": b.Refused.NotRunning,
			"shed": b.Refused.Shed,
		} {
			got := value(t, fams, "flowgate_refused_total", map[string]string{"band": name, "reason": reason})
			require.Equal(t, float64(want), got.GetCounter().GetValue(), "%s %s", name, reason)
		}
		for outcome, want := range map[string]uint64{
			"dispatched": b.Dispatched, "cancelled": b.Cancelled, "expired": b.Expired, "closed": b.Closed,
		} {
			got := value(t, fams, "flowgate_requests_total", map[string]string{"band": name, "outcome": outcome})
			require.Equal(t, float64(want), got.GetCounter().GetValue(), "%s %s", name, outcome)
			h := value(t, fams, "flowgate_wait_seconds", map[string]string{"band": name, "outcome": outcome}).GetHistogram()
			require.Equal(t, want, h.GetSampleCount(), "histogram %s %s", name, outcome)
		}
	}
	// Gates as the soft-reflective policy sets them at s = 2.
	require.Equal(t, flowcontrol.Gate{Ceiling: 1, Every: 1}, st.Bands[0].Gate)
	require.Equal(t, 0, st.Bands[1].Gate.Every)
	// The histogram measures the controller's clock: both sheddable
	// waiters queued at virtual time 0 and expired at 2 s.
	h := value(t, fams, "flowgate_wait_seconds", map[string]string{"band": "sheddable", "outcome": "expired"}).GetHistogram()
	require.InDelta(t, 4.0, h.GetSampleSum(), 1e-9)
}

func TestNewValidates(t *testing.T) {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 1), Source: &satValue{}}})
	require.NoError(t, err)
	defer c.Close()
	_, err = flowmetrics.New(0, flowmetrics.Options{})
	require.ErrorContains(t, err, "flowmetrics: bands")
	_, err = flowmetrics.New(2, flowmetrics.Options{BandNames: []string{"a", "a"}})
	require.ErrorContains(t, err, "duplicate band label")
	_, err = flowmetrics.New(1, flowmetrics.Options{BandNames: []string{"a", "b"}})
	require.ErrorContains(t, err, "BandNames has 2 names for 1 bands")

	// A collector for 3 bands cannot report a 2-band controller.
	col3, err := flowmetrics.New(3, flowmetrics.Options{})
	require.NoError(t, err)
	require.ErrorContains(t, col3.Bind(c), "flowmetrics: Bind: the collector was made for 3 bands, the source has 2")
	require.ErrorContains(t, col3.Bind(nil), "nil StatsSource")
	// Names given must be the controller's (band0, band1 by default).
	colNamed, err := flowmetrics.New(2, flowmetrics.Options{BandNames: []string{"critical", "sheddable"}})
	require.NoError(t, err)
	require.ErrorContains(t, colNamed.Bind(c), `BandNames[0] is "critical", the source's band 0 is named "band0"`)

	// Unnamed bands are labelled by index; the registry accepts it; a
	// second Bind is refused.
	col, err := flowmetrics.New(2, flowmetrics.Options{})
	require.NoError(t, err)
	require.NoError(t, col.Bind(c))
	require.ErrorContains(t, col.Bind(c), "already bound")
	require.NoError(t, prometheus.NewPedanticRegistry().Register(col))
}

func TestOutcome(t *testing.T) {
	require.Equal(t, "dispatched", flowmetrics.Outcome(nil))
	require.Equal(t, "cancelled", flowmetrics.Outcome(errors.Join(flowcontrol.ErrCancelled, context.Canceled)))
	require.Equal(t, "expired", flowmetrics.Outcome(flowcontrol.ErrExpired))
	require.Equal(t, "closed", flowmetrics.Outcome(flowcontrol.ErrClosed))
	require.Equal(t, "rejected", flowmetrics.Outcome(flowcontrol.ErrQueueFull))
	require.Equal(t, "", flowmetrics.Outcome(flowcontrol.ErrUnknownBand))
}

func TestObserveWaitAllocatesNothing(t *testing.T) {
	col, err := flowmetrics.New(2, flowmetrics.Options{})
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		col.OnOutcome(1, nil, time.Millisecond)
		col.OnOutcome(0, flowcontrol.ErrExpired, time.Second)
		col.OnOutcome(7, nil, time.Second) // ignored
	})
	require.Zero(t, allocs)
}

// TestHistogramAgreesWithStatsOnLateReap: a waiter cancelled while its band
// is blocked is reaped later, at its expiry; the waiter's outcome (the
// histogram's) and the dispatcher's count (Stats') must still agree.
func TestHistogramAgreesWithStatsOnLateReap(t *testing.T) {
	var now atomic.Int64
	base := time.Unix(1000, 0)
	sat := &satValue{}
	sat.set(2) // band 1 blocked
	c, col := newBound(t, flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(2, 4, 0, time.Second), Source: sat, Policy: flowcontrol.NewSoftReflective(), Now: func() time.Time { return base.Add(time.Duration(now.Load())) }}, Stepped: true}, flowmetrics.Options{})
	c.Step()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.Wait(ctx, 1); errc <- err }()
	waitQueued(t, c, 1, 1)
	cancel()
	require.ErrorIs(t, <-errc, flowcontrol.ErrCancelled)
	now.Add(int64(2 * time.Second))
	c.Step() // the dead entry falls due while the band is still blocked
	st := c.Stats().Bands[1]
	require.Equal(t, 0, st.Queued)
	require.Equal(t, uint64(1), st.Cancelled, "stats: %+v", st)
	require.Zero(t, st.Expired)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))
	fams, err := reg.Gather()
	require.NoError(t, err)
	var counter, hist float64
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["band"] != "1" || labels["outcome"] != "cancelled" {
				continue
			}
			switch f.GetName() {
			case "flowgate_requests_total":
				counter = m.GetCounter().GetValue()
			case "flowgate_wait_seconds":
				hist = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	require.Equal(t, 1.0, counter)
	require.Equal(t, 1.0, hist)
}
