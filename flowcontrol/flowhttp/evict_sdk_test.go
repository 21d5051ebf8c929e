//go:build sdk

package flowhttp_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// The OpenAI Go SDK's non-streaming call of a request the gateway evicts
// before its first byte completes with 200 and the whole completion: the
// eviction and the re-queue are invisible to it, and it sends the request
// once.
func TestOpenAISDKEvictedCompletionSucceeds(t *testing.T) {
	s := newScripted()
	var first atomic.Bool
	handle := func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(flowhttp.ObjectiveHeader) == "critical" || first.CompareAndSwap(false, true) {
			s.serve(w, r) // the critical stall, and the held first attempt
			return
		}
		s.shedAttempts.Add(1)
		openAIStub.ServeHTTP(w, r)
	}
	e := newEvictEnv(t, flowhttp.GatewayConfig{}, handle)
	t.Cleanup(s.release)

	var hits atomic.Int64
	c := sdkClient(e.srv.URL, option.WithHeader(flowhttp.ObjectiveHeader, "sheddable"), option.WithHeader("x-test-id", "sdk"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			hits.Add(1)
			return next(r)
		}))
	type out struct {
		comp *openai.Completion
		err  error
	}
	done := make(chan out, 1)
	go func() {
		prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}
		comp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "m", Prompt: prompt})
		done <- out{comp, err}
	}()
	waitFor(t, "the SDK's request at the pod", func() bool { return s.shedAttempts.Load() == 1 })
	e.saturate(t)
	crit := e.goSend(context.Background(), "crit", "critical", `{"prompt":"urgent"}`)
	select {
	case <-s.aborted:
	case <-time.After(time.Minute):
		t.Fatal("the SDK's request was never evicted")
	}
	waitFor(t, "the victim queued again", func() bool { return e.gw.Controller().Stats().Bands[1].Queued == 1 })
	e.idle()
	var o out
	select {
	case o = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the SDK call never returned")
	}
	require.NoError(t, o.err)
	require.Len(t, o.comp.Choices, 1)
	require.Equal(t, " hello world", o.comp.Choices[0].Text)
	require.Equal(t, int64(1), hits.Load(), "the SDK sent the request once")
	res := e.result(t, "sdk")
	require.Equal(t, 200, res.Status)
	require.Equal(t, 1, res.Evictions)
	s.release()
	require.Equal(t, 200, recv(t, crit).code)
}
