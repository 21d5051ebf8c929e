package fakevllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/saturation"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, cfg fakevllm.Config) (*fakevllm.Server, *httptest.Server) {
	t.Helper()
	s, err := fakevllm.New(cfg)
	require.NoError(t, err)
	h := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close() // first: cuts open streams so the HTTP server can close
		h.Close()
	})
	return s, h
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// sseReader reads "data: " events.
type sseReader struct{ sc *bufio.Scanner }

func (r sseReader) next(t *testing.T) string {
	t.Helper()
	for r.sc.Scan() {
		line := r.sc.Text()
		if after, ok := strings.CutPrefix(line, "data: "); ok {
			return after
		}
	}
	t.Fatalf("stream ended: %v", r.sc.Err())
	return ""
}

func TestNonStreamingCompletion(t *testing.T) {
	const speedUp = 20
	_, h := start(t, fakevllm.Config{SpeedUp: speedUp})
	started := time.Now()
	resp := post(t, context.Background(), h.URL+"/v1/completions",
		`{"model":"m","prompt":"`+strings.Repeat("abcd", 100)+`","max_tokens":20}`)
	defer resp.Body.Close()
	elapsed := time.Since(started)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(t, "text_completion", out.Object)
	require.Equal(t, 100, out.Usage.PromptTokens)
	require.Equal(t, 20, out.Usage.CompletionTokens)
	require.Equal(t, "length", out.Choices[0].FinishReason)
	require.Equal(t, 20, strings.Count(out.Choices[0].Text, " ")+strings.Count(out.Choices[0].Text, "."))
	// 20 steps of at least the step model's base time, run 20× fast: the
	// response cannot come sooner (it does not finish instantly).
	minimum := time.Duration(20 * float64(vllm.DefaultStepModel().Base) / speedUp)
	require.GreaterOrEqual(t, elapsed, minimum)
}

func TestChatStreaming(t *testing.T) {
	_, h := start(t, fakevllm.Config{SpeedUp: 50})
	resp := post(t, context.Background(), h.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	r := sseReader{bufio.NewScanner(resp.Body)}
	var text strings.Builder
	for i := range 5 {
		var chunk struct {
			Object  string
			Choices []struct {
				Delta struct {
					Role, Content string
				}
				FinishReason *string `json:"finish_reason"`
			}
		}
		require.NoError(t, json.Unmarshal([]byte(r.next(t)), &chunk))
		require.Equal(t, "chat.completion.chunk", chunk.Object)
		text.WriteString(chunk.Choices[0].Delta.Content)
		if i == 0 {
			require.Equal(t, "assistant", chunk.Choices[0].Delta.Role)
		}
		if i == 4 {
			require.Equal(t, "length", *chunk.Choices[0].FinishReason)
		} else {
			require.Nil(t, chunk.Choices[0].FinishReason)
		}
	}
	require.Equal(t, " the quick brown fox jumps", text.String())
	require.Equal(t, "[DONE]", r.next(t))
}

// TestFirstTokenBeforeLast: the first SSE event reaches the client while the
// model is still generating the rest (nothing is buffered until the end).
func TestFirstTokenBeforeLast(t *testing.T) {
	s, h := start(t, fakevllm.Config{SpeedUp: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 500 tokens of at least 13.6 ms each at 2×: over 3 s of generation.
	resp := post(t, ctx, h.URL+"/v1/completions", `{"prompt":"x","max_tokens":500,"stream":true}`)
	defer resp.Body.Close()
	first := sseReader{bufio.NewScanner(resp.Body)}.next(t)
	require.Contains(t, first, `"text":" the"`)
	require.Zero(t, s.Completed(), "the request finished before its first token arrived")
	cancel()
}

// TestMetricsFollowModel: /metrics, parsed by the saturation poller's own
// parser, shows the model's queue: one request running (MaxNumSeqs 1), two
// waiting.
func TestMetricsFollowModel(t *testing.T) {
	cfg := vllm.DefaultConfig()
	cfg.MaxNumSeqs = 1
	s, h := start(t, fakevllm.Config{SpeedUp: 5, Replica: cfg})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"prompt":"` + strings.Repeat("x", 4000) + `","max_tokens":30000,"stream":true}`
	a := post(t, ctx, h.URL+"/v1/completions", body)
	defer a.Body.Close()
	ra := sseReader{bufio.NewScanner(a.Body)}
	ra.next(t) // a runs
	b := post(t, ctx, h.URL+"/v1/completions", body)
	defer b.Body.Close()
	c := post(t, ctx, h.URL+"/v1/completions", body)
	defer c.Body.Close()
	// b and c got their headers: both are in the model, and the gauges
	// show them from the end of the next step on. Scrape until they do
	// (each scrape is a real request; the loop is bounded).
	var reading saturation.Reading
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(h.URL + "/metrics")
		require.NoError(t, err)
		reading, err = saturation.ParseMetrics(resp.Body, saturation.VLLM())
		resp.Body.Close()
		require.NoError(t, err)
		if reading.Waiting == 2 || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, 2.0, reading.Waiting)
	require.Equal(t, 1.0, reading.Running)
	require.Greater(t, reading.KVUsage, 0.0)
	require.LessOrEqual(t, reading.KVUsage, s.Metrics().KVCacheUsage) // a's cache only grows
}

func TestBadRequests(t *testing.T) {
	_, h := start(t, fakevllm.Config{})
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/completions", `{`, "fakevllm: body"},
		{"/v1/completions", `{"max_tokens":3}`, "prompt: required"},
		{"/v1/completions", `{"prompt":{"a":1}}`, "prompt: must be"},
		{"/v1/completions", `{"prompt":"x","max_tokens":0}`, "max_tokens: must be >= 1"},
		{"/v1/chat/completions", `{"messages":[]}`, "messages: required"},
		{"/v1/completions", `{"prompt":"x","max_tokens":100000}`, "MaxModelLen"},
	} {
		resp := post(t, context.Background(), h.URL+tc.path, tc.body)
		var e struct{ Message string }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.body)
		require.Contains(t, e.Message, tc.want)
	}
}

func TestCloseEndsStreamsAndRefuses(t *testing.T) {
	s, err := fakevllm.New(fakevllm.Config{SpeedUp: 1})
	require.NoError(t, err)
	h := httptest.NewServer(s)
	defer h.Close()
	resp := post(t, context.Background(), h.URL+"/v1/completions", `{"prompt":"x","max_tokens":30000,"stream":true}`)
	defer resp.Body.Close()
	r := sseReader{bufio.NewScanner(resp.Body)}
	r.next(t)
	s.Close()
	for r.sc.Scan() { // the stream ends without [DONE]
		require.NotEqual(t, "data: [DONE]", r.sc.Text())
	}
	resp2 := post(t, context.Background(), h.URL+"/v1/completions", `{"prompt":"x"}`)
	resp2.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp2.StatusCode)
}

func TestConfigValidation(t *testing.T) {
	_, err := fakevllm.New(fakevllm.Config{SpeedUp: -1})
	require.ErrorContains(t, err, "fakevllm: SpeedUp")
	bad := vllm.DefaultConfig()
	bad.BlockSize = 0
	_, err = fakevllm.New(fakevllm.Config{Replica: bad})
	require.ErrorContains(t, err, "BlockSize")
	_, err = fakevllm.New(fakevllm.Config{SchedulingPolicy: "lifo"})
	require.ErrorContains(t, err, `fakevllm: SchedulingPolicy must be "fcfs" or "priority", got "lifo"`)
	prio := vllm.DefaultConfig()
	prio.PriorityScheduling = true
	for _, policy := range []string{"", fakevllm.PolicyFCFS} {
		_, err = fakevllm.New(fakevllm.Config{Replica: prio, SchedulingPolicy: policy})
		require.ErrorContains(t, err, "fakevllm: Replica.PriorityScheduling needs SchedulingPolicy")
	}
	s, err := fakevllm.New(fakevllm.Config{Replica: prio, SchedulingPolicy: fakevllm.PolicyPriority})
	require.NoError(t, err)
	s.Close()
}

// TestMetricsExportLengthsAndCache: a finished request is observed into
// vLLM's length histograms, which the saturation parser turns into the
// means its prompt-token term reads, and the cache config gives the KV
// capacity in tokens.
func TestMetricsExportLengthsAndCache(t *testing.T) {
	s, h := start(t, fakevllm.Config{SpeedUp: 50})
	resp := post(t, context.Background(), h.URL+"/v1/completions", `{"prompt":"x","max_tokens":3}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EqualValues(t, 1, s.Completed())
	m, err := http.Get(h.URL + "/metrics")
	require.NoError(t, err)
	defer m.Body.Close()
	r, err := saturation.ParseMetrics(m.Body, saturation.VLLM())
	require.NoError(t, err)
	require.Equal(t, 3.0, r.OutputMean)
	require.GreaterOrEqual(t, r.PromptMean, 1.0)
	rc := vllm.DefaultConfig()
	require.Equal(t, float64(rc.TotalBlocks*rc.BlockSize), r.KVCapacity)
}
