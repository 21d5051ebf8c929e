package fakevllm_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
)

// FuzzRequest sends any body to both completion routes, streamed or not,
// through the fake server's handler: it answers 200 with exactly the
// requested number of tokens (one SSE event each, every event valid JSON,
// then [DONE]; or one JSON body whose usage says so), or a 4xx JSON error
// whose message starts "fakevllm: ". Never a panic, never a hang.
func FuzzRequest(f *testing.F) {
	s, err := fakevllm.New(fakevllm.Config{SpeedUp: 1e6, MaxBodyBytes: 4096})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	for _, b := range []string{
		`{"prompt":"hello","max_tokens":3}`,
		`{"prompt":["a","bb"],"max_tokens":2,"stream":true}`,
		`{"prompt":[1,2,3],"stream":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":2,"stream":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":1}`,
		`{"prompt":"x","max_tokens":0}`,
		`{"prompt":"x","max_tokens":-1}`,
		`{"prompt":"x","max_tokens":100000}`,
		`{"prompt":{"a":1}}`,
		`{"prompt":"x","model":"a\u0000\"b\u00ff","max_tokens":2,"stream":true}`,
		`{"messages":[{"content":null}]}`,
		`{`,
		``,
	} {
		f.Add(false, b)
		f.Add(true, b)
	}
	f.Fuzz(func(t *testing.T, chat bool, body string) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		// The tokens the server must produce, by its documented rules.
		var r struct {
			MaxTokens           *int `json:"max_tokens"`
			MaxCompletionTokens *int `json:"max_completion_tokens"`
			Stream              bool `json:"stream"`
		}
		parsed := json.Unmarshal([]byte(body), &r) == nil
		want := 16
		if r.MaxTokens != nil {
			want = *r.MaxTokens
		}
		if chat && r.MaxCompletionTokens != nil {
			want = *r.MaxCompletionTokens
		}
		if want > 1024 && want < 40960 {
			t.Skip("a long generation: valid, but slow in real time for a fuzz iteration")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if ctx.Err() != nil {
			t.Fatalf("no answer within 30 s to %q", body)
		}
		out := rec.Body.String()
		switch code := rec.Code; {
		case code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge:
			var e struct{ Message string }
			if err := json.Unmarshal([]byte(out), &e); err != nil || !strings.HasPrefix(e.Message, "fakevllm: ") {
				t.Fatalf("%d with body %q (%v)", code, out, err)
			}
			return
		case code != http.StatusOK:
			t.Fatalf("status %d for %q: %q", code, body, out)
		}
		if !parsed {
			t.Fatalf("200 for a body that is not JSON: %q", body)
		}
		if !r.Stream {
			var resp struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.Usage.CompletionTokens != want {
				t.Fatalf("body %q: %d tokens, want %d (%v)", out, resp.Usage.CompletionTokens, want, err)
			}
			return
		}
		events := 0
		done := false
		for _, line := range strings.Split(out, "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			if done {
				t.Fatalf("event after [DONE]: %q", line)
			}
			if data == "[DONE]" {
				done = true
				continue
			}
			if !json.Valid([]byte(data)) {
				t.Fatalf("event is not valid JSON: %q", data)
			}
			events++
		}
		if !done || events != want {
			t.Fatalf("stream: %d events, [DONE] %v, want %d events", events, done, want)
		}
	})
}
