package saturation_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/saturation"
)

// OnReading sees each good reading as it is applied, with when its scrape
// was sent, and may call Finished from inside (the poller's lock is not
// held); a failed scrape is not reported.
func TestOnReadingSeesGoodReadingsAndMayFinish(t *testing.T) {
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "vllm:num_requests_waiting 2\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0.5\n")
	}))
	defer srv.Close()
	var p *saturation.Poller
	var got []saturation.PodReading
	p, err := saturation.NewPoller(saturation.PollerConfig{Endpoints: []string{srv.URL}, Scorer: saturation.Scorer{InFlightCredit: true},
		OnReading: func(r saturation.PodReading) {
			got = append(got, r)
			p.Finished(r.Endpoint)
		}})
	require.NoError(t, err)
	require.True(t, p.Dispatched(srv.URL))
	require.True(t, p.Dispatched(srv.URL))
	require.NoError(t, p.Scrape(context.Background()))
	require.Len(t, got, 1)
	r := got[0]
	require.Equal(t, srv.URL, r.Endpoint)
	require.True(t, r.OK)
	require.EqualValues(t, 2, r.Waiting)
	require.EqualValues(t, 3, r.Running)
	require.EqualValues(t, 2, r.InFlight, "the count as the reading was applied")
	require.False(t, r.LastAttempt.IsZero())
	require.EqualValues(t, 1, p.InFlight(srv.URL), "Finished from the hook")
	fail.Store(true)
	require.Error(t, p.Scrape(context.Background()))
	require.Len(t, got, 1, "a failed scrape reported")
}
