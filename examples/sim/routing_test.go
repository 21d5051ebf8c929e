package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/saturation/redisshare"

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

// TestSharedInFlightDefault: the simulator's gateways share their view at the period the
// proxy's replicas ship (redisshare.DefaultPeriod), and the default is what runs: with 4
// gateways it gives the bytes of -shared-inflight 5ms, not those of off.
func TestSharedInFlightDefault(t *testing.T) {
	d, err := time.ParseDuration(DefaultSharedInFlight)
	require.NoError(t, err)
	require.Equal(t, redisshare.DefaultPeriod, d)

	args := []string{"-workload", "codegen", "-qps", "16", "-duration", "15s", "-seeds", "1", "-gateways", "4", "-quiet",
		"-policy", "soft-reflective", "-credit", "-format", "json"}
	def := runArgs(t, args...)
	require.Equal(t, runArgs(t, append(args, "-shared-inflight", "5ms")...), def)
	require.NotEqual(t, runArgs(t, append(args, "-shared-inflight", "off")...), def, "sharing matters with 4 gateways")
}
