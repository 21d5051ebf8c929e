package fakevllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// Config configures New. Zero fields take the documented defaults.
type Config struct {
	// Replica is the modelled vLLM engine. Zero value: vllm.DefaultConfig()
	// (Qwen3-14B on one H100, as calibrated by the simulator).
	Replica vllm.Config
	// SpeedUp is model seconds per wall-clock second: 10 runs the model ten
	// times faster than the hardware it models. Default 1.
	SpeedUp float64
	// Model is the model name served and echoed. Default "Qwen/Qwen3-14B".
	Model string
	// DefaultMaxTokens is the output length of a request without
	// max_tokens (OpenAI's default for completions is 16). Default 16.
	DefaultMaxTokens int
	// MaxBodyBytes caps a request body. Default 1 MiB.
	MaxBodyBytes int64
}

// Server is a fake vLLM OpenAI-compatible server. Routes:
//
//	POST /v1/completions       OpenAI completions, "stream": true for SSE
//	POST /v1/chat/completions  OpenAI chat completions, "stream": true for SSE
//	GET  /metrics              Prometheus text: vllm:num_requests_waiting,
//	                           vllm:num_requests_running, vllm:kv_cache_usage_perc
//
// Prompt length in tokens is estimated as one token per 4 bytes of prompt
// text (a list of token ids counts one per id); the output is exactly
// max_tokens tokens (as with vLLM's ignore_eos), generated at the pace of
// the replica model. Streams send one SSE event per token, flushed as the
// model produces them, then "data: [DONE]".
type Server struct {
	cfg     Config
	eng     *engine
	mux     *http.ServeMux
	reg     *prometheus.Registry
	nextID  atomic.Uint64
	created int64
}

// New starts the model's real-time driver; Close stops it.
func New(cfg Config) (*Server, error) {
	if cfg.Replica == (vllm.Config{}) {
		cfg.Replica = vllm.DefaultConfig()
	}
	if cfg.SpeedUp == 0 {
		cfg.SpeedUp = 1
	}
	if !(cfg.SpeedUp > 0) || cfg.SpeedUp > 1e6 {
		return nil, fmt.Errorf("fakevllm: SpeedUp must be in (0, 1e6], got %v", cfg.SpeedUp)
	}
	if cfg.Model == "" {
		cfg.Model = "Qwen/Qwen3-14B"
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.DefaultMaxTokens < 0 {
		return nil, fmt.Errorf("fakevllm: DefaultMaxTokens must be >= 0, got %d", cfg.DefaultMaxTokens)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	eng, err := newEngine(cfg.Replica, cfg.SpeedUp)
	if err != nil {
		return nil, fmt.Errorf("fakevllm: %w", err)
	}
	s := &Server{cfg: cfg, eng: eng, mux: http.NewServeMux(), reg: prometheus.NewRegistry(), created: time.Now().Unix()}
	labels := prometheus.Labels{"model_name": cfg.Model}
	gauge := func(name, help string, f func(vllm.Metrics) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(eng.snapshot()) })
	}
	s.reg.MustRegister(
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed (includes preempted).",
			func(m vllm.Metrics) float64 { return float64(m.Waiting) }),
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
			func(m vllm.Metrics) float64 { return float64(m.Running) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
			func(m vllm.Metrics) float64 { return m.KVCacheUsage }),
	)
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, false) })
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, true) })
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the model: requests still generating get their stream cut
// (non-streaming ones a 503). Idempotent.
func (s *Server) Close() { s.eng.close() }

// Completed returns the number of requests the model has finished.
func (s *Server) Completed() uint64 { return s.eng.completed.Load() }

// Lost returns the wall-clock time by which the model's driver fell behind
// real time (scaled by SpeedUp) and gave up catching up: on a machine too
// busy to run the model at speed, latencies measured against this server
// are not those of the modelled hardware. Zero on a machine that keeps up.
func (s *Server) Lost() time.Duration { return time.Duration(s.eng.lost.Load()) }

// Metrics returns the gauges /metrics serves (as of the last model step).
func (s *Server) Metrics() vllm.Metrics { return s.eng.snapshot() }

// request is the part of an OpenAI request body the fake reads.
type request struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// promptTokens estimates the prompt length: 4 bytes of text per token, one
// per token id. It returns an error naming the field for a malformed prompt.
func promptTokens(req *request, chat bool) (int, error) {
	textTokens := func(n int) int { return (n + 3) / 4 }
	if chat {
		if len(req.Messages) == 0 {
			return 0, errors.New("messages: required")
		}
		n := 0
		for i, m := range req.Messages {
			var text string
			if err := json.Unmarshal(m.Content, &text); err != nil {
				// Content parts: count the bytes of the raw JSON.
				if len(m.Content) == 0 {
					return 0, fmt.Errorf("messages[%d].content: required", i)
				}
				n += textTokens(len(m.Content))
				continue
			}
			n += textTokens(len(text)) + 4 // role and separators
		}
		return max(n, 1), nil
	}
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 {
		return 0, errors.New("prompt: required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return max(textTokens(len(text)), 1), nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		n := 0
		for _, t := range texts {
			n += textTokens(len(t))
		}
		return max(n, 1), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return max(len(ids), 1), nil
	}
	return 0, errors.New("prompt: must be a string, a list of strings or a list of token ids")
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"object": "error", "message": msg, "type": http.StatusText(status), "code": status,
	})
}

// words is the fake's vocabulary: token i of every response is words[i%len].
var words = [...]string{" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "fakevllm: body: "+err.Error())
		return
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "fakevllm: body: "+err.Error())
		return
	}
	input, err := promptTokens(&req, chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, "fakevllm: "+err.Error())
		return
	}
	output := s.cfg.DefaultMaxTokens
	field := "max_tokens"
	if req.MaxTokens != nil {
		output = *req.MaxTokens
	}
	if chat && req.MaxCompletionTokens != nil {
		output, field = *req.MaxCompletionTokens, "max_completion_tokens"
	}
	if output < 1 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("fakevllm: %s: must be >= 1, got %d", field, output))
		return
	}
	st, err := s.eng.add(input, output)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, "fakevllm: "+err.Error())
		return
	}
	model := req.Model
	if model == "" {
		model = s.cfg.Model
	}
	id := s.nextID.Add(1)
	if req.Stream {
		s.stream(w, r, st, chat, model, id)
		return
	}
	n, fin := 0, false
	for !fin {
		if n, fin, err = s.eng.next(r.Context(), st, n); err != nil {
			if errors.Is(err, ErrClosed) {
				writeError(w, http.StatusServiceUnavailable, "fakevllm: "+err.Error())
			}
			return // client gone: nobody to answer
		}
	}
	var text bytes.Buffer
	for i := range n {
		text.WriteString(words[i%len(words)])
	}
	usage := map[string]int{"prompt_tokens": input, "completion_tokens": n, "total_tokens": input + n}
	var resp map[string]any
	if chat {
		resp = map[string]any{
			"id": "chatcmpl-" + strconv.FormatUint(id, 10), "object": "chat.completion", "created": s.created, "model": model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "length",
				"message": map[string]any{"role": "assistant", "content": text.String()}}},
			"usage": usage,
		}
	} else {
		resp = map[string]any{
			"id": "cmpl-" + strconv.FormatUint(id, 10), "object": "text_completion", "created": s.created, "model": model,
			"choices": []any{map[string]any{"index": 0, "text": text.String(), "logprobs": nil, "finish_reason": "length"}},
			"usage":   usage,
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// stream writes one SSE event per token as the model produces them and
// flushes after each batch of new tokens, so the first token leaves as soon
// as the model samples it.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, st *stream, chat bool, model string, id uint64) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	idStr := "cmpl-" + strconv.FormatUint(id, 10)
	object := "text_completion"
	if chat {
		idStr, object = "chatcmpl-"+strconv.FormatUint(id, 10), "chat.completion.chunk"
	}
	// JSON string quoting, not Go's %q: the model name is the client's and
	// may hold control characters or invalid UTF-8.
	quote := func(v string) []byte { b, _ := json.Marshal(v); return b }
	head := fmt.Sprintf(`{"id":%s,"object":%s,"created":%d,"model":%s,"choices":[{"index":0,`, quote(idStr), quote(object), s.created, quote(model))
	var buf bytes.Buffer
	sent := 0
	for {
		n, fin, err := s.eng.next(r.Context(), st, sent)
		if err != nil {
			return // client gone or server closing: the stream ends without [DONE]
		}
		buf.Reset()
		for ; sent < n; sent++ {
			word, _ := json.Marshal(words[sent%len(words)])
			finish := "null"
			if fin && sent == n-1 {
				finish = `"length"`
			}
			buf.WriteString("data: ")
			buf.WriteString(head)
			if chat {
				if sent == 0 {
					buf.WriteString(`"delta":{"role":"assistant","content":`)
				} else {
					buf.WriteString(`"delta":{"content":`)
				}
				buf.Write(word)
				buf.WriteString(`},"logprobs":null,"finish_reason":`)
			} else {
				buf.WriteString(`"text":`)
				buf.Write(word)
				buf.WriteString(`,"logprobs":null,"finish_reason":`)
			}
			buf.WriteString(finish)
			buf.WriteString("}]}\n\n")
		}
		if fin {
			buf.WriteString("data: [DONE]\n\n")
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if fin {
			return
		}
	}
}
