//go:build sdk

// The OpenAI Go SDK client tests build only with -tags sdk: the SDK takes
// minutes to compile, so go test ./... leaves it out and .ci/run runs these.

package flowhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// openAIStub answers completions and chat completions, streamed or not, in
// the OpenAI wire format (two tokens).
var openAIStub = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	choice := func(tok string, stream bool) string {
		switch {
		case chat && stream:
			return fmt.Sprintf(`{"index":0,"delta":{"role":"assistant","content":%q},"finish_reason":null}`, tok)
		case chat:
			return fmt.Sprintf(`{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}`, tok)
		}
		return fmt.Sprintf(`{"index":0,"text":%q,"finish_reason":"stop","logprobs":null}`, tok)
	}
	object := "text_completion"
	if chat {
		object = "chat.completion"
		if req.Stream {
			object = "chat.completion.chunk"
		}
	}
	obj := func(choices string) string {
		return fmt.Sprintf(`{"id":"x","object":%q,"created":1,"model":"m","choices":[%s]}`, object, choices)
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, obj(choice(" hello world", false)))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, tok := range []string{" hello", " world"} {
		fmt.Fprintf(w, "data: %s\n\n", obj(choice(tok, true)))
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
})

func sdkClient(url string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(url + "/v1/"), option.WithAPIKey("test")}, opts...)...)
}

func TestOpenAISDKThroughHandler(t *testing.T) {
	e := start(t, nil, openAIStub, flowhttp.Options{TrustObjectiveHeader: true})
	c := sdkClient(e.srv.URL, option.WithHeader(flowhttp.ObjectiveHeader, "critical"))
	ctx := context.Background()
	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "m", Prompt: prompt})
	if err != nil || len(comp.Choices) != 1 || comp.Choices[0].Text != " hello world" {
		t.Fatalf("completion: %v %+v", err, comp)
	}
	s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "m", Prompt: prompt})
	var text string
	for s.Next() {
		text += s.Current().Choices[0].Text
	}
	if s.Err() != nil || text != " hello world" {
		t.Fatalf("streamed completion: %v %q", s.Err(), text)
	}
	s.Close()

	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: msgs})
	if err != nil || chat.Choices[0].Message.Content != " hello world" {
		t.Fatalf("chat: %v %+v", err, chat)
	}
	cs := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: msgs})
	text = ""
	for cs.Next() {
		text += cs.Current().Choices[0].Delta.Content
	}
	if cs.Err() != nil || text != " hello world" {
		t.Fatalf("streamed chat: %v %q", cs.Err(), text)
	}
	cs.Close()
	for range 4 {
		if r := e.result(t); r.Reason != flowhttp.ReasonForwarded || r.Band != 0 {
			t.Errorf("result %+v", r)
		}
	}
	if n := e.ctrl.InFlight(); n != 0 {
		t.Errorf("in flight %d after the SDK calls", n)
	}
}

func TestOpenAISDKDecodesRefusals(t *testing.T) {
	var hits atomic.Int64
	e := start(t, critShed(1, 30*time.Millisecond, 0), openAIStub, flowhttp.Options{TrustObjectiveHeader: true}, func(h http.Handler) http.Handler { return counting(&hits, h) })
	e.saturate(t, 1) // sheddable blocked
	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}
	params := openai.CompletionNewParams{Model: "m", Prompt: prompt}

	// expired, with the SDK's default retries (2): asked exactly once.
	c := sdkClient(e.srv.URL, option.WithHeader(flowhttp.ObjectiveHeader, "sheddable"))
	_, err := c.Completions.New(context.Background(), params)
	var ae *openai.Error
	if !errors.As(err, &ae) {
		t.Fatalf("expired: %v is not an *openai.Error", err)
	}
	if ae.StatusCode != 503 || ae.Code != "expired" || ae.Type != "service_unavailable_error" ||
		!strings.Contains(ae.Message, `band "sheddable"`) || !strings.Contains(ae.Message, "waited") {
		t.Errorf("expired decoded as %d code %q type %q message %q", ae.StatusCode, ae.Code, ae.Type, ae.Message)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("expired: the SDK sent %d requests, want 1 (x-should-retry: false)", n)
	}

	// 429 queue-full: fill the one sheddable place, then ask again.
	e2 := start(t, critShed(1, 0, 0), openAIStub, flowhttp.Options{TrustObjectiveHeader: true})
	e2.saturate(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c2 := sdkClient(e2.srv.URL, option.WithHeader(flowhttp.ObjectiveHeader, "sheddable"), option.WithMaxRetries(0))
	held := make(chan error, 1)
	go func() { _, err := c2.Completions.New(ctx, params); held <- err }()
	waitFor(t, "one queued", func() bool { return e2.queued(1) == 1 })
	_, err = c2.Completions.New(context.Background(), params)
	if !errors.As(err, &ae) {
		t.Fatalf("queue full: %v is not an *openai.Error", err)
	}
	if ae.StatusCode != 429 || ae.Code != "queue-full" || ae.Type != "rate_limit_error" || !strings.Contains(ae.Message, `band "sheddable"`) {
		t.Errorf("queue full decoded as %d code %q type %q message %q", ae.StatusCode, ae.Code, ae.Type, ae.Message)
	}
	cancel()
	<-held
}
