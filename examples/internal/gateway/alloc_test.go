package gateway

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestForwardPathAllocFree: the per-response pieces of the proxy that were
// made allocation-free stay so — stripOwnHeaders (it deletes by the
// canonical keys), the reverse proxies' copy-buffer pool, and answer for a
// forwarded 200 once its counter has been looked up — and they still do
// their job.
func TestForwardPathAllocFree(t *testing.T) {
	p, err := NewProxy(Options{Config: DefaultConfig(), Backends: []string{"http://127.0.0.1:1"}, Logf: func(string, ...any) {}})
	require.NoError(t, err)
	defer p.Close()

	resp := &http.Response{Header: http.Header{}}
	fill := func() {
		resp.Header.Set(BandHeader, "b")
		resp.Header.Set(ReasonHeader, "r")
		resp.Header.Set("Content-Type", "application/json")
	}
	fill()
	require.NoError(t, stripOwnHeaders(resp))
	require.Equal(t, http.Header{"Content-Type": {"application/json"}}, resp.Header, "the backend's copies of the proxy's headers are removed, nothing else")
	if a := testing.AllocsPerRun(100, func() {
		resp.Header[bandKey], resp.Header[reasonKey] = nil, nil
		_ = stripOwnHeaders(resp)
	}); a != 0 {
		t.Errorf("stripOwnHeaders: %v allocations per response", a)
	}

	buf := copyBuffers.Get()
	require.Len(t, buf, copyBufferSize)
	copyBuffers.Put(buf)
	copyBuffers.Put(make([]byte, 10)) // not one of the pool's: dropped, not kept
	if !raceEnabled {
		if a := testing.AllocsPerRun(100, func() { copyBuffers.Put(copyBuffers.Get()) }); a != 0 {
			t.Errorf("copy buffer pool: %v allocations per Get/Put", a)
		}
	}

	p.answer(1, http.StatusOK, ReasonForwarded).Inc()
	if a := testing.AllocsPerRun(100, func() { p.answer(1, http.StatusOK, ReasonForwarded).Inc() }); a != 0 {
		t.Errorf("answer (forwarded 200): %v allocations per request", a)
	}
	p.answer(1, http.StatusServiceUnavailable, ReasonBackendError).Inc()
	require.Equal(t, map[string]int{"sheddable 200 forwarded": 102, "sheddable 503 backend-error": 1}, p.Answers(),
		"the cached counter is the vector's own series; no series for a band that never answered")
}
