package flowhttp_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// The collector exports what the poller achieves: the usable endpoints, the
// cadence per endpoint and for the pool, and the effective scrape timeout.
func TestGatewayExportsPollerPace(t *testing.T) {
	a, b := newPod(t, nil), newPod(t, nil)
	gw, _ := runGateway(t, flowhttp.GatewayConfig{}, a, b)
	waitFor(t, "every endpoint scraped twice", func() bool {
		for _, r := range gw.Poller().Readings() {
			if r.Interval == 0 {
				return false
			}
		}
		return true
	})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(gw.Collector()))
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string][]float64{}
	labels := map[string][]string{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			got[f.GetName()] = append(got[f.GetName()], m.GetGauge().GetValue())
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					labels[f.GetName()] = append(labels[f.GetName()], l.GetValue())
				}
			}
		}
	}
	require.Equal(t, []float64{2}, got["flowgate_endpoints_usable"])
	require.ElementsMatch(t, []string{a.srv.URL, b.srv.URL}, labels["flowgate_endpoint_scrape_interval_seconds"])
	for _, v := range got["flowgate_endpoint_scrape_interval_seconds"] {
		require.Greater(t, v, 0.0, "each endpoint was scraped twice")
	}
	require.Len(t, got["flowgate_poller_scrape_interval_seconds"], 1)
	require.Greater(t, got["flowgate_poller_scrape_interval_seconds"][0], 0.0)
	// runGateway's Timeout is 5 s: the effective one is at least that and
	// at most MaxTimeoutGrowth times it.
	timeout := got["flowgate_poller_scrape_timeout_seconds"]
	require.Len(t, timeout, 1)
	require.GreaterOrEqual(t, timeout[0], (5 * time.Second).Seconds())
	require.LessOrEqual(t, timeout[0], (saturation.MaxTimeoutGrowth * 5 * time.Second).Seconds())
}
