package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// flowControl.enableEviction is llm-d's switch: off by default, on it gives
// the gateway an evictor with the gateway's defaults.
func TestParseConfigEnableEviction(t *testing.T) {
	require.False(t, gateway.DefaultConfig().Eviction)
	for _, tc := range []struct {
		src  string
		want bool
	}{
		{"flowControl: {}\n", false},
		{"flowControl: {enableEviction: false}\n", false},
		{"flowControl:\n  enableEviction: true\n", true},
	} {
		cfg, err := gateway.ParseConfig(strings.NewReader(tc.src))
		require.NoError(t, err, tc.src)
		require.Equal(t, tc.want, cfg.Eviction, tc.src)
		gc := gateway.GatewayConfig(cfg, nil)
		require.Equal(t, tc.want, gc.Eviction.Enabled, tc.src)
	}
	_, err := gateway.ParseConfig(strings.NewReader("flowControl:\n  enableEviction: sometimes\n"))
	require.ErrorContains(t, err, `flowControl.enableEviction (line 2): "sometimes" is not true or false`)
}

// Over HTTP against a fake vLLM with one seat: a sheddable completion runs,
// the pool reads saturated, a critical request waits in the server's queue
// with no first token. The proxy evicts the sheddable one (the server
// aborts it), the critical one runs, and once the pool has room the
// sheddable one is sent again and its client gets one 200 with the whole
// completion.
func TestProxyEvictionOverFakeVLLM(t *testing.T) {
	rc := vllm.DefaultConfig()
	rc.MaxNumSeqs = 1
	b := newStubWith(t, fakevllm.Config{SpeedUp: 10, Replica: rc})
	cfg := testConfig()
	cfg.Eviction = true
	h := newHarness(t, cfg, b)
	require.NotNil(t, h.p.Gateway().Controller().Evictor())

	type reply struct {
		code int
		body string
		err  error
	}
	send := func(objective, body string) <-chan reply {
		ch := make(chan reply, 1)
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(gateway.ObjectiveHeader, objective)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- reply{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			ch <- reply{resp.StatusCode, string(b), err}
		}()
		return ch
	}
	recv := func(ch <-chan reply) reply {
		select {
		case r := <-ch:
			require.NoError(t, r.err)
			return r
		case <-time.After(time.Minute):
			t.Fatal("no response within a minute")
			return reply{}
		}
	}
	shed := send("sheddable", `{"prompt":"`+strings.Repeat("x", 400)+`","max_tokens":300}`)
	eventually(t, "the sheddable request running", func() bool { return b.fake.Metrics().Running == 1 })
	b.saturated.Store(true)
	eventually(t, "the pool read saturated", func() bool { return h.p.Gateway().Saturation() >= 1 })
	crit := send("critical", `{"prompt":"hi","max_tokens":2}`)
	eventually(t, "the sheddable request aborted at the server", func() bool { return b.fake.Aborted() == 1 })
	c := recv(crit)
	require.Equal(t, 200, c.code, c.body)
	b.saturated.Store(false)

	r := recv(shed)
	require.Equal(t, 200, r.code, r.body)
	var comp struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &comp), "one JSON completion: %q", r.body)
	require.Len(t, comp.Choices, 1)
	require.Equal(t, 300, comp.Usage.CompletionTokens)
	require.EqualValues(t, 2, b.fake.Completed())
	require.EqualValues(t, 1, b.fake.Aborted())
	ev, ok := h.p.Gateway().Evictions()
	require.True(t, ok)
	require.Equal(t, uint64(1), ev.Requeued[1])
	for range 2 {
		_, code, reason := h.nextFinish(t)
		require.Equal(t, 200, code)
		require.Equal(t, gateway.ReasonForwarded, reason)
	}
}
