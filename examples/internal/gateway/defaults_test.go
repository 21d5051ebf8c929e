package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// TestDefaultQueueThresholdIsTheGateways: a config file that omits
// queueDepthThreshold gets what flowhttp.Gateway ships, not a copy of it:
// with inFlightCredit the queue is scored against
// flowhttp.CreditQueueDepthThreshold (the value calibrated with the credit),
// without it against llm-d's 5. A pod with 5 waiting requests and nothing else
// reads 5/6.25 with the credit and 5/5 without; an explicit threshold wins.
func TestDefaultQueueThresholdIsTheGateways(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_waiting 5\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name     string
		credit   bool
		explicit float64
		want     float64
	}{
		{"credit on, omitted", true, 0, 5 / flowhttp.CreditQueueDepthThreshold},
		{"credit off, omitted", false, 0, 5 / saturation.DefaultQueueDepthThreshold},
		{"credit on, explicit 10", true, 10, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Saturation.InFlightCredit = tc.credit
			if tc.explicit != 0 {
				cfg.Saturation.QueueDepthThreshold = tc.explicit
			}
			gc := GatewayConfig(cfg, flowcontrol.NewSoftReflective())
			gc.Endpoints = []string{srv.URL}
			gc.Poller.Scorer.Staleness = time.Hour // judged on the values, not on this machine's speed
			gw, err := flowhttp.NewGateway(gc)
			require.NoError(t, err)
			defer gw.Close()
			require.NoError(t, gw.Poller().Scrape(t.Context()))
			require.InDelta(t, tc.want, gw.Saturation(), 1e-9)
		})
	}
}
