package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRoutingFlag: -routing inflight gives the same bytes whatever the parallelism,
// differs from -routing scrape with several gateways, the default is the documented
// one, and an unknown routing is refused naming the flag.
func TestRoutingFlag(t *testing.T) {
	args := []string{"-workload", "codegen", "-qps", "16", "-duration", "15s", "-seeds", "2", "-gateways", "4", "-quiet",
		"-policy", "soft-reflective", "-credit", "-format", "json"}
	in := runArgs(t, append(args, "-routing", "inflight")...)
	require.Equal(t, in, runArgs(t, append(args, "-routing", "inflight", "-parallel", "1")...))
	scrape := runArgs(t, append(args, "-routing", "scrape")...)
	require.NotEqual(t, in, scrape, "the routing matters with 4 gateways")
	require.Equal(t, scrape, runArgs(t, args...), "the default routing is scrape")

	var out, errb bytes.Buffer
	err := run([]string{"-routing", "random"}, &out, &errb)
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "-routing: "), "%v", err)
}
