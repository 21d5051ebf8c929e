package gateway

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pick prefers backends that neither failed within EjectFor nor have
// unusable metrics, by fewest in flight; when every backend is avoided it
// falls back to the fewest in flight among all.
func TestPickAvoidsFailedAndUnusableBackends(t *testing.T) {
	p, err := NewProxy(Options{
		Config:   DefaultConfig(),
		Backends: []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"},
		Logf:     func(string, ...any) {},
	})
	require.NoError(t, err)
	defer p.Close()
	failed, unusable, healthy := p.backends[0], p.backends[1], p.backends[2]
	failed.failedAt.Store(time.Now().UnixNano())
	unusable.unusable.Store(true)
	healthy.inflight.Store(100) // busiest, but the only one not avoided
	for range 10 {
		require.Same(t, healthy, p.pick(1))
	}
	// A failure older than EjectFor no longer counts.
	failed.failedAt.Store(time.Now().Add(-2 * EjectFor).UnixNano())
	require.Same(t, failed, p.pick(1), "fewest in flight among the eligible")
	// Every backend avoided: fewest in flight among all.
	failed.failedAt.Store(time.Now().UnixNano())
	healthy.unusable.Store(true)
	failed.inflight.Store(5)
	unusable.inflight.Store(1)
	require.Same(t, unusable, p.pick(1))
}
