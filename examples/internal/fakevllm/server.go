package fakevllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
	// SchedulingPolicy is vLLM's --scheduling-policy: PolicyFCFS (also for "")
	// or PolicyPriority, which sets Replica.PriorityScheduling. Choose the
	// policy here rather than through Replica.PriorityScheduling: New refuses
	// PriorityScheduling under "fcfs", a server that would order its queue by
	// priorities it refuses to accept.
	SchedulingPolicy string
}

// The values of Config.SchedulingPolicy, named as vLLM's --scheduling-policy
// spells them.
const (
	// PolicyFCFS serves requests in arrival order and refuses a request whose
	// priority is not 0 with 400 "Got priority N but Priority scheduling is
	// not enabled.", the refusal of vLLM's V0 engine. vLLM's V1 engine accepts
	// such a request and ignores its priority (vllm-project/vllm#22997; the
	// check proposed in #23043 was not merged); the fake keeps the refusal so
	// that a gateway writing priorities to a server started without priority
	// scheduling fails loudly instead of going unprotected unnoticed.
	PolicyFCFS = "fcfs"
	// PolicyPriority orders the waiting queue by (priority, arrival), lower
	// priority first, and preempts the least urgent running request.
	PolicyPriority = "priority"
)

// Server is a fake vLLM OpenAI-compatible server. Routes:
//
//	POST /v1/completions       OpenAI completions, "stream": true for SSE
//	POST /v1/chat/completions  OpenAI chat completions, "stream": true for SSE
//	GET  /metrics              Prometheus text: vllm:num_requests_waiting,
//	                           vllm:num_requests_running, vllm:kv_cache_usage_perc,
//	                           vllm:request_prompt_tokens and
//	                           vllm:request_generation_tokens (histograms of
//	                           finished requests), vllm:cache_config_info
//
// The top-level integer field "priority" (vLLM's, default 0, lower is more
// urgent) is the request's priority in the model; see Config.SchedulingPolicy.
//
// Prompt length in tokens is estimated as one token per 4 bytes of prompt
// text (a list of token ids counts one per id); the output is exactly
// max_tokens tokens (as with vLLM's ignore_eos), generated at the pace of
// the replica model. Streams send one SSE event per token, flushed as the
// model produces them, then "data: [DONE]".
//
// A request whose client goes away (its connection closes, streamed or not,
// waiting or running) is aborted, as vLLM aborts it: it leaves the waiting
// queue or the running batch and its KV blocks are freed, which the gauges
// show at the end of the step in progress (at once if none is).
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
	switch cfg.SchedulingPolicy {
	case "", PolicyFCFS:
		if cfg.Replica.PriorityScheduling {
			return nil, fmt.Errorf("fakevllm: Replica.PriorityScheduling needs SchedulingPolicy %q, got %q", PolicyPriority, cfg.SchedulingPolicy)
		}
		cfg.SchedulingPolicy = PolicyFCFS
	case PolicyPriority:
		cfg.Replica.PriorityScheduling = true
	default:
		return nil, fmt.Errorf("fakevllm: SchedulingPolicy must be %q or %q, got %q", PolicyFCFS, PolicyPriority, cfg.SchedulingPolicy)
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
	// vLLM's length histograms of finished requests (what a gateway's
	// prompt-token term and KV projections read) and its cache config.
	lengths := []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000}
	promptH := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:request_prompt_tokens",
		Help: "Number of prefill tokens processed.", ConstLabels: labels, Buckets: lengths})
	genH := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:request_generation_tokens",
		Help: "Number of generation tokens processed.", ConstLabels: labels, Buckets: lengths})
	eng.mu.Lock()
	eng.onFinish = func(input, generated int) {
		promptH.Observe(float64(input))
		genH.Observe(float64(generated))
	}
	rc := eng.rep.Config()
	eng.mu.Unlock()
	cacheInfo := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{"model_name": cfg.Model, "block_size": strconv.Itoa(rc.BlockSize),
			"num_gpu_blocks": strconv.Itoa(rc.TotalBlocks)}})
	cacheInfo.Set(1)
	s.reg.MustRegister(promptH, genH, cacheInfo,
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

// Aborted returns the number of requests taken out of the model unfinished
// because their client went away.
func (s *Server) Aborted() uint64 { return s.eng.aborted.Load() }

// Steps returns the number of model steps run: a count that moves while the
// model works, however slowly the machine runs it.
func (s *Server) Steps() uint64 { return s.eng.steps.Load() }

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
	// Priority stays raw: absent (0) and null (refused, as vLLM's int field
	// refuses it) must be told apart, and 1.0 is as integral as 1.
	Priority json.RawMessage `json:"priority"`
}

// priority reads the request's priority: 0 when absent, else a JSON number
// with an integral value in int's range (1, -3, 1.0 and 1e2 are integers;
// JSON has no separate integer type). A string, a boolean, null or a
// fraction is an error naming the field.
func priority(raw json.RawMessage) (int, error) {
	if len(raw) == 0 {
		return 0, nil
	}
	text := string(raw) // Unmarshal hands over the value alone, without spaces
	if n, err := strconv.ParseInt(text, 10, strconv.IntSize); err == nil {
		return int(n), nil
	}
	// Only a JSON number starts with '-' or a digit; ParseFloat would also
	// take "Inf", "NaN", hexadecimal and underscores, which JSON does not.
	if c := text[0]; c == '-' || c >= '0' && c <= '9' {
		// -MinInt is a power of two, exact in a float64; int holds [MinInt, -MinInt).
		lim := -float64(math.MinInt)
		if f, err := strconv.ParseFloat(text, 64); err == nil && f == math.Trunc(f) && f >= -lim && f < lim {
			return int(f), nil
		}
	}
	const most = 40
	if len(text) > most {
		text = text[:most] + "…"
	}
	return 0, fmt.Errorf("priority: must be an integer, got %s", text)
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
	prio, err := priority(req.Priority)
	if err != nil {
		writeError(w, http.StatusBadRequest, "fakevllm: "+err.Error())
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
	if prio != 0 && s.cfg.SchedulingPolicy != PolicyPriority {
		// vLLM V0's words (see PolicyFCFS), so that a client matching on them
		// matches here too.
		writeError(w, http.StatusBadRequest, fmt.Sprintf("fakevllm: Got priority %d but Priority scheduling is not enabled.", prio))
		return
	}
	st, err := s.eng.add(input, output, prio)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, "fakevllm: "+err.Error())
		return
	}
	// A handler that returns before its request finished lost its client
	// (the context ended, or a write failed): the model drops the request.
	defer s.eng.abort(st)
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
