package fakevllm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
)

// FuzzRequest sends any body to both completion routes, streamed or not,
// through a fake server with either scheduling policy: it answers 200 with
// exactly the requested number of tokens (one SSE event each, every event
// valid JSON, then [DONE]; or one JSON body whose usage says so), or a 4xx
// JSON error whose message starts "fakevllm: ". A 200 had no priority or an
// integral one, 0 under fcfs; only fcfs refuses a priority as not enabled,
// and only a non-zero one. Never a panic, never a hang.
func FuzzRequest(f *testing.F) {
	servers := map[bool]*fakevllm.Server{}
	for _, prio := range []bool{false, true} {
		cfg := fakevllm.Config{SpeedUp: 1e6, MaxBodyBytes: 4096}
		if prio {
			cfg.SchedulingPolicy = fakevllm.PolicyPriority
		}
		s, err := fakevllm.New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(s.Close)
		servers[prio] = s
	}
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
		`{"prompt":"x","max_tokens":1,"priority":0}`,
		`{"prompt":"x","max_tokens":1,"priority":1}`,
		`{"prompt":"x","max_tokens":2,"priority":-3,"stream":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"priority":1.0}`,
		`{"prompt":"x","max_tokens":1,"priority":1e2}`,
		`{"prompt":"x","max_tokens":1,"priority":1.5}`,
		`{"prompt":"x","max_tokens":1,"priority":"1"}`,
		`{"prompt":"x","max_tokens":1,"priority":null}`,
		`{"prompt":"x","max_tokens":1,"priority":true}`,
		`{"prompt":"x","max_tokens":1,"priority":9223372036854775808}`,
		`{"prompt":"x","max_tokens":1,"priority":-9223372036854775808}`,
		`{"prompt":"x","max_tokens":1,"priority":1e400}`,
		`{"prompt":"x","max_tokens":1,"priority":-0}`,
		`{"prompt":"x","max_tokens":1,"Priority":2,"priority":0}`,
	} {
		for _, chat := range []bool{false, true} {
			for _, prio := range []bool{false, true} {
				f.Add(chat, prio, b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, chat, prio bool, body string) {
		s := servers[prio]
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
		// The priority as sent, decoded apart (a string priority must not
		// make the rest of the body unreadable to the oracle).
		var p struct {
			Priority json.RawMessage `json:"priority"`
		}
		_ = json.Unmarshal([]byte(body), &p)
		// Servable: absent, or a number (null decodes into a float64 without
		// an error, and vLLM's int field refuses it) with an integral value
		// that an int64 holds.
		var prioVal float64
		prioOK := len(p.Priority) == 0 || !bytes.Equal(p.Priority, []byte("null")) &&
			json.Unmarshal(p.Priority, &prioVal) == nil && prioVal == math.Trunc(prioVal) && prioVal >= -(1<<63) && prioVal < 1<<63
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
			if strings.Contains(e.Message, "Priority scheduling is not enabled") && (prio || !prioOK || prioVal == 0) {
				t.Fatalf("priority policy %v, priority %s: refused as not enabled: %q", prio, p.Priority, e.Message)
			}
			return
		case code != http.StatusOK:
			t.Fatalf("status %d for %q: %q", code, body, out)
		}
		if !parsed {
			t.Fatalf("200 for a body that is not JSON: %q", body)
		}
		if !prioOK || !prio && prioVal != 0 {
			t.Fatalf("200 under priority policy %v for priority %s", prio, p.Priority)
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
