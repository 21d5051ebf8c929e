package flowhttp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/saturation"
)

// The credit retires a forwarded request once a scrape sent creditGrace
// after it shows the server with fewer requests than the gateway forwarded
// there: the oldest first, as many as the server no longer counts; their
// done does nothing later but report them retired, the others' still count
// down; OnRetire hears of each retired request once.
func TestCreditRetiresWhatTheServerReportsFinished(t *testing.T) {
	var running atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running %d\nvllm:kv_cache_usage_perc 0\n", running.Load())
	}))
	defer srv.Close()
	var now atomic.Int64 // the poller's clock, in ns from t0
	t0 := time.Unix(1000, 0)
	clock := func() time.Time { return t0.Add(time.Duration(now.Load())) }
	var seen, retired atomic.Int64
	onRetire := func(ep string) {
		require.Equal(t, srv.URL, ep)
		retired.Add(1)
	}
	g, err := NewGateway(GatewayConfig{Endpoints: []string{srv.URL}, OnRetire: onRetire, Poller: saturation.PollerConfig{
		Now: clock, Scorer: saturation.Scorer{Staleness: time.Hour}, Timeout: time.Minute,
		OnReading: func(saturation.PodReading) { seen.Add(1) }}})
	require.NoError(t, err)
	defer g.Close()
	m := g.endpoints.murls[0]
	scrapeAt := func(d time.Duration) {
		t.Helper()
		now.Store(int64(d))
		require.NoError(t, g.poller.Scrape(context.Background()))
	}
	w := httptest.NewRecorder()
	var done []func() bool
	for range 3 {
		done = append(done, g.Forward(w, srv.URL))
	}
	running.Store(1)
	scrapeAt(creditGrace / 2) // too soon after the forwards: nothing retired
	require.EqualValues(t, 3, g.poller.InFlight(m))
	scrapeAt(creditGrace + time.Millisecond) // 3 forwarded before, 1 running
	require.EqualValues(t, 1, g.poller.InFlight(m))
	require.EqualValues(t, 2, retired.Load())
	late := g.Forward(w, srv.URL) // after the cutoff of the next scrape
	running.Store(0)
	scrapeAt(creditGrace + 2*time.Millisecond)
	require.EqualValues(t, 1, g.poller.InFlight(m), "the late request is not the server's to show yet")
	require.True(t, done[0](), "a retired request's done reports it")
	require.True(t, done[1]())
	require.EqualValues(t, 1, g.poller.InFlight(m), "a retired request's done counted")
	scrapeAt(2*creditGrace + 2*time.Millisecond)
	require.EqualValues(t, 0, g.poller.InFlight(m))
	require.True(t, done[2]())
	require.True(t, late())
	require.True(t, late())
	require.EqualValues(t, 0, g.poller.InFlight(m))
	require.EqualValues(t, 4, retired.Load(), "OnRetire once per retired request")
	d := g.Forward(w, srv.URL)
	require.False(t, d(), "a request done before any scrape showed it was not retired")
	require.False(t, d())
	require.False(t, g.Forward(w, "http://unknown:1")(), "an endpoint the gateway does not know")
	require.Zero(t, g.poller.Unbalanced(), "a done landed twice")
	require.EqualValues(t, 4, seen.Load(), "the host's OnReading is still called")
}

// Forward and done take one lock each and allocate what Forward did before
// the credit kept its requests: the request's entry and its done.
func TestForwardAllocations(t *testing.T) {
	g, err := NewGateway(GatewayConfig{Endpoints: []string{"http://127.0.0.1:1"}})
	require.NoError(t, err)
	defer g.Close()
	w := httptest.NewRecorder()
	allocs := testing.AllocsPerRun(1000, func() { g.Forward(w, "http://127.0.0.1:1")() })
	t.Logf("allocs per Forward+done: %v", allocs)
	require.LessOrEqual(t, allocs, 2.0)
}
