package flowhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// TestGatewayShipsPromptTokenTerm: by default the gateway's saturation
// weighs a pod's waiting requests by their mean prompt length
// (saturation.DefaultPromptTokenThreshold): three waiting prompts of 1,176
// tokens score 3·1176/4096, where the request count alone says 3/5; with
// Poller.NoPromptTokens it is the reference 3/5, and an explicit threshold is kept.
func TestGatewayShipsPromptTokenTerm(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_waiting 3\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"+
			"vllm:request_prompt_tokens_sum 11760\nvllm:request_prompt_tokens_count 10\n")
	}))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		name string
		cfg  flowhttp.GatewayConfig
		want float64
	}{
		{"default", flowhttp.GatewayConfig{}, 3 * 1176 / float64(saturation.DefaultPromptTokenThreshold)},
		{"off", flowhttp.GatewayConfig{Poller: saturation.PollerConfig{NoPromptTokens: true}}, 3.0 / 5},
		{"explicit", flowhttp.GatewayConfig{Poller: saturation.PollerConfig{Scorer: saturation.Scorer{PromptTokenThreshold: 1176}}}, 3},
	} {
		cfg := c.cfg
		cfg.Endpoints = []string{srv.URL}
		cfg.NoCredit = true // the scraped score alone
		cfg.Poller.Scorer.Staleness = time.Hour
		gw, err := flowhttp.NewGateway(cfg)
		require.NoError(t, err, c.name)
		require.NoError(t, gw.Poller().Scrape(t.Context()), c.name)
		require.InDelta(t, c.want, gw.Saturation(), 1e-9, c.name)
		gw.Close()
	}
}
