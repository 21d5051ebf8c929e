package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/flowcontrol"
)

// llmdPolicyConfig is an llm-d EndpointPickerConfig's flow-control part with
// three bands and the given usage-limit plugin declared and selected.
func llmdPolicyConfig(plugin string) string {
	return `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
` + plugin + `
- type: utilization-detector
  parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 200ms}
flowControl:
  defaultRequestTTL: 60s
  priorityBands:
  - {priority: 100}
  - {priority: 50}
  - {priority: 0}
  usageLimitPolicyPluginRef: limit
  saturationDetector: {pluginRef: utilization-detector}
`
}

// Every usage-limit policy llm-d has loads from an llm-d config, with its
// parameters, and the proxy builds a gate from it.
func TestParseConfigLLMDUsageLimitPolicies(t *testing.T) {
	for _, tc := range []struct {
		name, plugin string
		want         gateway.PolicyRef
	}{
		{"static", "- name: limit\n  type: static-usage-limit-policy\n  parameters: {threshold: 0.9}",
			gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 0.9}},
		{"static default", "- name: limit\n  type: static-usage-limit-policy",
			gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 1}},
		{"soft-reflective", "- name: limit\n  type: soft-reflective-ceiling-policy",
			gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName}},
		{"holdback rank", "- name: limit\n  type: priority-holdback-policy\n  parameters: {shape: linear, domain: rank, minCeiling: 0.4, maxCeiling: 0.9}",
			gateway.PolicyRef{Type: flowcontrol.PriorityHoldbackPolicyName,
				Holdback: flowcontrol.HoldbackConfig{Domain: "rank", MinCeiling: 0.4, MaxCeiling: 0.9}, Ceilings: []float64{0.9, 0.65, 0.4}}},
		{"holdback defaults", "- name: limit\n  type: priority-holdback-policy\n  parameters: {minCeiling: 0.5}",
			gateway.PolicyRef{Type: flowcontrol.PriorityHoldbackPolicyName,
				Holdback: flowcontrol.HoldbackConfig{Domain: "rank", MinCeiling: 0.5, MaxCeiling: 1}, Ceilings: []float64{1, 0.75, 0.5}}},
		{"holdback value", "- name: limit\n  type: priority-holdback-policy\n  parameters: {domain: value, minCeiling: 0.4, maxCeiling: 0.9}",
			gateway.PolicyRef{Type: flowcontrol.PriorityHoldbackPolicyName,
				Holdback: flowcontrol.HoldbackConfig{Domain: "value", MinCeiling: 0.4, MaxCeiling: 0.9}, Ceilings: []float64{0.9, 0.65, 0.4}}},
		{"holdback explicit", "- name: limit\n  type: priority-holdback-policy\n  parameters:\n    domain: explicit\n    ceilings: {100: 0.95, 50: 0.7, 10: 0.3}",
			gateway.PolicyRef{Type: flowcontrol.PriorityHoldbackPolicyName,
				Holdback: flowcontrol.HoldbackConfig{Domain: "explicit", Ceilings: map[int]float64{100: 0.95, 50: 0.7, 10: 0.3}},
				// Priority 0 is not in the map: 0, held back always.
				Ceilings: []float64{0.95, 0.7, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := gateway.ParseConfig(strings.NewReader(llmdPolicyConfig(tc.plugin)))
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Policy)
			p, err := gateway.NewProxy(gateway.Options{Config: cfg, Backends: []string{"http://127.0.0.1:1"}, Logf: func(string, ...any) {}})
			require.NoError(t, err)
			p.Close()
		})
	}
}

// A bad priority-holdback-policy parameter is refused naming the key and its
// line, as llm-d's rules say.
func TestParseConfigHoldbackErrors(t *testing.T) {
	const at = "- name: limit\n  type: priority-holdback-policy\n  parameters: "
	for _, tc := range []struct{ name, plugin, want string }{
		{"no minCeiling", at + "{maxCeiling: 0.9}", "plugins[0].parameters.minCeiling (line 7): required"},
		{"no parameters", "- name: limit\n  type: priority-holdback-policy", "plugins[0].parameters.minCeiling (line 5): required"},
		{"minCeiling 1", at + "{minCeiling: 1}", "plugins[0].parameters.minCeiling (line 7): must be in [0, 1), got 1"},
		{"minCeiling negative", at + "{minCeiling: -0.1}", "plugins[0].parameters.minCeiling (line 7): must be in [0, 1)"},
		{"maxCeiling 0", at + "{minCeiling: 0, maxCeiling: 0}", "plugins[0].parameters.maxCeiling (line 7): must be in (0, 1], got 0"},
		{"maxCeiling 1.5", at + "{minCeiling: 0.5, maxCeiling: 1.5}", "plugins[0].parameters.maxCeiling (line 7): must be in (0, 1]"},
		{"min not below max", at + "{minCeiling: 0.8, maxCeiling: 0.8}", "plugins[0].parameters.minCeiling (line 7): 0.8 must be below maxCeiling (0.8)"},
		{"shape", at + "{minCeiling: 0.5, shape: sigmoid}", `plugins[0].parameters.shape (line 7): must be "linear", got "sigmoid"`},
		{"domain", at + "{minCeiling: 0.5, domain: ordinal}", `plugins[0].parameters.domain (line 7): must be "rank", "value" or "explicit", got "ordinal"`},
		{"ceilings without explicit", at + "{minCeiling: 0.5, ceilings: {1: 0.5}}", `plugins[0].parameters.ceilings (line 7): only with domain "explicit"`},
		{"explicit without ceilings", at + "{domain: explicit}", `plugins[0].parameters.ceilings (line 7): required with domain "explicit"`},
		{"explicit with minCeiling", at + "{domain: explicit, minCeiling: 0.2, ceilings: {1: 0.5}}", "plugins[0].parameters.minCeiling (line 7): must not be set with domain explicit"},
		{"explicit with shape", at + "{domain: explicit, shape: linear, ceilings: {1: 0.5}}", "plugins[0].parameters.shape (line 7): must not be set"},
		{"explicit out of range", at + "{domain: explicit, ceilings: {100: 1.5}}", "plugins[0].parameters.ceilings.100 (line 7): must be in [0, 1], got 1.5"},
		{"explicit increasing", at + "{domain: explicit, ceilings: {100: 0.5, 0: 0.7}}",
			"plugins[0].parameters.ceilings.0 (line 7): 0.7 is above the ceiling of the higher priority 100 (0.5)"},
		{"explicit key", at + "{domain: explicit, ceilings: {high: 0.5}}", "plugins[0].parameters.ceilings.high (line 7): a key of ceilings is a priority"},
		{"explicit value", at + "{domain: explicit, ceilings: {1: [0.5]}}", "plugins[0].parameters.ceilings.1 (line 7): must be a number, not a list"},
		{"explicit twice", at + "{domain: explicit, ceilings: {1: 0.5, 01: 0.4}}", "plugins[0].parameters.ceilings.1 (line 7): a key of ceilings is a priority, a whole number, given once"},
		{"explicit not a map", at + "{domain: explicit, ceilings: [0.5]}", "plugins[0].parameters.ceilings (line 7): must be a mapping (key: value), not a list"},
		{"unknown key", at + "{minCeilng: 0.5}", "plugins[0].parameters.minCeilng (line 7): unknown field"},
		{"not a number", at + "{minCeiling: low}", `plugins[0].parameters.minCeiling (line 7): "low" is not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(llmdPolicyConfig(tc.plugin)))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "proxy: config: "), err.Error())
		})
	}
	// By type name alone, it has no default to run with.
	_, err := gateway.ParseConfig(strings.NewReader("flowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}\n"))
	require.ErrorContains(t, err, "flowControl.usageLimitPolicyPluginRef (line 1): priority-holdback-policy has no default minCeiling")
}
