package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/flowgate/flowgate/saturation"
)

// The YAML file the proxy reads with -config. Its shape follows llm-d's
// flowControl and saturationDetector sections, so that a user of the
// reference gateway recognises it:
//
//	plugins:
//	  - name: baseline
//	    type: static-usage-limit-policy
//	    parameters: {threshold: 1.0}
//	flowControl:
//	  usageLimitPolicyPluginRef: soft-reflective-ceiling-policy
//	  priorityBands:
//	    - {name: critical,  priority: 100, capacity: 1024, maxWait: 30s}
//	    - {name: sheddable, priority: 0,   capacity: 4096, maxWait: 120s}
//	  defaultPriorityBand: sheddable
//	  objectives: {critical: critical, sheddable: sheddable}
//	saturationDetector:
//	  queueDepthThreshold: 5
//	  kvCacheUtilThreshold: 0.8
//	  metricsStalenessThreshold: 200ms
//	  scrapeInterval: 50ms
//	  inFlightCredit: true
//
// Band priorities follow the Gateway API Inference Extension convention
// (InferenceObjective.priority: higher is more important): bands are sorted by
// descending priority, so the highest becomes band 0, the one that is never
// gated. usageLimitPolicyPluginRef names either a plugin declared under
// plugins (by its name) or a registered policy type directly, with its default
// parameters.

// fileConfig is the document as written; every field is optional.
type fileConfig struct {
	Plugins            []filePlugin           `yaml:"plugins"`
	FlowControl        fileFlowControl        `yaml:"flowControl"`
	SaturationDetector fileSaturationDetector `yaml:"saturationDetector"`
}

type filePlugin struct {
	Name       string           `yaml:"name"`
	Type       string           `yaml:"type"`
	Parameters filePluginParams `yaml:"parameters"`
}

type filePluginParams struct {
	Threshold *float64 `yaml:"threshold"`
}

type fileFlowControl struct {
	UsageLimitPolicyPluginRef string            `yaml:"usageLimitPolicyPluginRef"`
	PriorityBands             []fileBand        `yaml:"priorityBands"`
	DefaultPriorityBand       string            `yaml:"defaultPriorityBand"`
	Objectives                map[string]string `yaml:"objectives"`
	Tick                      *time.Duration    `yaml:"tick"`
	Burst                     *int              `yaml:"burst"`
}

type fileBand struct {
	Name     string         `yaml:"name"`
	Priority *int           `yaml:"priority"`
	Capacity *int           `yaml:"capacity"`
	MaxWait  *time.Duration `yaml:"maxWait"`
}

type fileSaturationDetector struct {
	QueueDepthThreshold       *float64       `yaml:"queueDepthThreshold"`
	KVCacheUtilThreshold      *float64       `yaml:"kvCacheUtilThreshold"`
	MetricsStalenessThreshold *time.Duration `yaml:"metricsStalenessThreshold"`
	ScrapeInterval            *time.Duration `yaml:"scrapeInterval"`
	InFlightCredit            *bool          `yaml:"inFlightCredit"`
}

// Policy type names, as registered in flowcontrol's policy registry.
const (
	policyStatic         = "static-usage-limit-policy"
	policySoftReflective = "soft-reflective-ceiling-policy"
)

// Band is one priority band after validation, in band order (0 first).
type Band struct {
	Name     string
	Priority int
	Capacity int
	MaxWait  time.Duration // 0: no limit
	MaxBytes int64         // byte budget of the band's waiting bodies; 0: none
}

// PolicyRef is the selected usage-limit policy: a registry type name and its
// parameters.
type PolicyRef struct {
	Type      string
	Threshold float64 // static-usage-limit-policy only
}

// SaturationConfig configures the metrics poller.
type SaturationConfig struct {
	QueueDepthThreshold       float64
	KVCacheUtilThreshold      float64
	MetricsStalenessThreshold time.Duration
	ScrapeInterval            time.Duration
	// InFlightCredit counts requests the proxy has forwarded to a pod but
	// that its last scrape does not show yet (in-flight − (waiting +
	// running), if positive) as waiting on that pod.
	InFlightCredit bool
}

// Config is the validated proxy configuration.
type Config struct {
	Bands       []Band
	Policy      PolicyRef
	DefaultBand int
	// Objectives maps the x-gateway-inference-objective header value to a band.
	Objectives map[string]int
	Tick       time.Duration // 0: flowcontrol's default
	Burst      int           // 0: flowcontrol's default
	Saturation SaturationConfig
}

// DefaultConfig is what the proxy runs with when no -config is given: two
// bands (critical, sheddable), the soft-reflective policy, and the reference
// gateway's saturation thresholds (CALIBRATION.md).
func DefaultConfig() Config {
	return Config{
		Bands: []Band{
			{Name: "critical", Priority: 100, Capacity: 1024, MaxWait: 30 * time.Second},
			{Name: "sheddable", Priority: 0, Capacity: 4096, MaxWait: 120 * time.Second},
		},
		Policy:      PolicyRef{Type: policySoftReflective},
		DefaultBand: 1,
		Objectives:  map[string]int{"critical": 0, "sheddable": 1},
		Saturation: SaturationConfig{
			QueueDepthThreshold:       5,
			KVCacheUtilThreshold:      0.8,
			MetricsStalenessThreshold: 200 * time.Millisecond,
			ScrapeInterval:            50 * time.Millisecond,
			// On: the poller sees a forwarded request at once rather
			// than a scrape later. The demo turns it off to compare
			// the policies as the published experiment did.
			InFlightCredit: true,
		},
	}
}

// maxConfigBytes bounds the file read: a configuration is a few hundred bytes.
const maxConfigBytes = 1 << 20

// ParseConfig reads and validates a YAML configuration. Decoding is strict:
// an unknown field, a duplicate key or a value of the wrong type is an error
// naming the field's path and its line; a semantic error names the field's
// path (and its line when the field was written).
func ParseConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("proxy: config: %w", err)
	}
	if len(data) > maxConfigBytes {
		return Config{}, fmt.Errorf("proxy: config: larger than %d bytes", maxConfigBytes)
	}
	// The node tree maps error lines to field paths and paths to lines.
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, fmt.Errorf("proxy: config: %w", err)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, describeDecodeError(err, &root)
	}
	// A second document would be silently ignored: refuse it.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("proxy: config: more than one YAML document")
	}
	return fc.resolve(&root)
}

var (
	lineRe      = regexp.MustCompile(`^line (\d+): (.*)$`)
	notFoundRe  = regexp.MustCompile(`^field (\S+) not found in type`)
	badValueRe  = regexp.MustCompile("^cannot unmarshal \\S+(?: `([^`]*)`)? into")
	durationTok = "time.Duration"
)

// describeDecodeError rewrites yaml's "line N: ..." messages so that each
// names the field path it is about.
func describeDecodeError(err error, root *yaml.Node) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("proxy: config: %w", err)
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := lineRe.FindStringSubmatch(e)
		if m == nil {
			msgs = append(msgs, e)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		rest := m[2]
		path := ""
		switch {
		case notFoundRe.MatchString(rest):
			key := notFoundRe.FindStringSubmatch(rest)[1]
			path = findPath(root, func(k, _ *yaml.Node) bool { return k.Line == line && k.Value == key })
			rest = "unknown field"
		case badValueRe.MatchString(rest):
			// yaml quotes a scalar's value (cut to 7 bytes and "..." when
			// long); a sequence or mapping has none.
			val := badValueRe.FindStringSubmatch(rest)[1]
			scalar := strings.Contains(rest, "`")
			path = findPath(root, func(_, v *yaml.Node) bool {
				if v.Line != line || (v.Kind == yaml.ScalarNode) != scalar {
					return false
				}
				return !scalar || strings.HasPrefix(v.Value, strings.TrimSuffix(val, "..."))
			})
			if strings.Contains(rest, durationTok) {
				rest += ` (durations are strings such as "250ms" or "30s")`
			}
		}
		if path == "" {
			path = "?"
		}
		msgs = append(msgs, fmt.Sprintf("%s (line %d): %s", path, line, rest))
	}
	return fmt.Errorf("proxy: config: %s", strings.Join(msgs, "; "))
}

// walkYAML visits, innermost first, every mapping entry (key, value) and
// every sequence item (key nil) below n with its dotted path
// ("flowControl.priorityBands[1].capacity"), until visit returns true; it
// then returns that entry's path and true.
func walkYAML(n *yaml.Node, path string, visit func(path string, k, v *yaml.Node) bool) (string, bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p, ok := walkYAML(c, path, visit); ok {
				return p, true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			// Children first: a block mapping starts on the line of its
			// first key, and the innermost entry is the one meant.
			if q, ok := walkYAML(v, p, visit); ok {
				return q, true
			}
			if visit(p, k, v) {
				return p, true
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if q, ok := walkYAML(c, p, visit); ok {
				return q, true
			}
			if visit(p, nil, c) {
				return p, true
			}
		}
	}
	return "", false
}

// findPath returns the dotted path of the innermost mapping entry (key,
// value) for which match holds, searching the whole tree; "" if none.
func findPath(root *yaml.Node, match func(k, v *yaml.Node) bool) string {
	p, _ := walkYAML(root, "", func(_ string, k, v *yaml.Node) bool { return k != nil && match(k, v) })
	return p
}

// lineOf returns the line of the key (or sequence item) at a dotted path
// such as "flowControl.priorityBands[1].capacity", or 0 when it was not
// written.
func lineOf(root *yaml.Node, path string) int {
	line := 0
	walkYAML(root, "", func(p string, k, v *yaml.Node) bool {
		if p != path {
			return false
		}
		if line = v.Line; k != nil {
			line = k.Line
		}
		return true
	})
	return line
}

// fieldError builds a validation error naming the field and, when the field
// was written, its line.
func fieldError(root *yaml.Node, path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if l := lineOf(root, path); l > 0 {
		return fmt.Errorf("proxy: config: %s (line %d): %s", path, l, msg)
	}
	return fmt.Errorf("proxy: config: %s: %s", path, msg)
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// resolve validates the document and fills the defaults.
func (fc *fileConfig) resolve(root *yaml.Node) (Config, error) {
	cfg := DefaultConfig()

	// Plugins: names unique, types known, parameters belong to the type.
	plugins := map[string]PolicyRef{}
	for i, p := range fc.Plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		if p.Type == "" {
			return Config{}, fieldError(root, path+".type", "required (%s or %s)", policyStatic, policySoftReflective)
		}
		ref := PolicyRef{Type: p.Type}
		switch p.Type {
		case policyStatic:
			ref.Threshold = 1.0
			if t := p.Parameters.Threshold; t != nil {
				if !finite(*t) || *t <= 0 {
					return Config{}, fieldError(root, path+".parameters.threshold", "must be a finite number > 0, got %v", *t)
				}
				ref.Threshold = *t
			}
		case policySoftReflective:
			if p.Parameters.Threshold != nil {
				return Config{}, fieldError(root, path+".parameters.threshold", "%s takes no threshold (it has no free parameter)", policySoftReflective)
			}
		default:
			return Config{}, fieldError(root, path+".type", "unknown policy %q (known: %s, %s)", p.Type, policyStatic, policySoftReflective)
		}
		name := p.Name
		if name == "" {
			name = p.Type
		}
		if _, dup := plugins[name]; dup {
			return Config{}, fieldError(root, path+".name", "duplicate plugin name %q", name)
		}
		plugins[name] = ref
	}

	fcf := fc.FlowControl
	if ref := fcf.UsageLimitPolicyPluginRef; ref != "" {
		switch r, ok := plugins[ref]; {
		case ok:
			cfg.Policy = r
		case ref == policyStatic:
			cfg.Policy = PolicyRef{Type: policyStatic, Threshold: 1.0}
		case ref == policySoftReflective:
			cfg.Policy = PolicyRef{Type: policySoftReflective}
		default:
			return Config{}, fieldError(root, "flowControl.usageLimitPolicyPluginRef",
				"%q is neither a declared plugin nor a policy type (%s, %s)", ref, policyStatic, policySoftReflective)
		}
	}

	if fcf.PriorityBands != nil {
		if len(fcf.PriorityBands) == 0 {
			return Config{}, fieldError(root, "flowControl.priorityBands", "at least one band is required")
		}
		bands := make([]Band, 0, len(fcf.PriorityBands))
		names := map[string]bool{}
		prios := map[int]bool{}
		for i, b := range fcf.PriorityBands {
			path := fmt.Sprintf("flowControl.priorityBands[%d]", i)
			if b.Name == "" {
				return Config{}, fieldError(root, path+".name", "required")
			}
			if names[b.Name] {
				return Config{}, fieldError(root, path+".name", "duplicate band name %q", b.Name)
			}
			names[b.Name] = true
			if b.Priority == nil {
				return Config{}, fieldError(root, path+".priority", "required (higher is more important)")
			}
			if prios[*b.Priority] {
				return Config{}, fieldError(root, path+".priority", "duplicate priority %d", *b.Priority)
			}
			prios[*b.Priority] = true
			band := Band{Name: b.Name, Priority: *b.Priority, Capacity: 1024}
			if b.Capacity != nil {
				if *b.Capacity <= 0 || *b.Capacity > 1<<24 {
					return Config{}, fieldError(root, path+".capacity", "must be in 1..%d, got %d", 1<<24, *b.Capacity)
				}
				band.Capacity = *b.Capacity
			}
			if b.MaxWait != nil {
				if *b.MaxWait < 0 {
					return Config{}, fieldError(root, path+".maxWait", "must not be negative, got %v", *b.MaxWait)
				}
				band.MaxWait = *b.MaxWait
			}
			bands = append(bands, band)
		}
		sort.SliceStable(bands, func(i, j int) bool { return bands[i].Priority > bands[j].Priority })
		cfg.Bands = bands
		cfg.DefaultBand = len(bands) - 1
		cfg.Objectives = defaultObjectives(bands)
	}

	bandIndex := func(path, name string) (int, error) {
		for i, b := range cfg.Bands {
			if b.Name == name {
				return i, nil
			}
		}
		return 0, fieldError(root, path, "no band named %q", name)
	}
	if fcf.DefaultPriorityBand != "" {
		i, err := bandIndex("flowControl.defaultPriorityBand", fcf.DefaultPriorityBand)
		if err != nil {
			return Config{}, err
		}
		cfg.DefaultBand = i
	}
	for obj, band := range fcf.Objectives {
		path := "flowControl.objectives." + obj
		if obj == "" {
			return Config{}, fieldError(root, "flowControl.objectives", "empty objective name")
		}
		i, err := bandIndex(path, band)
		if err != nil {
			return Config{}, err
		}
		cfg.Objectives[obj] = i
	}
	if fcf.Tick != nil {
		if *fcf.Tick <= 0 || *fcf.Tick > time.Second {
			return Config{}, fieldError(root, "flowControl.tick", "must be in (0, 1s], got %v", *fcf.Tick)
		}
		cfg.Tick = *fcf.Tick
	}
	if fcf.Burst != nil {
		if *fcf.Burst <= 0 || *fcf.Burst > 1<<20 {
			return Config{}, fieldError(root, "flowControl.burst", "must be in 1..%d, got %d", 1<<20, *fcf.Burst)
		}
		cfg.Burst = *fcf.Burst
	}

	sd := fc.SaturationDetector
	if v := sd.QueueDepthThreshold; v != nil {
		if !finite(*v) || *v <= 0 {
			return Config{}, fieldError(root, "saturationDetector.queueDepthThreshold", "must be a finite number > 0, got %v", *v)
		}
		cfg.Saturation.QueueDepthThreshold = *v
	}
	if v := sd.KVCacheUtilThreshold; v != nil {
		if !finite(*v) || *v <= 0 || *v > 1 {
			return Config{}, fieldError(root, "saturationDetector.kvCacheUtilThreshold", "must be in (0, 1], got %v", *v)
		}
		cfg.Saturation.KVCacheUtilThreshold = *v
	}
	if v := sd.MetricsStalenessThreshold; v != nil {
		if *v < saturation.MinStaleness || *v > saturation.MaxStaleness {
			return Config{}, fieldError(root, "saturationDetector.metricsStalenessThreshold", "must be in [%v, %v], got %v",
				saturation.MinStaleness, saturation.MaxStaleness, *v)
		}
		cfg.Saturation.MetricsStalenessThreshold = *v
	}
	if v := sd.ScrapeInterval; v != nil {
		if *v < saturation.MinInterval || *v > saturation.MaxInterval {
			return Config{}, fieldError(root, "saturationDetector.scrapeInterval", "must be in [%v, %v], got %v",
				saturation.MinInterval, saturation.MaxInterval, *v)
		}
		cfg.Saturation.ScrapeInterval = *v
	}
	if v := sd.InFlightCredit; v != nil {
		cfg.Saturation.InFlightCredit = *v
	}
	if cfg.Saturation.ScrapeInterval >= cfg.Saturation.MetricsStalenessThreshold {
		return Config{}, fieldError(root, "saturationDetector.scrapeInterval",
			"must be shorter than metricsStalenessThreshold (%v), or every pod reads as stale", cfg.Saturation.MetricsStalenessThreshold)
	}
	return cfg, nil
}

// defaultObjectives maps every band's own name to it, plus "critical" to
// band 0 and "sheddable" to the last band unless a band already has that name.
func defaultObjectives(bands []Band) map[string]int {
	m := map[string]int{}
	for i, b := range bands {
		m[b.Name] = i
	}
	if _, ok := m["critical"]; !ok {
		m["critical"] = 0
	}
	if _, ok := m["sheddable"]; !ok {
		m["sheddable"] = len(bands) - 1
	}
	return m
}
