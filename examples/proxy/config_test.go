package main

import (
	"fmt"
	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestParseConfigSample(t *testing.T) {
	f, err := os.Open("config.yaml")
	require.NoError(t, err)
	defer f.Close()
	cfg, err := gateway.ParseConfig(f)
	require.NoError(t, err)
	require.Equal(t, []gateway.Band{
		{Name: "critical", Priority: 100, Capacity: 1024, MaxWait: 30 * time.Second, MaxBytes: 1 << 30},
		{Name: "sheddable", Priority: 0, Capacity: 4096, MaxWait: 120 * time.Second, MaxBytes: 2 << 30},
	}, cfg.Bands)
	require.Empty(t, cfg.Warnings)
	require.Equal(t, gateway.BodyPriorityKeep, cfg.BodyPriority)
	require.Equal(t, gateway.PolicyRef{Type: flowcontrol.SoftReflectivePolicyName}, cfg.Policy)
	require.Equal(t, 1, cfg.DefaultBand)
	require.Equal(t, map[string]int{"critical": 0, "interactive": 0, "sheddable": 1, "batch": 1}, cfg.Objectives)
	require.Equal(t, gateway.SaturationConfig{
		QueueDepthThreshold: 0, KVCacheUtilThreshold: 0.8,
		MetricsStalenessThreshold: 200 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond,
		InFlightCredit: true, Engine: gateway.EngineVLLM,
	}, cfg.Saturation)
}

// TestParseConfigSwitchIsOneLine: the article's baseline → soft-reflective
// switch is the one usageLimitPolicyPluginRef line of the sample.
func TestParseConfigSwitchIsOneLine(t *testing.T) {
	data, err := os.ReadFile("config.yaml")
	require.NoError(t, err)
	src := string(data)
	const line = "usageLimitPolicyPluginRef: soft-reflective\n"
	require.Equal(t, 1, strings.Count(src, line))
	cfg, err := gateway.ParseConfig(strings.NewReader(strings.Replace(src, line, "usageLimitPolicyPluginRef: baseline\n", 1)))
	require.NoError(t, err)
	require.Equal(t, gateway.PolicyRef{Type: flowcontrol.StaticPolicyName, Threshold: 1.0}, cfg.Policy)
}

func TestParseConfigInFlightCredit(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader("saturationDetector: {inFlightCredit: true}\n"))
	require.NoError(t, err)
	require.True(t, cfg.Saturation.InFlightCredit)
	require.True(t, gateway.DefaultConfig().Saturation.InFlightCredit)
}

// flowControl.criticalKVHeadroom: unset is the gateway's default (on at 0.1
// with bodyPriority set, off otherwise), 0 turns it off, a value turns it on.
func TestParseConfigCriticalKVHeadroom(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want float64
	}{
		{"flowControl: {}\n", 0},
		{"flowControl: {bodyPriority: set}\n", flowhttp.DefaultCriticalKVHeadroom},
		{"flowControl: {bodyPriority: set, criticalKVHeadroom: 0}\n", 0},
		{"flowControl: {bodyPriority: set, criticalKVHeadroom: 0.2}\n", 0.2},
		{"flowControl: {criticalKVHeadroom: 0.05}\n", 0.05},
	} {
		cfg, err := gateway.ParseConfig(strings.NewReader(tc.src))
		require.NoError(t, err, tc.src)
		gw, err := flowhttp.NewGateway(gateway.GatewayConfig(cfg, nil))
		require.NoError(t, err, tc.src)
		require.Equal(t, tc.want, gw.Router().CriticalKVHeadroom(), tc.src)
		gw.Close()
	}
}

func TestParseConfigEmptyIsDefault(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader(""))
	require.NoError(t, err)
	require.Equal(t, gateway.DefaultConfig(), cfg)
}

func TestParseConfigBandsSortedByPriority(t *testing.T) {
	cfg, err := gateway.ParseConfig(strings.NewReader(`
flowControl:
  priorityBands:
    - {name: batch, priority: -5}
    - {name: gold, priority: 10, capacity: 8, maxWait: 1s}
    - {name: silver, priority: 5}
`))
	require.NoError(t, err)
	require.Equal(t, []string{"gold", "silver", "batch"}, []string{cfg.Bands[0].Name, cfg.Bands[1].Name, cfg.Bands[2].Name})
	require.Equal(t, 8, cfg.Bands[0].Capacity)
	require.Equal(t, 2, cfg.DefaultBand)
	require.Equal(t, map[string]int{"gold": 0, "silver": 1, "batch": 2, "critical": 0, "sheddable": 2}, cfg.Objectives)
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string // substrings of the error
	}{
		{"unknown top-level field", "flowControll: {}\n", []string{"flowControll (line 1)", "unknown field"}},
		{"unknown nested field", "flowControl:\n  priorityBands:\n    - name: a\n      priority: 1\n      capasity: 3\n",
			[]string{"flowControl.priorityBands[0].capasity (line 5)", "unknown field"}},
		{"bad int", "flowControl:\n  priorityBands:\n    - name: a\n      priority: high\n",
			[]string{`flowControl.priorityBands[0].priority (line 4): "high" is not a whole number`}},
		{"bad duration", "saturationDetector:\n  scrapeInterval: 50\n",
			[]string{`saturationDetector.scrapeInterval (line 2): "50" is not a duration (such as "250ms" or "30s")`}},
		{"bad duration string", "saturationDetector:\n  scrapeInterval: fast\n",
			[]string{`saturationDetector.scrapeInterval (line 2): "fast" is not a duration (such as "250ms"`}},
		{"negative capacity", "flowControl:\n  priorityBands:\n    - name: a\n      priority: 1\n      capacity: -1\n",
			[]string{"flowControl.priorityBands[0].capacity (line 5)", "must be in 1.."}},
		{"missing priority", "flowControl:\n  priorityBands:\n    - name: a\n", []string{"flowControl.priorityBands[0].priority", "required"}},
		{"duplicate priority", "flowControl:\n  priorityBands:\n    - {name: a, priority: 1}\n    - {name: b, priority: 1}\n",
			[]string{"flowControl.priorityBands[1].priority (line 4)", "duplicate"}},
		{"duplicate band", "flowControl:\n  priorityBands:\n    - {name: a, priority: 1}\n    - {name: a, priority: 2}\n",
			[]string{"flowControl.priorityBands[1].name", "duplicate band"}},
		{"empty bands", "flowControl:\n  priorityBands: []\n", []string{"flowControl.priorityBands (line 2)", "at least one"}},
		{"unknown policy ref", "flowControl:\n  usageLimitPolicyPluginRef: magic\n",
			[]string{"flowControl.usageLimitPolicyPluginRef (line 2)", `"magic"`}},
		{"unknown plugin type as the policy", "plugins:\n  - {name: x, type: magic}\nflowControl: {usageLimitPolicyPluginRef: x}\n",
			[]string{"flowControl.usageLimitPolicyPluginRef (line 3)", `"x" is neither a declared policy plugin`}},
		{"threshold on soft", "plugins:\n  - type: soft-reflective-ceiling-policy\n    parameters: {threshold: 0.5}\n",
			[]string{"plugins[0].parameters.threshold (line 3): unknown field"}},
		{"bad threshold", "plugins:\n  - type: static-usage-limit-policy\n    parameters: {threshold: .nan}\n",
			[]string{"plugins[0].parameters.threshold (line 3): must be in (0, +Inf), got NaN"}},
		{"unknown param", "plugins:\n  - type: static-usage-limit-policy\n    parameters: {treshold: 0.5}\n",
			[]string{"plugins[0].parameters.treshold (line 3)", "unknown field"}},
		{"objective to missing band", "flowControl:\n  objectives:\n    gold: platinum\n",
			[]string{"flowControl.objectives.gold (line 3)", `no band named "platinum"`}},
		{"default band missing", "flowControl:\n  defaultPriorityBand: nope\n", []string{"flowControl.defaultPriorityBand (line 2)"}},
		{"kv threshold range", "saturationDetector:\n  kvCacheUtilThreshold: 1.5\n", []string{"saturationDetector.kvCacheUtilThreshold (line 2)", "(0, 1]"}},
		{"scrape slower than staleness", "saturationDetector:\n  scrapeInterval: 1s\n", []string{"saturationDetector.scrapeInterval (line 2)", "stale"}},
		{"duplicate key", "flowControl: {}\nflowControl: {}\n", []string{"flowControl (line 2): written twice (first at line 1)"}},
		{"two documents", "flowControl: {}\n---\nflowControl: {}\n", []string{"more than one YAML document"}},
		{"not yaml", "flowControl: [\n", []string{"proxy: config: line 1: not valid YAML: did not find expected node content"}},
		{"tab indent", "flowControl:\n\ttick: 1ms\n", []string{"proxy: config: line 2: not valid YAML: found character that cannot start any token"}},
		{"tab after spaces", "flowControl:\n  priorityBands:\n  \t- {priority: 1}\n", []string{"proxy: config: line 3: not valid YAML: found character that cannot start any token"}},
		{"map for a list", "flowControl:\n  priorityBands: {a: 1}\n", []string{"flowControl.priorityBands (line 2): must be a list", "not a mapping"}},
		{"long bad value", "flowControl:\n  burst: manymanymany\n", []string{`flowControl.burst (line 2): "manymanymany" is not a whole number`}},
		{"bad bool", "saturationDetector:\n  inFlightCredit: maybe\n", []string{`saturationDetector.inFlightCredit (line 2): "maybe" is not true or false`}},
		{"bad burst", "flowControl:\n  burst: 0\n", []string{"flowControl.burst (line 2)"}},
		{"critical kv headroom range", "flowControl:\n  criticalKVHeadroom: 1.5\n", []string{"flowControl.criticalKVHeadroom (line 2)", "[0, 1]"}},
		{"critical kv headroom negative", "flowControl:\n  criticalKVHeadroom: -0.1\n", []string{"flowControl.criticalKVHeadroom (line 2)", "[0, 1]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(tc.src))
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "proxy: config: "), err.Error())
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestParseConfigDecodeErrors: a value of the wrong type is an error in the
// file's terms — the key path, the line, the value as written (whole) and
// what the field takes — never yaml's Go types and tags.
func TestParseConfigDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"percentage for a fraction", "saturationDetector:\n  queueDepthThreshold: 5\n  kvCacheUtilThreshold: 80%\n",
			`saturationDetector.kvCacheUtilThreshold (line 3): "80%" is not a number`},
		{"word for a number", "saturationDetector:\n  queueDepthThreshold: five\n",
			`saturationDetector.queueDepthThreshold (line 2): "five" is not a number`},
		{"second band", "flowControl:\n  priorityBands:\n    - {name: gold, priority: 10}\n    - name: batch\n      priority: high\n",
			`flowControl.priorityBands[1].priority (line 5): "high" is not a whole number`},
		// Two keys on one line with the same value: the one that does
		// not fit is named (yaml's message gives only the line).
		{"same value twice on a line", "flowControl:\n  priorityBands:\n    - {name: high, priority: high}\n",
			`flowControl.priorityBands[0].priority (line 3): "high" is not a whole number`},
		{"fraction for a whole number", "flowControl:\n  priorityBands:\n    - {name: a, priority: 1, capacity: 2.5}\n",
			`flowControl.priorityBands[0].capacity (line 3): "2.5" is not a whole number`},
		{"int overflow", "flowControl:\n  burst: 99999999999999999999\n",
			`flowControl.burst (line 2): "99999999999999999999" is out of range for a whole number`},
		{"long value kept whole", "flowControl:\n  tick: somewhat-too-slow\n",
			`flowControl.tick (line 2): "somewhat-too-slow" is not a duration (such as "250ms" or "30s")`},
		{"very long value cut", "flowControl:\n  tick: " + strings.Repeat("x", 100) + "\n",
			`flowControl.tick (line 2): "` + strings.Repeat("x", 40) + `"… is not a duration (such as "250ms" or "30s")`},
		{"scalar for a section", "saturationDetector: 5\n",
			`saturationDetector (line 1): must be a mapping (key: value), not "5"`},
		{"list for a string", "flowControl:\n  usageLimitPolicyPluginRef: [a, b]\n",
			`flowControl.usageLimitPolicyPluginRef (line 2): must be a single value (a name or a string), not a list`},
		{"mapping for a number", "saturationDetector:\n  queueDepthThreshold: {value: 5}\n",
			`saturationDetector.queueDepthThreshold (line 2): must be a number, not a mapping (key: value)`},
		{"list for a mapping", "flowControl:\n  objectives: [a, b]\n",
			`flowControl.objectives (line 2): must be a mapping (key: value), not a list`},
		{"mapping in a string map", "flowControl:\n  objectives:\n    gold: {band: a}\n",
			`flowControl.objectives.gold (line 3): must be a single value (a name or a string), not a mapping (key: value)`},
		{"document not a mapping", "- a\n- b\n", `the document (line 1): must be a mapping (key: value), not a list`},
		{"duplicate nested key", "flowControl:\n  burst: 2\n  tick: 1ms\n  burst: 3\n",
			`flowControl.burst (line 4): written twice (first at line 2): give it once`},
		{"duplicate in a flow mapping", "flowControl:\n  priorityBands:\n    - {priority: 1, priority: 2}\n",
			`flowControl.priorityBands[0].priority (line 3): written twice (first at line 3): give it once`},
		{"the first problem in file order", "flowControl:\n  burst: many\n  tick: 5\nsaturationDetector:\n  inFlightCredit: perhaps\n",
			`flowControl.burst (line 2): "many" is not a whole number`},
		{"merged band", "flowControl:\n  priorityBands:\n    - &b {name: a, priority: 1, maxWait: 1s}\n    - <<: *b\n      name: b\n      priority: two\n",
			`flowControl.priorityBands[1].<< (line 4): a merge key: not supported, write the keys out`},
		{"bad value merged in", "flowControl:\n  priorityBands:\n    - &b {name: a, priority: 1, maxWait: soon}\n    - <<: *b\n      name: b\n      priority: 2\n",
			`flowControl.priorityBands[0].maxWait (line 3): "soon" is not a duration (such as "250ms" or "30s")`},
		{"alias where it does not fit", "featureGates: &n [x]\nflowControl:\n  tick: *n\n",
			`flowControl.tick (line 3): an alias (*n): not supported, write the value out`},
		{"policy parameter", "plugins:\n  - type: static-usage-limit-policy\n    parameters: {threshold: high}\n",
			`plugins[0].parameters.threshold (line 3): "high" is not a number`},
		{"detector parameter", "plugins:\n  - type: soft-reflective-ceiling-policy\n  - name: u\n    type: utilization-detector\n    parameters:\n      metricsStalenessThreshold: 200\n",
			`plugins[1].parameters.metricsStalenessThreshold (line 6): "200" is not a duration (such as "250ms" or "30s")`},
		{"band template", "flowControl:\n  defaultPriorityBand:\n    flowCapacity: lots\n",
			`flowControl.defaultPriorityBand.flowCapacity (line 3): "lots" is not a whole number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(tc.src))
			require.Error(t, err)
			require.Equal(t, "proxy: config: "+tc.want, err.Error())
		})
	}
}

// TestParseConfigUnknownKey: a misspelt key is refused naming its path and
// line, in strictly decoded sections and in plugin parameters and the band
// template alike.
func TestParseConfigUnknownKey(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"top level, case", "flowcontrol:\n  tick: 1ms\n", "flowcontrol (line 1): unknown field"},
		{"section", "saturationDetector:\n  queueDepthTreshold: 5\n",
			"saturationDetector.queueDepthTreshold (line 2): unknown field"},
		{"band", "flowControl:\n  priorityBands:\n    - name: a\n      priority: 1\n      capasity: 3\n",
			"flowControl.priorityBands[0].capasity (line 5): unknown field"},
		{"swapped letters", "saturationDetector:\n  kvCahceUtilThreshold: 0.8\n",
			"saturationDetector.kvCahceUtilThreshold (line 2): unknown field"},
		{"policy parameter", "plugins:\n  - type: static-usage-limit-policy\n    parameters: {treshold: 0.5}\n",
			"plugins[0].parameters.treshold (line 3): unknown field"},
		{"detector parameter", "plugins:\n  - type: utilization-detector\n    parameters: {queueDepthTreshold: 5}\n",
			"plugins[0].parameters.queueDepthTreshold (line 3): unknown field"},
		{"band template", "flowControl:\n  defaultPriorityBand: {maxRequest: 5}\n",
			"flowControl.defaultPriorityBand.maxRequest (line 2): unknown field"},
		{"shared section", "sharedInFlight:\n  address: redis:6379\n  replicaID: a\n",
			"sharedInFlight.replicaID (line 3): unknown field"},
		{"nothing close", "plugins:\n  - type: utilization-detector\n    parameters: {queueDepth: 5}\n",
			"plugins[0].parameters.queueDepth (line 3): unknown field"},
		{"nothing close, strict", "flowControl:\n  bands: []\n", "flowControl.bands (line 2): unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseConfig(strings.NewReader(tc.src))
			require.Error(t, err)
			require.Equal(t, "proxy: config: "+tc.want, err.Error())
		})
	}
}

// FuzzParseConfig: any input either parses into a configuration that holds
// the invariants the proxy relies on, or is a "proxy: config:" error in the
// file's terms (never yaml's Go types and tags); never a panic.
func FuzzParseConfig(f *testing.F) {
	if data, err := os.ReadFile("config.yaml"); err == nil {
		f.Add(string(data))
	}
	f.Add("")
	f.Add("flowControl:\n  priorityBands:\n    - {name: a, priority: 1, capacity: 3, maxWait: 1s}\n")
	f.Add("plugins:\n  - type: static-usage-limit-policy\n    parameters: {threshold: 0.9}\nflowControl: {usageLimitPolicyPluginRef: static-usage-limit-policy}\n")
	f.Add("saturationDetector: {scrapeInterval: 10ms, metricsStalenessThreshold: 5ms}\n")
	f.Add("flowControl: {objectives: {x: y}}\n")
	f.Add("a: &a [*a]\n")
	f.Add("plugins:\n  - {name: rr, type: round-robin-fairness-policy}\nflowControl:\n  defaultPriorityBand: {fairnessPolicyRef: rr, flowCapacity: 2}\n  priorityBands:\n    - {priority: 1, capacity: 3, orderingPolicyRef: edf-ordering-policy}\n")
	f.Add("flowControl:\n  priorityBands:\n    - {priority: 1, fairness: fair-share, fairnessPolicyRef: program-aware-fairness, flowCapacity: 9}\n")
	f.Add("flowControl:\n  priorityBands:\n    - &b {name: a, priority: 1}\n    - <<: *b\n      priority: two\n")
	f.Add("saturationDetector: {kvCacheUtilThreshold: 80%, inFlightCredit: maybe, scrapeInterval: 50}\nflowControl: {burst: 2.5, objectives: [a]}\n")
	f.Add("featureGates: &n [x]\nflowControl: {tick: *n, burst: *n}\nplugins:\n  - {type: static-usage-limit-policy, parameters: {threshold: high}}\n")
	f.Add("plugins:\n  - {name: h, type: priority-holdback-policy, parameters: {shape: linear, domain: rank, minCeiling: 0.4, maxCeiling: 0.9}}\nflowControl:\n  usageLimitPolicyPluginRef: h\n  priorityBands:\n    - {priority: 100}\n    - {priority: 50}\n    - {priority: 0}\n")
	f.Add("plugins:\n  - {type: priority-holdback-policy, parameters: {domain: value, minCeiling: 0}}\nflowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}\n")
	f.Add("plugins:\n  - type: priority-holdback-policy\n    parameters:\n      domain: explicit\n      ceilings: {100: 0.95, 50: 0.7, 10: 0.3}\nflowControl:\n  usageLimitPolicyPluginRef: priority-holdback-policy\n  priorityBands: [{priority: 100}, {priority: 10}, {priority: 5}]\n")
	f.Add("plugins:\n  - type: priority-holdback-policy\n    parameters: {domain: explicit, ceilings: {1: 0.2, 0: 0.5}}\nflowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}\n")
	f.Add("plugins:\n  - {type: priority-holdback-policy, parameters: {minCeiling: 0.9, maxCeiling: 0.5, ceilings: [1]}}\nflowControl: {usageLimitPolicyPluginRef: priority-holdback-policy}\n")
	f.Fuzz(func(t *testing.T, src string) {
		cfg, err := gateway.ParseConfig(strings.NewReader(src))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "proxy: config: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			for _, raw := range []string{"cannot unmarshal", "not found in type", "already defined at", "already set in type"} {
				if strings.Contains(err.Error(), raw) {
					t.Fatalf("yaml's own message passed through: %v", err)
				}
			}
			return
		}
		if len(cfg.Bands) == 0 {
			t.Fatal("no bands")
		}
		if cfg.DefaultBand < 0 || cfg.DefaultBand >= len(cfg.Bands) {
			t.Fatalf("default band %d of %d", cfg.DefaultBand, len(cfg.Bands))
		}
		for i, b := range cfg.Bands {
			if b.Capacity <= 0 || b.MaxWait < 0 {
				t.Fatalf("band %d: %+v", i, b)
			}
			if i > 0 && b.Priority >= cfg.Bands[i-1].Priority {
				t.Fatalf("bands not in descending priority: %+v", cfg.Bands)
			}
		}
		for o, i := range cfg.Objectives {
			if i < 0 || i >= len(cfg.Bands) {
				t.Fatalf("objective %q → band %d of %d", o, i, len(cfg.Bands))
			}
		}
		switch cfg.Policy.Type {
		case flowcontrol.StaticPolicyName, flowcontrol.SoftReflectivePolicyName:
		case flowcontrol.PriorityHoldbackPolicyName:
			// One ceiling per band, in [0, 1], not increasing.
			if len(cfg.Policy.Ceilings) != len(cfg.Bands) {
				t.Fatalf("%d holdback ceilings for %d bands", len(cfg.Policy.Ceilings), len(cfg.Bands))
			}
			if _, err := flowcontrol.NewPriorityHoldbackCeilings(cfg.Policy.Ceilings); err != nil {
				t.Fatalf("holdback ceilings %v: %v", cfg.Policy.Ceilings, err)
			}
		default:
			t.Fatalf("policy %q", cfg.Policy.Type)
		}
		if cfg.Saturation.ScrapeInterval <= 0 || cfg.Saturation.ScrapeInterval >= cfg.Saturation.MetricsStalenessThreshold {
			t.Fatalf("saturation %+v", cfg.Saturation)
		}
	})
}

// TestParseConfigBandsProperty: any set of bands with unique names and
// priorities, written in any order, parses into the bands sorted by
// descending priority, each band's name mapping to its index, the default
// band being the one named, and capacities and waits kept.
func TestParseConfigBandsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "bands")
		prios := rapid.SliceOfNDistinct(rapid.IntRange(-1000, 1000), n, n, rapid.ID[int]).Draw(t, "priorities")
		// At most 8 bands of MaxTotalCapacity/8: every drawn file is within
		// the total the parser allows (a larger total is refused naming the
		// band that passes it: TestParseConfigLLMDErrors, "bands add up"). 1<<20 each drew totals
		// past 1<<22 now and then (seen 2026-12-02, 8 bands).
		caps := rapid.SliceOfN(rapid.IntRange(1, gateway.MaxTotalCapacity/8), n, n).Draw(t, "capacities")
		waits := rapid.SliceOfN(rapid.IntRange(0, 3600), n, n).Draw(t, "waits")
		def := rapid.IntRange(0, n-1).Draw(t, "default")
		var src strings.Builder
		src.WriteString("flowControl:\n  priorityBands:\n")
		for i := range n {
			fmt.Fprintf(&src, "    - {name: b%d, priority: %d, capacity: %d, maxWait: %ds}\n", i, prios[i], caps[i], waits[i])
		}
		fmt.Fprintf(&src, "  defaultPriorityBand: b%d\n", def)
		cfg, err := gateway.ParseConfig(strings.NewReader(src.String()))
		if err != nil {
			t.Fatalf("%v\n%s", err, src.String())
		}
		if len(cfg.Bands) != n {
			t.Fatalf("%d bands, want %d", len(cfg.Bands), n)
		}
		for i, b := range cfg.Bands {
			if i > 0 && b.Priority >= cfg.Bands[i-1].Priority {
				t.Fatalf("not sorted: %+v", cfg.Bands)
			}
			var k int
			if _, err := fmt.Sscanf(b.Name, "b%d", &k); err != nil {
				t.Fatal(err)
			}
			if b.Priority != prios[k] || b.Capacity != caps[k] || b.MaxWait != time.Duration(waits[k])*time.Second {
				t.Fatalf("band %d (%s) = %+v", i, b.Name, b)
			}
			if cfg.Objectives[b.Name] != i {
				t.Fatalf("objective %s → %d, want %d", b.Name, cfg.Objectives[b.Name], i)
			}
		}
		if cfg.Bands[cfg.DefaultBand].Name != fmt.Sprintf("b%d", def) {
			t.Fatalf("default band %d is %s, want b%d", cfg.DefaultBand, cfg.Bands[cfg.DefaultBand].Name, def)
		}
		if cfg.Objectives["critical"] != 0 || cfg.Objectives["sheddable"] != n-1 {
			t.Fatalf("critical/sheddable defaults: %v", cfg.Objectives)
		}
	})
}
