//go:build sdk

// The OpenAI Go SDK client tests build only with -tags sdk: the SDK takes
// minutes to compile, so go test ./... leaves it out and .ci/run runs these.

package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

// frontOf serves the harness's proxy on a second server that counts the
// requests reaching it.
func frontOf(t *testing.T, h *harness) (url string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h.p.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, hits
}

func sdk(url, objective string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(url + "/v1/"), option.WithAPIKey("x"),
		option.WithHeader(gateway.ObjectiveHeader, objective)}, opts...)...)
}

// The official OpenAI Go SDK through the proxy to the fake vLLM:
// completions and chat, streamed and not.
func TestOpenAISDKThroughProxy(t *testing.T) {
	b := newStub(t, 50)
	h := newHarness(t, testConfig(), b)
	c := sdk(h.srv.URL, "critical")
	ctx := context.Background()
	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello there")}
	max := openai.Int(5)

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "Qwen/Qwen3-14B", Prompt: prompt, MaxTokens: max})
	require.NoError(t, err)
	require.Len(t, comp.Choices, 1)
	require.NotEmpty(t, comp.Choices[0].Text)

	s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "Qwen/Qwen3-14B", Prompt: prompt, MaxTokens: max})
	chunks := 0
	for s.Next() {
		chunks++
	}
	require.NoError(t, s.Err())
	require.NoError(t, s.Close())
	require.GreaterOrEqual(t, chunks, 5, "one event per token")

	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-14B", Messages: msgs, MaxTokens: max})
	require.NoError(t, err)
	require.NotEmpty(t, chat.Choices[0].Message.Content)

	cs := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-14B", Messages: msgs, MaxTokens: max})
	var text strings.Builder
	for cs.Next() {
		if len(cs.Current().Choices) > 0 {
			text.WriteString(cs.Current().Choices[0].Delta.Content)
		}
	}
	require.NoError(t, cs.Err())
	require.NoError(t, cs.Close())
	require.NotEmpty(t, text.String())
	// Every request was answered 200 on band 0. The two plain ones end
	// forwarded; a streamed one may end cancelled: the SDK closes the
	// stream once it has read [DONE], which can be before the proxy has
	// written the last chunk, and the proxy then sees the client leave.
	forwarded := 0
	for range 4 {
		band, code, reason := h.nextFinish(t)
		require.Equal(t, 0, band)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, []string{gateway.ReasonForwarded, gateway.ReasonCancelled}, reason)
		if reason == gateway.ReasonForwarded {
			forwarded++
		}
	}
	require.GreaterOrEqual(t, forwarded, 2, "the non-streamed requests end forwarded")
}

// The SDK decodes the proxy's 503 expired and 429 queue-full into
// Code/Type/Message, and with its default 2 retries sends an expired
// request exactly once (x-should-retry: false).
func TestOpenAISDKDecodesProxyRefusals(t *testing.T) {
	b := newStub(t, 50)
	cfg := testConfig()
	cfg.Bands[1].MaxWait = 30 * time.Millisecond
	cfg.Bands[1].Capacity = 1
	h := newHarness(t, cfg, b)
	b.saturated.Store(true) // sheddable blocked
	gatedNow(t, h.p)
	url, hits := frontOf(t, h)
	params := openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}}

	shed := sdk(url, "sheddable") // the SDK's default retries
	_, err := shed.Completions.New(context.Background(), params)
	var ae *openai.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusServiceUnavailable, ae.StatusCode)
	require.Equal(t, gateway.ReasonExpired, ae.Code)
	require.Equal(t, "service_unavailable_error", ae.Type)
	require.Contains(t, ae.Message, `band "sheddable"`)
	require.Contains(t, ae.Message, "waited")
	require.Equal(t, int64(1), hits.Load(), "an expired refusal must not be retried")

	// Fill the one sheddable place, then the next is refused 429.
	cfg.Bands[1].MaxWait = 0
	h2 := newHarness(t, cfg, b)
	gatedNow(t, h2.p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan error, 1)
	once := sdk(h2.srv.URL, "sheddable", option.WithMaxRetries(0))
	go func() {
		_, err := once.Completions.New(ctx, params)
		held <- err
	}()
	eventually(t, "one queued", func() bool { return h2.p.Controller().Stats().Bands[1].Queued == 1 })
	_, err = once.Completions.New(context.Background(), params)
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusTooManyRequests, ae.StatusCode)
	require.Equal(t, gateway.ReasonQueueFull, ae.Code)
	require.Equal(t, "rate_limit_error", ae.Type)
	require.Contains(t, ae.Message, `band "sheddable"`)
	cancel()
	require.True(t, errors.Is(<-held, context.Canceled))
}
