package fakevllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// TestPrioritySchedulingServesUrgentFirst: under the priority policy a
// priority-0 request that arrives behind a backlog of priority-1 requests
// goes to the head of the waiting queue and gets its first token while the
// backlog has none. One seat (MaxNumSeqs 1), held by a priority-1 request A
// while the backlog and the urgent request C queue; the backlog and C are too
// long to finish during the test, so once A is done the model's state is
// stable and the assertions do not race its steps.
func TestPrioritySchedulingServesUrgentFirst(t *testing.T) {
	cfg := vllm.DefaultConfig()
	cfg.MaxNumSeqs = 1
	s, h := start(t, fakevllm.Config{SpeedUp: 4, Replica: cfg, SchedulingPolicy: fakevllm.PolicyPriority})
	// The deadline bounds every read below: a token that never comes fails
	// the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := func(prio, tokens int) string {
		return fmt.Sprintf(`{"prompt":"hello","max_tokens":%d,"stream":true,"priority":%d}`, tokens, prio)
	}
	// A: 1000 decode steps of at least 13.6 ms at 4× is over 3 s of wall
	// clock for the four posts below to land in the waiting queue (a busy
	// machine only slows the model further).
	a := post(t, ctx, h.URL+"/v1/completions", body(1, 1000))
	defer a.Body.Close()
	require.Equal(t, http.StatusOK, a.StatusCode)
	sseReader{bufio.NewScanner(a.Body)}.next(t) // A holds the seat
	// The backlog, then C. A response's headers leave after the request
	// entered the model, so each arrives after the one before.
	for range 3 {
		b := post(t, ctx, h.URL+"/v1/completions", body(1, 30000))
		defer b.Body.Close()
		require.Equal(t, http.StatusOK, b.StatusCode)
	}
	c := post(t, ctx, h.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"now"}],"max_tokens":30000,"stream":true,"priority":0}`)
	defer c.Body.Close()
	require.Equal(t, http.StatusOK, c.StatusCode)

	// C, the last to arrive, waits at the head of the queue, ahead of the
	// backlog; A still runs. (If A had finished first, the backlog's first
	// request would run instead and this fails: the machine was too slow
	// for A's 3 s, not the scheduling wrong.)
	running, waiting := s.Queues()
	require.Len(t, running, 1, "A finished before the backlog and C queued: the machine was too slow for A's 3 s, not the scheduling wrong")
	require.Equal(t, 1, running[0].Priority, "A runs")
	require.Equal(t, []fakevllm.Queued{{0, 0}, {1, 0}, {1, 0}, {1, 0}}, waiting, "C waits ahead of the backlog")

	// A finishes; C's first token reaches the client (the read blocks until
	// it does, bounded by ctx) while the backlog still has none.
	require.Eventually(t, func() bool { return s.Completed() == 1 }, time.Minute, 5*time.Millisecond, "A never finished")
	var chunk struct {
		Choices []struct{ Delta struct{ Content string } }
	}
	require.NoError(t, json.Unmarshal([]byte(sseReader{bufio.NewScanner(c.Body)}.next(t)), &chunk))
	require.Equal(t, " the", chunk.Choices[0].Delta.Content)
	running, waiting = s.Queues()
	require.Len(t, running, 1)
	require.Equal(t, 0, running[0].Priority, "C runs")
	require.GreaterOrEqual(t, running[0].Generated, 1)
	require.Equal(t, []fakevllm.Queued{{1, 0}, {1, 0}, {1, 0}}, waiting, "the backlog has no token yet")
	cancel()
}

// errorOf posts body and returns the status and the error message.
func errorOf(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp := post(t, context.Background(), url, body)
	defer resp.Body.Close()
	var e struct{ Message string }
	if resp.StatusCode != http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	}
	return resp.StatusCode, e.Message
}

// TestFCFSRefusesNonZeroPriority: without priority scheduling, priority 0 is
// served and any other priority is refused with vLLM V0's message, on both
// routes, streamed or not (a gateway writing priorities into bodies sees the
// failure a real server gives it).
func TestFCFSRefusesNonZeroPriority(t *testing.T) {
	for _, policy := range []string{"", fakevllm.PolicyFCFS} {
		_, h := start(t, fakevllm.Config{SpeedUp: 50, SchedulingPolicy: policy})
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			for _, stream := range []bool{false, true} {
				req := func(prio string) string {
					return fmt.Sprintf(`{"prompt":"x","messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":%v,"priority":%s}`, stream, prio)
				}
				code, msg := errorOf(t, h.URL+path, req("0"))
				require.Equal(t, http.StatusOK, code, "priority 0 on %s: %s", path, msg)
				for _, p := range []struct{ body, says string }{{"1", "1"}, {"-1", "-1"}, {"1.0", "1"}} {
					code, msg = errorOf(t, h.URL+path, req(p.body))
					require.Equal(t, http.StatusBadRequest, code, "priority %s on %s", p.body, path)
					require.Equal(t, "fakevllm: Got priority "+p.says+" but Priority scheduling is not enabled.", msg)
				}
			}
		}
	}
}

// TestPriorityField: the priority is an integer in JSON's sense (1.0 and 1e2
// are, "1", null and 1.5 are not) under either policy; the priority policy
// serves any integer, negative ones included.
func TestPriorityField(t *testing.T) {
	for _, policy := range []string{fakevllm.PolicyFCFS, fakevllm.PolicyPriority} {
		_, h := start(t, fakevllm.Config{SpeedUp: 50, SchedulingPolicy: policy})
		for _, p := range []string{`"1"`, `"high"`, `null`, `true`, `1.5`, `-0.5`, `1e30`, `9223372036854775808`, `[1]`, `{"a":1}`} {
			for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
				code, msg := errorOf(t, h.URL+path,
					`{"prompt":"x","messages":[{"role":"user","content":"x"}],"max_tokens":1,"priority":`+p+`}`)
				require.Equal(t, http.StatusBadRequest, code, "%s priority %s on %s", policy, p, path)
				require.Contains(t, msg, "fakevllm: priority: must be an integer, got ")
			}
		}
		if policy != fakevllm.PolicyPriority {
			continue
		}
		for _, p := range []string{`0`, `1`, `-7`, `1.0`, `1e2`, `-9223372036854775808`, `9223372036854775807`} {
			code, msg := errorOf(t, h.URL+"/v1/completions", `{"prompt":"x","max_tokens":1,"priority":`+p+`}`)
			require.Equal(t, http.StatusOK, code, "priority %s: %s", p, msg)
		}
	}
}
