package fakevllm_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/saturation"
)

// scrapeUntil scrapes /metrics every 10 ms until ok holds for the reading or
// the deadline passes, and returns the last reading.
func scrapeUntil(t *testing.T, url string, deadline time.Duration, ok func(saturation.Reading) bool) saturation.Reading {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(deadline)
	for {
		resp, err := http.Get(url + "/metrics")
		require.NoError(t, err)
		r, err := saturation.ParseMetrics(resp.Body, saturation.VLLM())
		resp.Body.Close()
		require.NoError(t, err)
		if ok(r) || time.Now().After(end) {
			return r
		}
		<-tick.C
	}
}

// TestDisconnectAborts: a client that goes away takes its request out of the
// model at once, as vLLM aborts on disconnect: one queued without streaming,
// one queued with its stream open, and one cut mid-stream. One seat
// (MaxNumSeqs 1) and outputs of 30,000 tokens (minutes at 5×), so that no
// request leaves the model during the test except by its abort.
func TestDisconnectAborts(t *testing.T) {
	cfg := vllm.DefaultConfig()
	cfg.MaxNumSeqs = 1
	s, h := start(t, fakevllm.Config{SpeedUp: 5, Replica: cfg})
	body := func(stream bool) string {
		b := `{"prompt":"` + strings.Repeat("x", 4000) + `","max_tokens":30000`
		if stream {
			b += `,"stream":true`
		}
		return b + "}"
	}
	const deadline = 5 * time.Second

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a := post(t, ctxA, h.URL+"/v1/completions", body(true))
	defer a.Body.Close()
	sseReader{bufio.NewScanner(a.Body)}.next(t) // A runs and holds KV

	// B, queued without streaming: no response until it finishes, so its
	// client's Do blocks until the cancellation below.
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	doneB := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctxB, http.MethodPost, h.URL+"/v1/completions", strings.NewReader(body(false)))
		if err != nil {
			doneB <- err
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		doneB <- err
	}()
	r := scrapeUntil(t, h.URL, deadline, func(r saturation.Reading) bool { return r.Waiting == 1 })
	require.Equal(t, 1.0, r.Waiting, "B never showed as waiting")
	// C, queued with its stream open (the headers leave when it enters the model).
	ctxC, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	c := post(t, ctxC, h.URL+"/v1/completions", body(true))
	defer c.Body.Close()
	held := scrapeUntil(t, h.URL, deadline, func(r saturation.Reading) bool { return r.Waiting == 2 })
	require.Equal(t, 2.0, held.Waiting)
	require.Equal(t, 1.0, held.Running)
	require.Greater(t, held.KVUsage, 0.0)

	cancelB()
	require.ErrorIs(t, <-doneB, context.Canceled)
	r = scrapeUntil(t, h.URL, deadline, func(r saturation.Reading) bool { return r.Waiting == 1 })
	require.Equal(t, 1.0, r.Waiting, "B, queued, cancelled: still waiting after %v (%+v)", deadline, r)
	cancelC()
	r = scrapeUntil(t, h.URL, deadline, func(r saturation.Reading) bool { return r.Waiting == 0 })
	require.Equal(t, 0.0, r.Waiting, "C, queued and streaming, cancelled: still waiting after %v (%+v)", deadline, r)
	require.Equal(t, 1.0, r.Running)
	require.Greater(t, r.KVUsage, 0.0)

	cancelA()
	r = scrapeUntil(t, h.URL, deadline, func(r saturation.Reading) bool { return r.Running == 0 && r.KVUsage == 0 })
	require.Equal(t, 0.0, r.Running, "A, cut mid-stream: still running after %v (%+v)", deadline, r)
	require.Equal(t, 0.0, r.KVUsage, "A, cut mid-stream: KV still held after %v", deadline)
	require.Equal(t, 0.0, r.Waiting)
	require.Zero(t, s.Completed())
	require.EqualValues(t, 3, s.Aborted())
}
