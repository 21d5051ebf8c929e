package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/flowcontrol"
)

// A real llm-d EndpointPickerConfig parses: llm-d's flowControl fields mean
// what they mean there, the rest is ignored with a warning.
func TestParseConfigLLMDEndpointPickerConfig(t *testing.T) {
	f, err := os.Open("testdata/llmd-epp-config.yaml")
	require.NoError(t, err)
	defer f.Close()
	cfg, err := gateway.ParseConfig(f)
	require.NoError(t, err)
	require.Equal(t, []gateway.Band{
		// maxRequests "2k" is capped by the global "1k"; maxBytes from the
		// template (512Mi); max wait from defaultRequestTTL.
		// Its own fairnessPolicyRef (round-robin), the template's ordering.
		{Name: "priority100", Priority: 100, Capacity: 1000, MaxWait: time.Minute, MaxBytes: 512 << 20,
			Fairness: flowcontrol.FairnessRoundRobin, Ordering: flowcontrol.OrderingFCFS},
		// capacity from the template ("500"); its own maxBytes; the template's
		// global-strict fairness (fcfs) and fcfs ordering.
		{Name: "priority0", Priority: 0, Capacity: 500, MaxWait: time.Minute, MaxBytes: 1 << 30,
			Fairness: flowcontrol.FairnessFCFS, Ordering: flowcontrol.OrderingFCFS},
		{Name: "priority-10", Priority: -10, Capacity: 200, MaxWait: time.Minute, MaxBytes: 1 << 20,
			Fairness: flowcontrol.FairnessFCFS, Ordering: flowcontrol.OrderingFCFS},
	}, cfg.Bands)
	require.Equal(t, gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName}, cfg.Policy)
	require.Equal(t, 2, cfg.DefaultBand)
	require.Equal(t, 0, cfg.Objectives["critical"])
	require.Equal(t, 2, cfg.Objectives["sheddable"])
	require.Equal(t, 8.0, cfg.Saturation.QueueDepthThreshold)
	require.Equal(t, 0.9, cfg.Saturation.KVCacheUtilThreshold)
	require.Equal(t, 250*time.Millisecond, cfg.Saturation.MetricsStalenessThreshold)
	warnings := strings.Join(cfg.Warnings, "\n")
	for _, w := range []string{"featureGates (line 6): ignored", "schedulingProfiles (line 19): ignored",
		`plugin type "queue-scorer" ignored`, `plugin type "max-score-picker" ignored`,
		"flowControl.maxRequests/maxBytes: applied per band"} {
		require.Contains(t, warnings, w)
	}
	require.NotContains(t, warnings, "fairness", "fairness policies are flowgate's now")
	require.Len(t, cfg.Warnings, 5, warnings)
}

func TestParseConfigLLMDErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"bad quantity", "flowControl:\n  maxRequests: lots\n", `flowControl.maxRequests (line 2): "lots" is not a quantity`},
		{"fractional quantity", "flowControl:\n  priorityBands:\n    - {priority: 1, maxRequests: 1.5}\n",
			`flowControl.priorityBands[0].maxRequests (line 3): "1.5" is not a whole number of requests`},
		{"negative quantity", "flowControl:\n  priorityBands:\n    - {priority: 1, maxBytes: -1Gi}\n",
			`flowControl.priorityBands[0].maxBytes (line 3): "-1Gi" is negative: a number of bytes is 0 or more`},
		{"capacity and maxRequests", "flowControl:\n  priorityBands:\n    - {priority: 1, capacity: 3, maxRequests: 3}\n", "give one"},
		{"NUL in a band name", "flowControl:\n  priorityBands:\n    - {name: \"a\\0b\", priority: 1}\n", `flowControl.priorityBands[0].name (line 3)`},
		{"control char in a name", "flowControl:\n  priorityBands:\n    - {name: \"a\\tb\", priority: 1}\n", "printable"},
		{"band capacity", "flowControl:\n  priorityBands:\n    - {priority: 1, maxRequests: 5Mi}\n",
			"flowControl.priorityBands[0].maxRequests (line 3): must be in 1..4194304"},
		{"64 bands of 2^24", sixtyFourBands(), "must be in 1.."},
		{"bands add up", "flowControl:\n  priorityBands:\n    - {priority: 1, capacity: 4000000}\n    - {priority: 2, capacity: 400000}\n",
			"add up to more than 4194304"},
		{"scrape interval 1ns", "saturationDetector:\n  scrapeInterval: 1ns\n", "saturationDetector.scrapeInterval (line 2): must be in"},
		{"staleness 87600h", "saturationDetector:\n  metricsStalenessThreshold: 87600h\n", "saturationDetector.metricsStalenessThreshold (line 2): must be in"},
		{"engine", "saturationDetector:\n  engine: llama\n", `must be vllm or sglang, got "llama"`},
		{"body priority", "flowControl:\n  bodyPriority: map\n", `must be keep, strip, ignore or set, got "map"`},
		{"detector ref", "flowControl:\n  saturationDetector: {pluginRef: concurrency-detector}\n", "not a declared utilization-detector plugin"},
		{"detector param", "plugins:\n  - type: utilization-detector\n    parameters: {queueDepth: 5}\n", "plugins[0].parameters.queueDepth (line 3): unknown field"},
		{"template field", "flowControl:\n  defaultPriorityBand: {maxRequest: 5}\n", "flowControl.defaultPriorityBand.maxRequest (line 2): unknown field"},
		{"negative ttl", "flowControl:\n  defaultRequestTTL: -1s\n", "flowControl.defaultRequestTTL (line 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(tc.src))
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "proxy: config: "), err.Error())
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestParseConfigLLMDQuantities: maxRequests and maxBytes take every
// Kubernetes quantity llm-d's resource.ParseQuantity takes, as a whole count;
// a fraction, a negative or too large a value is refused naming the field,
// its line and why.
func TestParseConfigLLMDQuantities(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader(`
flowControl:
  priorityBands:
    - {priority: 5, maxRequests: 1e3, maxBytes: 1.5Gi}
    - {priority: 4, maxRequests: 2k, maxBytes: 10Gi}
    - {priority: 3, maxRequests: "+5", maxBytes: 1E}
    - {priority: 2, maxRequests: 1E3, maxBytes: 128974848000m}
    - {priority: 1, maxRequests: 0.5Ki, maxBytes: 129e6}
`))
	require.NoError(t, err)
	var got [][2]int64
	for _, b := range cfg.Bands {
		got = append(got, [2]int64{int64(b.Capacity), b.MaxBytes})
	}
	require.Equal(t, [][2]int64{{1000, 3 << 29}, {2000, 10 << 30}, {5, 1e18}, {1000, 128974848}, {512, 129e6}}, got)

	for _, tc := range []struct{ name, src, want string }{
		{"milli bytes", "flowControl:\n  maxBytes: 500m\n",
			`flowControl.maxBytes (line 2): "500m" is not a whole number of bytes`},
		{"half a request", "flowControl:\n  priorityBands:\n    - {priority: 1}\n    - {priority: 2, maxRequests: 0.5}\n",
			`flowControl.priorityBands[1].maxRequests (line 4): "0.5" is not a whole number of requests`},
		{"milli requests in the template", "flowControl:\n  defaultPriorityBand:\n    maxRequests: 500m\n",
			`flowControl.defaultPriorityBand.maxRequests (line 3): "500m" is not a whole number of requests`},
		{"overflow", "flowControl:\n  maxBytes: 9Ei\n",
			`flowControl.maxBytes (line 2): "9Ei" is too large: at most 4611686018427387903 bytes (2^62 − 1)`},
		{"overflow by exponent", "flowControl:\n  maxRequests: 1e30\n",
			`flowControl.maxRequests (line 2): "1e30" is too large: at most 4611686018427387903 requests (2^62 − 1)`},
		{"a byte unit", "flowControl:\n  priorityBands:\n    - {priority: 1, maxBytes: 1GB}\n",
			`flowControl.priorityBands[0].maxBytes (line 3): "1GB" is not a quantity: quantities are written like 500, 1k, 1e3, 1.5Gi or 512Mi`},
		{"a list", "flowControl:\n  maxBytes: [1Gi]\n",
			`flowControl.maxBytes (line 2): must be a quantity such as 500, "1k" or "10Gi", not a list`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(tc.src))
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "proxy: config: "+tc.want), err.Error())
		})
	}
}

func sixtyFourBands() string {
	var b strings.Builder
	b.WriteString("flowControl:\n  priorityBands:\n")
	for i := range 64 {
		fmt.Fprintf(&b, "    - {priority: %d, capacity: 16777216}\n", i)
	}
	return b.String()
}
