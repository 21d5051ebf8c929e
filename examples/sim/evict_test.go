package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// TestEvictFlags: the streaming and eviction flags reach every row's config,
// and only the eviction rows evict.
func TestEvictFlags(t *testing.T) {
	o, err := parseFlags([]string{"-sheddable-stream", "-critical-stream=false", "-evict-started", "-evict-threshold", "1.1",
		"-evict-stall", "150ms", "-evict-grace", "1s", "-evict-max", "3", "-evict-kv", "0.95", "-evict-rows", "soft-reflective"}, nil)
	require.NoError(t, err)
	c := o.config(workload.Codegen, 16, cluster.SoftReflective, 1)
	require.True(t, c.SheddableStream)
	require.True(t, c.CriticalNoStream)
	require.Equal(t, 0.95, c.Eviction.KVThreshold)
	require.True(t, c.Eviction.Started)
	require.Equal(t, 1.1, c.Eviction.Threshold)
	require.Equal(t, 150*time.Millisecond, c.Eviction.Stall)
	require.Equal(t, time.Second, c.Eviction.Grace)
	require.Equal(t, 3, c.Eviction.MaxEvictions)
	n := 0
	for _, j := range o.jobs() {
		if j.cfg.Evict {
			n++
			require.Equal(t, cluster.SoftReflective, j.cfg.Policy)
		}
	}
	require.Equal(t, len(o.jobs())/6, n, "one row of six")
}

// TestEvictJSON: an eviction row carries its counts in JSON; the others do
// not.
func TestEvictJSON(t *testing.T) {
	out := runArgs(t, "-workload", "codegen", "-qps", "24", "-duration", "20s", "-format", "json", "-quiet", "-seeds", "1",
		"-policy", "soft-reflective", "-floor=false", "-evict-kv", "0.5")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	for i, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		if i == 0 {
			require.NotContains(t, m, "evictions")
			continue
		}
		require.Equal(t, true, m["evict"])
		require.Contains(t, m, "evictions")
		require.Greater(t, m["evictions"], 0.0, "codegen@24 overloads: from half the KV cache, eviction fires")
		require.Contains(t, m, "wasted_share")
	}
}
