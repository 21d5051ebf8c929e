package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// TestGatewayWiringDefault: the simulator's default flowgate row runs the wiring
// flowhttp.Gateway ships (in-flight credit on, the queue scored against
// flowhttp.CreditQueueDepthThreshold, the prompt-token term at its default, KV as
// scraped, the mean over replicas), and the two score the same pod alike: a
// zero-config Gateway scraping a pod with 4 waiting, 2 running, KV 0.3 and a mean
// prompt of 1,000 tokens (the prompt-token term leads), with 9 requests dispatched to
// it, reads what the simulator's gate reads for that pod (Scorer.Pool of the Scorer
// built from its default config, over the reading with those 9 in flight): the 3
// credited requests are charged as waiting ones in the prompt-token term too, not at
// 1/Q each as the Gateway's credit did before (the test tells the two apart). Without
// -credit the row is the scrape alone (the reference 5), as a Gateway with
// NoCredit.
func TestGatewayWiringDefault(t *testing.T) {
	o, err := parseFlags(nil, nil)
	require.NoError(t, err)
	c := o.config(workload.Chat, 80, cluster.SoftReflective, 1)
	require.True(t, c.Credit)
	require.Equal(t, flowhttp.CreditQueueDepthThreshold, c.QueueThreshold)
	require.Equal(t, float64(saturation.DefaultPromptTokenThreshold), c.PromptTokens)
	require.Zero(t, c.KVThreshold)
	require.Equal(t, saturation.ProjectNone, c.Projection)
	require.False(t, c.MaxOverReplicas)
	require.Zero(t, c.Tick, "the flowcontrol default tick, as the Gateway's zero Flow")
	require.Zero(t, c.Burst, "the flowcontrol default burst, as the Gateway's zero Flow")

	const body = "vllm:num_requests_waiting 4\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.3\n" +
		"vllm:request_prompt_tokens_sum 10000\nvllm:request_prompt_tokens_count 10\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	t.Cleanup(srv.Close)
	scorer := func(c cluster.Config) saturation.Scorer {
		return saturation.Scorer{InFlightCredit: c.Credit, QueueDepthThreshold: c.QueueThreshold,
			KVUtilThreshold: c.KVThreshold, PromptTokenThreshold: c.PromptTokens, Projection: c.Projection}
	}
	now := time.Now()
	rd, err := saturation.ParseMetrics(strings.NewReader(body), saturation.VLLM())
	require.NoError(t, err)
	rd.At, rd.InFlight = now, 9

	for _, noCredit := range []bool{false, true} {
		oc := o
		oc.credit = !noCredit
		c := oc.config(workload.Chat, 80, cluster.SoftReflective, 1)
		if noCredit {
			require.Zero(t, c.QueueThreshold, "the reference threshold")
		}
		gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{Endpoints: []string{srv.URL}, NoCredit: noCredit,
			Poller: saturation.PollerConfig{Scorer: saturation.Scorer{Staleness: time.Hour}}})
		require.NoError(t, err)
		require.NoError(t, gw.Poller().Scrape(t.Context()))
		for range 9 {
			gw.Poller().Dispatched(srv.URL + flowhttp.DefaultMetricsPath)
		}
		want := scorer(c).Pool([]saturation.Reading{rd}, now)
		require.InDelta(t, want, gw.Saturation(), 1e-6, "NoCredit %v", noCredit)
		if !noCredit {
			// 7 waiting requests' prompts over 4,096 tokens: the term leads.
			require.InDelta(t, 7*1000.0/saturation.DefaultPromptTokenThreshold, want, 1e-9)
			// The one-slope credit: base + (9 − T)/Q with T where the queue
			// term alone would pass the base.
			base := 4 * 1000.0 / saturation.DefaultPromptTokenThreshold
			oneSlope := base + (9-(6+c.QueueThreshold*base-4))/c.QueueThreshold
			require.Greater(t, want, oneSlope+0.5, "the test tells the exact credit from the one-slope one")
		}
		gw.Close()
	}
}
