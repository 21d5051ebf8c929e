package gateway

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
	"github.com/flowgate/flowgate/saturation/redisshare"
	"github.com/redis/go-redis/v9"
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
//	sharedInFlight:            # optional: share in-flight counts with other replicas
//	  address: redis:6379      # or url: rediss://:password@redis:6380/2 (and mode: sentinel|cluster)
//	  replicaId: gateway-0     # unique per replica (or -replica-id)
//	  period: 5ms
//	  ttl: 1s
//
// Band priorities follow the Gateway API Inference Extension convention
// (InferenceObjective.priority: higher is more important): bands are sorted by
// descending priority, so the highest becomes band 0, the one that is never
// gated. usageLimitPolicyPluginRef names either a plugin declared under
// plugins (by its name) or a registered policy type directly, with its default
// parameters (priority-holdback-policy has none for minCeiling, so it must be
// declared: parameters shape, domain, minCeiling, maxCeiling, ceilings, as
// llm-d reads them).

// fileConfig is the document as written; every field is optional. It is
// llm-d's EndpointPickerConfig: the sections flowgate has no use for
// (scheduling, the data layer, the parser, feature gates) are accepted and
// ignored with a warning; plugins of types flowgate does not implement too.
type fileConfig struct {
	APIVersion         string                 `yaml:"apiVersion"`
	Kind               string                 `yaml:"kind"`
	Plugins            []filePlugin           `yaml:"plugins"`
	FlowControl        fileFlowControl        `yaml:"flowControl"`
	SaturationDetector fileSaturationDetector `yaml:"saturationDetector"`
	SharedInFlight     *fileSharedInFlight    `yaml:"sharedInFlight"`

	FeatureGates       yaml.Node `yaml:"featureGates"`
	SchedulingProfiles yaml.Node `yaml:"schedulingProfiles"`
	Data               yaml.Node `yaml:"data"`
	Parser             yaml.Node `yaml:"parser"`
	RequestControl     yaml.Node `yaml:"requestControl"`
}

type filePlugin struct {
	Name       string    `yaml:"name"`
	Type       string    `yaml:"type"`
	Parameters yaml.Node `yaml:"parameters"` // read by type
}

type fileFlowControl struct {
	UsageLimitPolicyPluginRef string     `yaml:"usageLimitPolicyPluginRef"`
	PriorityBands             []fileBand `yaml:"priorityBands"`
	// DefaultPriorityBand is a band's name (flowgate: the band of
	// requests nothing else places) or llm-d's band template (the
	// defaults of bands that do not set maxRequests/maxBytes).
	DefaultPriorityBand yaml.Node         `yaml:"defaultPriorityBand"`
	Objectives          map[string]string `yaml:"objectives"`
	Tick                *time.Duration    `yaml:"tick"`
	Burst               *int              `yaml:"burst"`
	// llm-d: a band's default max wait, and global limits (flowgate
	// applies them per band: no band exceeds them).
	DefaultRequestTTL  *time.Duration `yaml:"defaultRequestTTL"`
	MaxRequests        yaml.Node      `yaml:"maxRequests"`
	MaxBytes           yaml.Node      `yaml:"maxBytes"`
	SaturationDetector *struct {
		PluginRef string `yaml:"pluginRef"`
	} `yaml:"saturationDetector"`
	// BodyPriority: what the proxy does with vLLM's body field
	// "priority": keep (classify by it, forward it), strip (classify by
	// it, remove it before forwarding: vLLM refuses a non-zero priority
	// unless run with --scheduling-policy priority), ignore, or set
	// (classify by it, write the band into the forwarded body).
	BodyPriority string `yaml:"bodyPriority"`
	// CriticalKVHeadroom is flowgate's critical routing
	// (flowhttp.GatewayConfig.CriticalKVHeadroom): a critical request goes
	// to a backend with at least this share of its KV cache free at the
	// last scrape, when some have it and others not, and to those with the
	// lowest usage when none has it. Unset: 0.1 with
	// bodyPriority set (the backends schedule by priority), off otherwise;
	// 0 turns it off; a value in (0, 1] turns it on.
	CriticalKVHeadroom *float64 `yaml:"criticalKVHeadroom"`
}

type fileBand struct {
	Name     string         `yaml:"name"`
	Priority *int           `yaml:"priority"`
	Capacity *int           `yaml:"capacity"`
	MaxWait  *time.Duration `yaml:"maxWait"`
	// llm-d's names: maxRequests is capacity (a quantity such as "500"
	// or "1k"), maxBytes the byte budget ("512Mi", "1Gi", bytes).
	MaxRequests       yaml.Node `yaml:"maxRequests"`
	MaxBytes          yaml.Node `yaml:"maxBytes"`
	FairnessPolicyRef string    `yaml:"fairnessPolicyRef"`
	OrderingPolicyRef string    `yaml:"orderingPolicyRef"`
	// flowgate's names for the same settings (flowcontrol.BandConfig), and
	// the per-flow bound llm-d does not have.
	Fairness     string `yaml:"fairness"`
	Ordering     string `yaml:"ordering"`
	FlowCapacity *int   `yaml:"flowCapacity"`
}

type fileSaturationDetector struct {
	QueueDepthThreshold       *float64       `yaml:"queueDepthThreshold"`
	KVCacheUtilThreshold      *float64       `yaml:"kvCacheUtilThreshold"`
	MetricsStalenessThreshold *time.Duration `yaml:"metricsStalenessThreshold"`
	ScrapeInterval            *time.Duration `yaml:"scrapeInterval"`
	InFlightCredit            *bool          `yaml:"inFlightCredit"`
	// Engine picks the metric names the poller reads: vllm (default) or
	// sglang.
	Engine string `yaml:"engine"`
}

// fileSharedInFlight is flowgate's own section: the in-flight view shared
// with the other gateway replicas through Redis (package redisshare).
type fileSharedInFlight struct {
	Address   string         `yaml:"address"`
	URL       string         `yaml:"url"`
	Mode      string         `yaml:"mode"`
	ReplicaID string         `yaml:"replicaId"`
	Period    *time.Duration `yaml:"period"`
	TTL       *time.Duration `yaml:"ttl"`
}

// Policy type names, as registered in flowcontrol's policy registry.
const (
	policyStatic         = "static-usage-limit-policy"
	policySoftReflective = "soft-reflective-ceiling-policy"
	policyHoldback       = "priority-holdback-policy"
)

// Limits of a configuration: every band's queue is allocated at start, so
// the total is bounded (a ring slot is 16 bytes, a waiting request ~3 KB).
const (
	MaxBandCapacity  = 1 << 22 // waiting requests one band holds
	MaxTotalCapacity = 1 << 22 // ... all bands together
	// DefaultBandBytes is a band's byte budget when the file sets none
	// (llm-d's default: 1 GB).
	DefaultBandBytes = 1 << 30
	// defaultBandCapacity is a band's capacity when the file sets none.
	defaultBandCapacity = 1024
)

// Body priority handling (Config.BodyPriority).
const (
	BodyPriorityKeep   = "keep"   // classify by it, forward it unchanged (default)
	BodyPriorityStrip  = "strip"  // classify by it, remove it from the forwarded body
	BodyPriorityIgnore = "ignore" // do not classify by it; forward it unchanged
	// BodyPrioritySet classifies by it and writes the request's band into
	// the forwarded body (vLLM: band i as priority i; SGLang, engine
	// sglang: the reverse), so that a model server run with priority
	// scheduling (vLLM --scheduling-policy priority) schedules and preempts
	// by the gateway's band.
	BodyPrioritySet = "set"
)

// Band is one priority band after validation, in band order (0 first).
type Band struct {
	Name     string
	Priority int
	Capacity int
	MaxWait  time.Duration // 0: no limit
	MaxBytes int64         // byte budget of the band's waiting bodies; 0: none
	// Fairness, Ordering and FlowCapacity are flowcontrol.BandConfig's: how
	// the band shares its releases between flows (the fairness-id header),
	// the order within a flow, and what one flow may hold ("" and 0: fcfs,
	// no bound).
	Fairness     string
	Ordering     string
	FlowCapacity int
}

// PolicyRef is the selected usage-limit policy: a registry type name and its
// parameters.
type PolicyRef struct {
	Type      string
	Threshold float64 // static-usage-limit-policy only
	// Holdback is priority-holdback-policy's parameters, and Ceilings the
	// ceiling they give each band (band 0 first), computed from the bands'
	// priorities when the file is read.
	Holdback flowcontrol.HoldbackConfig
	Ceilings []float64
}

// SaturationConfig configures the metrics poller.
type SaturationConfig struct {
	// QueueDepthThreshold is the waiting requests per pod that score it
	// saturated. Zero (the default when the file omits it) takes the
	// library's: flowhttp.CreditQueueDepthThreshold with InFlightCredit,
	// saturation.DefaultQueueDepthThreshold (llm-d's 5) without.
	QueueDepthThreshold       float64
	KVCacheUtilThreshold      float64
	MetricsStalenessThreshold time.Duration
	ScrapeInterval            time.Duration
	// InFlightCredit counts requests the proxy has forwarded to a pod but
	// that its last scrape does not show yet (in-flight − (waiting +
	// running), if positive) as waiting on that pod.
	InFlightCredit bool
	// Engine is the backends' kind, which names their metrics: "vllm"
	// (default) or "sglang".
	Engine string
}

// SharedConfig configures the in-flight view shared with the other gateway
// replicas through Redis (package saturation/redisshare). Only the per-backend
// in-flight counts are shared; queues, bands and the dispatcher stay local.
// The zero value (Address and URL "") is off: the proxy routes and credits on its
// own counts.
type SharedConfig struct {
	// Address is the Redis "host:port" (one server, no auth, no TLS).
	// Sharing is on when Address or URL is set, never both.
	Address string
	// URL is a Redis URL read by go-redis's parser for Mode (see
	// redisshare.ParseURL): redis://[user:password@]host[:port][/db],
	// rediss:// for TLS; for Sentinel, more Sentinels as addr=host:port
	// and master_name=NAME; for Cluster, more nodes as addr=host:port.
	URL string
	// Mode is how URL is read: redisshare.ModeStandalone ("" too),
	// ModeSentinel or ModeCluster.
	Mode string
	// ReplicaID names this replica among those sharing the Redis; it must
	// be unique (a pod name). Required when sharing is on.
	ReplicaID string
	// Period between two syncs with Redis. Default redisshare.DefaultPeriod.
	Period time.Duration
	// TTL is how long a replica that stopped publishing keeps counting in
	// the others' views, and how long this one serves the others' last
	// counts while Redis fails. At least 4 Periods. Default
	// redisshare.DefaultTTL.
	TTL time.Duration
}

// Enabled reports whether sharing is on.
func (s SharedConfig) Enabled() bool { return s.Address != "" || s.URL != "" }

// RedisOptions returns the connection for redisshare.Options.Redis: URL
// read for Mode, or Address as one server. Validate has checked both.
func (s SharedConfig) RedisOptions() (*redis.UniversalOptions, error) {
	if s.URL != "" {
		return redisshare.ParseURL(s.URL, s.Mode)
	}
	return &redis.UniversalOptions{Addrs: []string{s.Address}}, nil
}

// Validate fills the defaults and checks the settings, naming each field as
// names does (the file's paths, or the proxy's flags).
func (s *SharedConfig) Validate(names SharedFieldNames) error {
	if s.Period == 0 {
		s.Period = redisshare.DefaultPeriod
	}
	if s.TTL == 0 {
		s.TTL = redisshare.DefaultTTL
	}
	if !s.Enabled() {
		switch {
		case s.ReplicaID != "":
			return fmt.Errorf("%s: set without %s", names.ReplicaID, names.Address)
		case s.Mode != "":
			return fmt.Errorf("%s: set without %s", names.Mode, names.URL)
		}
		return nil
	}
	switch {
	case s.Address != "" && s.URL != "":
		return fmt.Errorf("%s: set beside %s; give one", names.URL, names.Address)
	case s.Address != "" && strings.Contains(s.Address, "://"):
		return fmt.Errorf("%s: a URL; give it as %s (%s is a host:port)", names.Address, names.URL, names.Address)
	case s.Address != "" && s.Mode != "":
		return fmt.Errorf("%s: applies to %s only; %s is one server", names.Mode, names.URL, names.Address)
	case s.Address != "":
		if _, _, err := net.SplitHostPort(s.Address); err != nil {
			return fmt.Errorf("%s: %q is not a host:port: %v", names.Address, s.Address, err)
		}
	default:
		switch s.Mode {
		case "", redisshare.ModeStandalone, redisshare.ModeSentinel, redisshare.ModeCluster:
		default:
			return fmt.Errorf("%s: must be %s, %s or %s, got %q", names.Mode,
				redisshare.ModeStandalone, redisshare.ModeSentinel, redisshare.ModeCluster, s.Mode)
		}
		if _, err := redisshare.ParseURL(s.URL, s.Mode); err != nil {
			// ParseURL's message never repeats the URL (it may hold a
			// password); drop its package prefix for the field's.
			msg := strings.TrimPrefix(err.Error(), redisshare.ErrInvalidConfig.Error()+": ")
			return fmt.Errorf("%s: %s", names.URL, msg)
		}
	}
	switch {
	case s.ReplicaID == "":
		return fmt.Errorf("%s: required with %s (a name unique among the replicas, such as the pod name)", names.ReplicaID, names.Address)
	case len(s.ReplicaID) > 256:
		return fmt.Errorf("%s: longer than 256 bytes", names.ReplicaID)
	case s.Period < time.Millisecond || s.Period > time.Minute:
		return fmt.Errorf("%s: must be in [1ms, 1m], got %v", names.Period, s.Period)
	case s.TTL < 4*s.Period || s.TTL > time.Hour:
		return fmt.Errorf("%s: must be in [4×%s (%v), 1h], got %v", names.TTL, names.Period, 4*s.Period, s.TTL)
	}
	return nil
}

// SharedFieldNames are the names Validate gives the fields in its errors.
type SharedFieldNames struct{ Address, URL, Mode, ReplicaID, Period, TTL string }

// SharedFileFields names the fields as the YAML file writes them.
var SharedFileFields = SharedFieldNames{Address: "sharedInFlight.address", URL: "sharedInFlight.url",
	Mode: "sharedInFlight.mode", ReplicaID: "sharedInFlight.replicaId",
	Period: "sharedInFlight.period", TTL: "sharedInFlight.ttl"}

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
	// BodyPriority is BodyPriorityKeep, BodyPriorityStrip,
	// BodyPriorityIgnore or BodyPrioritySet ("" reads as keep).
	BodyPriority string
	// CriticalKVHeadroom is the gateway's critical routing
	// (flowhttp.GatewayConfig.CriticalKVHeadroom): nil takes the
	// gateway's default (on at 0.1 with BodyPrioritySet, off otherwise), 0
	// turns it off, a value in (0, 1] turns it on at that headroom.
	CriticalKVHeadroom *float64
	// Shared is the in-flight view shared with other replicas; off by
	// default.
	Shared SharedConfig
	// Warnings lists what the file held that the proxy ignores (llm-d
	// sections and plugins flowgate has no use for); the proxy logs them.
	Warnings []string
}

// DefaultConfig is what the proxy runs with when no -config is given: two
// bands (critical, sheddable), the soft-reflective policy, and the reference
// gateway's saturation thresholds (CALIBRATION.md).
func DefaultConfig() Config {
	return Config{
		Bands: []Band{
			{Name: "critical", Priority: 100, Capacity: 1024, MaxWait: 30 * time.Second, MaxBytes: DefaultBandBytes},
			{Name: "sheddable", Priority: 0, Capacity: 4096, MaxWait: 120 * time.Second, MaxBytes: DefaultBandBytes},
		},
		Policy:      PolicyRef{Type: policySoftReflective},
		DefaultBand: 1,
		Objectives:  map[string]int{"critical": 0, "sheddable": 1},
		Saturation: SaturationConfig{
			QueueDepthThreshold:       0, // the Gateway's: 6.25 with the credit, 5 without
			KVCacheUtilThreshold:      0.8,
			MetricsStalenessThreshold: 200 * time.Millisecond,
			ScrapeInterval:            50 * time.Millisecond,
			// On: the poller sees a forwarded request at once rather
			// than a scrape later. The demo turns it off to compare
			// the policies as the published experiment did.
			InFlightCredit: true,
			Engine:         EngineVLLM,
		},
		BodyPriority: BodyPriorityKeep,
	}
}

// Backend kinds (SaturationConfig.Engine).
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// maxConfigBytes bounds the file read: a configuration is a few hundred bytes.
const maxConfigBytes = 1 << 20

// LoadConfig reads and parses the config file at path (see ParseConfig).
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	return ParseConfig(f)
}

// ParseConfig reads and validates a YAML configuration. Decoding is strict:
// an unknown field, a duplicate key or a value of the wrong type (a fraction
// for a whole number included) is an error naming the field's path, its line,
// the value as written and what the field takes (configerr.go); a semantic
// error names the field's path (and its line when the field was written).
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
		return Config{}, describeSyntaxError(err, data)
	}
	var fc fileConfig
	if err := checkDecode(&root, "", reflect.TypeOf(fc)); err != nil {
		return Config{}, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, describeDecodeError(err, "")
	}
	// A second document would be silently ignored: refuse it.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("proxy: config: more than one YAML document")
	}
	return fc.resolve(&root)
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

// Plugin types flowgate reads beside the usage-limit policies.
const (
	detectorUtilization = "utilization-detector"
	detectorConcurrency = "concurrency-detector"
)

// llm-d's fairness and ordering policy types, and the flowcontrol policy
// each maps to. program-aware-fairness (least attained service on tokens,
// decayed with a 60 s half-life) maps to fair-share (start-time fair
// queuing on tokens, no decay) with a warning; slo-deadline-ordering-policy
// and edf-ordering-policy both map to edf, whose deadline is the request's
// x-llm-d-slo-ttft-ms if it has one, else its max wait.
const (
	fairnessDefault      = "global-strict-fairness-policy"
	fairnessRoundRobin   = "round-robin-fairness-policy"
	fairnessProgramAware = "program-aware-fairness"
	orderingDefault      = "fcfs-ordering-policy"
	orderingEDF          = "edf-ordering-policy"
	orderingSLO          = "slo-deadline-ordering-policy"
)

var llmdFairness = map[string]string{
	fairnessDefault:      flowcontrol.FairnessFCFS,
	fairnessRoundRobin:   flowcontrol.FairnessRoundRobin,
	fairnessProgramAware: flowcontrol.FairnessShare,
}

var llmdOrdering = map[string]string{
	orderingDefault: flowcontrol.OrderingFCFS,
	orderingEDF:     flowcontrol.OrderingEDF,
	orderingSLO:     flowcontrol.OrderingEDF,
}

// bandQueueing resolves a band's fairness, ordering and flow capacity from
// flowgate's keys (fairness, ordering, flowCapacity) and llm-d's references
// (fairnessPolicyRef, orderingPolicyRef: a declared plugin's name or a policy
// type), over the template's; the two spellings of one setting must agree.
func bandQueueing(root *yaml.Node, b fileBand, path string, plugins map[string]string, tmpl Band, warn func(string, ...any)) (Band, error) {
	out := tmpl
	resolve := func(field, ref string, table map[string]string) (string, error) {
		typ := ref
		if t, ok := plugins[ref]; ok {
			typ = t
		}
		v, ok := table[typ]
		if !ok {
			names := slices.Sorted(maps.Keys(table))
			return "", fieldError(root, path+"."+field, "%q is neither a declared plugin of, nor one of, the types %s", ref, strings.Join(names, ", "))
		}
		if typ == fairnessProgramAware {
			warn("%s.%s (line %d): %q is approximated by flowgate's fair-share (start-time fair queuing on prompt + output tokens, without the 60 s decay)",
				path, field, lineOf(root, path+"."+field), ref)
		}
		return v, nil
	}
	for _, f := range []struct {
		native, ref, nativeField, refField string
		table                              map[string]string
		valid                              []string
		dst                                *string
	}{
		{b.Fairness, b.FairnessPolicyRef, "fairness", "fairnessPolicyRef", llmdFairness,
			[]string{flowcontrol.FairnessFCFS, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare}, &out.Fairness},
		{b.Ordering, b.OrderingPolicyRef, "ordering", "orderingPolicyRef", llmdOrdering,
			[]string{flowcontrol.OrderingFCFS, flowcontrol.OrderingEDF}, &out.Ordering},
	} {
		v := ""
		if f.ref != "" {
			r, err := resolve(f.refField, f.ref, f.table)
			if err != nil {
				return Band{}, err
			}
			v = r
		}
		if f.native != "" {
			if !slices.Contains(f.valid, f.native) {
				return Band{}, fieldError(root, path+"."+f.nativeField, "%q must be one of %s", f.native, strings.Join(f.valid, ", "))
			}
			if v != "" && v != f.native {
				return Band{}, fieldError(root, path+"."+f.nativeField, "%q contradicts %s %q (%s): give one", f.native, f.refField, f.ref, v)
			}
			v = f.native
		}
		if v != "" {
			*f.dst = v
		}
	}
	if c := b.FlowCapacity; c != nil {
		if *c < 0 || *c > MaxBandCapacity {
			return Band{}, fieldError(root, path+".flowCapacity", "must be in 0..%d (0: no per-flow bound), got %d", MaxBandCapacity, *c)
		}
		out.FlowCapacity = *c
	}
	return out, nil
}

// checkFlowCapacity applies flowcontrol's rules for a per-flow bound to a
// resolved band, naming the field: at most the band's capacity, and only on a
// band that has flows.
func checkFlowCapacity(root *yaml.Node, b Band, path string) error {
	switch {
	case b.FlowCapacity == 0:
		return nil
	case b.Fairness != flowcontrol.FairnessRoundRobin && b.Fairness != flowcontrol.FairnessShare:
		return fieldError(root, path, "band %q: a per-flow capacity needs fairness %s or %s (the band has %q)",
			b.Name, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare, cmp.Or(b.Fairness, flowcontrol.FairnessFCFS))
	case b.FlowCapacity > b.Capacity:
		return fieldError(root, path, "band %q: %d exceeds the band's capacity %d", b.Name, b.FlowCapacity, b.Capacity)
	}
	return nil
}

// checkKeys refuses keys of a mapping node not in allowed, naming the field
// and the allowed key it is likely a misspelling of, if any.
func checkKeys(root, n *yaml.Node, path string, allowed ...string) error {
	if n.Kind == 0 {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fieldError(root, path, "must be a mapping")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		if !slices.Contains(allowed, k) {
			return fmt.Errorf("proxy: config: %s.%s (line %d): %s", path, k, n.Content[i].Line, unknownField(k, allowed))
		}
	}
	return nil
}

// decodeNode decodes the node at path into v, with decode errors naming the
// field.
func decodeNode(n *yaml.Node, path string, v any) error {
	if n.Kind == 0 {
		return nil
	}
	if err := checkDecode(n, path, reflect.TypeOf(v)); err != nil {
		return err
	}
	if err := n.Decode(v); err != nil {
		return describeDecodeError(err, path)
	}
	return nil
}

// quantityAt parses an optional quantity node at path (a maxRequests, a
// count of requests, or a maxBytes, of bytes); ok false if absent.
func quantityAt(root, n *yaml.Node, path string) (v int64, ok bool, err error) {
	if n.Kind == 0 {
		return 0, false, nil
	}
	if n.Kind != yaml.ScalarNode {
		return 0, false, fieldError(root, path, "must be a quantity such as 500, \"1k\" or \"10Gi\", not %s", describeNode(n))
	}
	unit := "requests"
	if strings.HasSuffix(path, "maxBytes") {
		unit = "bytes"
	}
	v, err = parseQuantity(n.Value, unit)
	if err != nil {
		return 0, false, fieldError(root, path, "%v", err)
	}
	return v, true, nil
}

// checkBandName refuses a band name that would make metrics, logs or HTTP
// headers unreadable.
func checkBandName(name string) error {
	if len(name) > flowcontrol.MaxBandNameLen {
		return fmt.Errorf("longer than %d bytes", flowcontrol.MaxBandNameLen)
	}
	if !utf8.ValidString(name) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) || !unicode.IsPrint(r) || r == ' ' {
			return fmt.Errorf("holds %q: band names are printable, without spaces", r)
		}
	}
	return nil
}

// resolve validates the document and fills the defaults.
func (fc *fileConfig) resolve(root *yaml.Node) (Config, error) {
	cfg := DefaultConfig()
	warn := func(format string, args ...any) { cfg.Warnings = append(cfg.Warnings, fmt.Sprintf(format, args...)) }
	for name, n := range map[string]*yaml.Node{"featureGates": &fc.FeatureGates, "schedulingProfiles": &fc.SchedulingProfiles,
		"data": &fc.Data, "parser": &fc.Parser, "requestControl": &fc.RequestControl} {
		if n.Kind != 0 {
			warn("%s (line %d): ignored (flowgate orders requests; it does not pick endpoints)", name, lineOf(root, name))
		}
	}
	slices.Sort(cfg.Warnings) // map order is random; keep warnings stable

	// Plugins: names unique; policy types checked strictly; llm-d's
	// utilization detector read; anything else ignored with a warning.
	plugins := map[string]PolicyRef{}
	type detector struct {
		filePlugin
		path string
	}
	detectors := map[string]detector{}
	queuePlugins := map[string]string{} // fairness and ordering plugins: name → type
	seen := map[string]bool{}
	for i, p := range fc.Plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		if p.Type == "" {
			return Config{}, fieldError(root, path+".type", "required (%s, %s or %s)", policyStatic, policySoftReflective, policyHoldback)
		}
		name := p.Name
		if name == "" {
			name = p.Type
		}
		if seen[name] {
			return Config{}, fieldError(root, path+".name", "duplicate plugin name %q", name)
		}
		seen[name] = true
		ref := PolicyRef{Type: p.Type}
		switch p.Type {
		case policyStatic:
			if err := checkKeys(root, &p.Parameters, path+".parameters", "threshold"); err != nil {
				return Config{}, err
			}
			var params struct {
				Threshold *float64 `yaml:"threshold"`
			}
			if err := decodeNode(&p.Parameters, path+".parameters", &params); err != nil {
				return Config{}, err
			}
			ref.Threshold = 1.0
			if t := params.Threshold; t != nil {
				if !finite(*t) || *t <= 0 {
					return Config{}, fieldError(root, path+".parameters.threshold", "must be a finite number > 0, got %v", *t)
				}
				ref.Threshold = *t
			}
		case policyHoldback:
			h, err := holdbackParams(root, &p.Parameters, path+".parameters")
			if err != nil {
				return Config{}, err
			}
			ref.Holdback = h
		case policySoftReflective:
			if p.Parameters.Kind == yaml.MappingNode && len(p.Parameters.Content) > 0 {
				k := p.Parameters.Content[0]
				return Config{}, fmt.Errorf("proxy: config: %s.parameters.%s (line %d): %s takes no %s (it has no free parameter)",
					path, k.Value, k.Line, policySoftReflective, k.Value)
			}
		case detectorUtilization:
			if err := checkKeys(root, &p.Parameters, path+".parameters", "queueDepthThreshold", "kvCacheUtilThreshold",
				"metricsStalenessThreshold", "stalenessPolicy", "headroom"); err != nil {
				return Config{}, err
			}
			detectors[name] = detector{p, path}
			continue
		case fairnessDefault, fairnessRoundRobin, fairnessProgramAware, orderingDefault, orderingEDF, orderingSLO:
			queuePlugins[name] = p.Type
			continue
		default:
			warn("%s (line %d): plugin type %q ignored (flowgate implements %s, %s, %s and %s)", path, lineOf(root, path),
				p.Type, policyStatic, policySoftReflective, policyHoldback, detectorUtilization)
			continue
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
		case ref == policyHoldback:
			// llm-d has no default minCeiling either: the policy
			// must be declared with its parameters.
			return Config{}, fieldError(root, "flowControl.usageLimitPolicyPluginRef",
				"%s has no default minCeiling: declare it under plugins with parameters.minCeiling and name that plugin here", policyHoldback)
		default:
			return Config{}, fieldError(root, "flowControl.usageLimitPolicyPluginRef",
				"%q is neither a declared policy plugin nor a policy type (%s, %s, %s)", ref, policyStatic, policySoftReflective, policyHoldback)
		}
	}
	holdbackRef := fcf.UsageLimitPolicyPluginRef // the plugin whose ceilings are computed once the bands are known

	// The saturation detector: llm-d's utilization-detector parameters,
	// then flowgate's own saturationDetector section over them.
	var det *detector
	if sdr := fcf.SaturationDetector; sdr != nil && sdr.PluginRef != "" {
		d, ok := detectors[sdr.PluginRef]
		if !ok {
			return Config{}, fieldError(root, "flowControl.saturationDetector.pluginRef",
				"%q is not a declared %s plugin (flowgate has no %s)", sdr.PluginRef, detectorUtilization, detectorConcurrency)
		}
		det = &d
	} else if len(detectors) == 1 {
		for _, d := range detectors {
			det = &d
		}
	}
	sd := fc.SaturationDetector
	if det != nil {
		var params struct {
			QueueDepthThreshold       *float64       `yaml:"queueDepthThreshold"`
			KVCacheUtilThreshold      *float64       `yaml:"kvCacheUtilThreshold"`
			MetricsStalenessThreshold *time.Duration `yaml:"metricsStalenessThreshold"`
			StalenessPolicy           string         `yaml:"stalenessPolicy"`
			Headroom                  *float64       `yaml:"headroom"`
		}
		if err := decodeNode(&det.Parameters, det.path+".parameters", &params); err != nil {
			return Config{}, err
		}
		if params.StalenessPolicy != "" && params.StalenessPolicy != "saturated" {
			warn("%s stalenessPolicy %q ignored: a stale pod reads saturated", detectorUtilization, params.StalenessPolicy)
		}
		if params.Headroom != nil && *params.Headroom != 0 {
			warn("%s headroom %v ignored", detectorUtilization, *params.Headroom)
		}
		if sd.QueueDepthThreshold == nil {
			sd.QueueDepthThreshold = params.QueueDepthThreshold
		}
		if sd.KVCacheUtilThreshold == nil {
			sd.KVCacheUtilThreshold = params.KVCacheUtilThreshold
		}
		if sd.MetricsStalenessThreshold == nil {
			sd.MetricsStalenessThreshold = params.MetricsStalenessThreshold
		}
	}

	// Global limits and the band template (llm-d).
	globalReqs, hasGlobalReqs, err := quantityAt(root, &fcf.MaxRequests, "flowControl.maxRequests")
	if err != nil {
		return Config{}, err
	}
	globalBytes, hasGlobalBytes, err := quantityAt(root, &fcf.MaxBytes, "flowControl.maxBytes")
	if err != nil {
		return Config{}, err
	}
	if hasGlobalReqs || hasGlobalBytes {
		warn("flowControl.maxRequests/maxBytes: applied per band (no band exceeds them); flowgate has no limit shared by the bands")
	}
	var defaultWait *time.Duration
	if v := fcf.DefaultRequestTTL; v != nil {
		if *v < 0 {
			return Config{}, fieldError(root, "flowControl.defaultRequestTTL", "must not be negative, got %v", *v)
		}
		defaultWait = v
	}
	tmplReqs, tmplBytes := int64(0), int64(0)
	var tmplQueue Band // the template's fairness, ordering and flow capacity
	hasTmplReqs, hasTmplBytes := false, false
	defaultBandName := ""
	switch n := &fcf.DefaultPriorityBand; n.Kind {
	case 0:
	case yaml.ScalarNode:
		defaultBandName = n.Value
	case yaml.MappingNode:
		path := "flowControl.defaultPriorityBand"
		if err := checkKeys(root, n, path, "maxRequests", "maxBytes", "fairnessPolicyRef", "orderingPolicyRef",
			"fairness", "ordering", "flowCapacity"); err != nil {
			return Config{}, err
		}
		var tmpl fileBand
		if err := decodeNode(n, path, &tmpl); err != nil {
			return Config{}, err
		}
		if tmplQueue, err = bandQueueing(root, tmpl, path, queuePlugins, Band{}, warn); err != nil {
			return Config{}, err
		}
		if tmplReqs, hasTmplReqs, err = quantityAt(root, &tmpl.MaxRequests, path+".maxRequests"); err != nil {
			return Config{}, err
		}
		if tmplBytes, hasTmplBytes, err = quantityAt(root, &tmpl.MaxBytes, path+".maxBytes"); err != nil {
			return Config{}, err
		}
	default:
		return Config{}, fieldError(root, "flowControl.defaultPriorityBand", "must be a band name or a band template")
	}

	if fcf.PriorityBands != nil {
		if len(fcf.PriorityBands) == 0 {
			return Config{}, fieldError(root, "flowControl.priorityBands", "at least one band is required")
		}
		bands := make([]Band, 0, len(fcf.PriorityBands))
		names := map[string]bool{}
		prios := map[int]bool{}
		total := 0
		for i, b := range fcf.PriorityBands {
			path := fmt.Sprintf("flowControl.priorityBands[%d]", i)
			if b.Priority == nil {
				return Config{}, fieldError(root, path+".priority", "required (higher is more important)")
			}
			if prios[*b.Priority] {
				return Config{}, fieldError(root, path+".priority", "duplicate priority %d", *b.Priority)
			}
			prios[*b.Priority] = true
			if b.Name == "" {
				b.Name = fmt.Sprintf("priority%d", *b.Priority) // llm-d's bands have no name
			}
			if err := checkBandName(b.Name); err != nil {
				return Config{}, fieldError(root, path+".name", "%q: %v", b.Name, err)
			}
			if names[b.Name] {
				return Config{}, fieldError(root, path+".name", "duplicate band name %q", b.Name)
			}
			names[b.Name] = true
			band := Band{Name: b.Name, Priority: *b.Priority, Capacity: defaultBandCapacity, MaxBytes: DefaultBandBytes}
			q, err := bandQueueing(root, b, path, queuePlugins, tmplQueue, warn)
			if err != nil {
				return Config{}, err
			}
			band.Fairness, band.Ordering, band.FlowCapacity = q.Fairness, q.Ordering, q.FlowCapacity
			capPath := path + ".capacity"
			reqs, hasReqs, err := quantityAt(root, &b.MaxRequests, path+".maxRequests")
			if err != nil {
				return Config{}, err
			}
			switch {
			case b.Capacity != nil && hasReqs:
				return Config{}, fieldError(root, path+".maxRequests", "capacity and maxRequests are one setting: give one")
			case b.Capacity != nil:
				reqs, hasReqs = int64(*b.Capacity), true
			case hasReqs:
				capPath = path + ".maxRequests"
			case hasTmplReqs:
				reqs, hasReqs, capPath = tmplReqs, true, "flowControl.defaultPriorityBand.maxRequests"
			}
			if hasGlobalReqs && (!hasReqs || reqs > globalReqs) {
				reqs, hasReqs, capPath = globalReqs, true, "flowControl.maxRequests"
			}
			if hasReqs {
				if reqs <= 0 || reqs > MaxBandCapacity {
					return Config{}, fieldError(root, capPath, "must be in 1..%d, got %d", MaxBandCapacity, reqs)
				}
				band.Capacity = int(reqs)
			}
			total += band.Capacity
			if total > MaxTotalCapacity {
				return Config{}, fieldError(root, capPath, "the bands' capacities add up to more than %d waiting requests", MaxTotalCapacity)
			}
			bytes, hasBytes, err := quantityAt(root, &b.MaxBytes, path+".maxBytes")
			if err != nil {
				return Config{}, err
			}
			if !hasBytes && hasTmplBytes {
				bytes, hasBytes = tmplBytes, true
			}
			if hasGlobalBytes && globalBytes > 0 && (!hasBytes || bytes == 0 || bytes > globalBytes) {
				bytes, hasBytes = globalBytes, true
			}
			if hasBytes {
				band.MaxBytes = bytes // 0: no budget
			}
			switch {
			case b.MaxWait != nil:
				if *b.MaxWait < 0 {
					return Config{}, fieldError(root, path+".maxWait", "must not be negative, got %v", *b.MaxWait)
				}
				band.MaxWait = *b.MaxWait
			case defaultWait != nil:
				band.MaxWait = *defaultWait
			}
			fcPath := path + ".flowCapacity"
			if b.FlowCapacity == nil {
				fcPath = "flowControl.defaultPriorityBand.flowCapacity"
			}
			if err := checkFlowCapacity(root, band, fcPath); err != nil {
				return Config{}, err
			}
			bands = append(bands, band)
		}
		sort.SliceStable(bands, func(i, j int) bool { return bands[i].Priority > bands[j].Priority })
		cfg.Bands = bands
		cfg.DefaultBand = len(bands) - 1
		cfg.Objectives = defaultObjectives(bands)
	} else {
		// flowgate's default bands take the template's fairness, ordering
		// and flow capacity (and the default request TTL).
		for i := range cfg.Bands {
			b := &cfg.Bands[i]
			if defaultWait != nil {
				b.MaxWait = *defaultWait
			}
			b.Fairness, b.Ordering, b.FlowCapacity = tmplQueue.Fairness, tmplQueue.Ordering, tmplQueue.FlowCapacity
			if err := checkFlowCapacity(root, *b, "flowControl.defaultPriorityBand.flowCapacity"); err != nil {
				return Config{}, err
			}
		}
	}

	bandIndex := func(path, name string) (int, error) {
		for i, b := range cfg.Bands {
			if b.Name == name {
				return i, nil
			}
		}
		return 0, fieldError(root, path, "no band named %q", name)
	}
	if defaultBandName != "" {
		i, err := bandIndex("flowControl.defaultPriorityBand", defaultBandName)
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
		if *fcf.Tick < flowcontrol.MinTick || *fcf.Tick > time.Second {
			return Config{}, fieldError(root, "flowControl.tick", "must be in [%v, 1s], got %v", flowcontrol.MinTick, *fcf.Tick)
		}
		cfg.Tick = *fcf.Tick
	}
	if fcf.Burst != nil {
		if *fcf.Burst <= 0 || *fcf.Burst > 1<<20 {
			return Config{}, fieldError(root, "flowControl.burst", "must be in 1..%d, got %d", 1<<20, *fcf.Burst)
		}
		cfg.Burst = *fcf.Burst
	}
	switch fcf.BodyPriority {
	case "":
	case BodyPriorityKeep, BodyPriorityStrip, BodyPriorityIgnore, BodyPrioritySet:
		cfg.BodyPriority = fcf.BodyPriority
	default:
		return Config{}, fieldError(root, "flowControl.bodyPriority", "must be %s, %s, %s or %s, got %q",
			BodyPriorityKeep, BodyPriorityStrip, BodyPriorityIgnore, BodyPrioritySet, fcf.BodyPriority)
	}

	if v := fcf.CriticalKVHeadroom; v != nil {
		if !finite(*v) || *v < 0 || *v > 1 {
			return Config{}, fieldError(root, "flowControl.criticalKVHeadroom", "must be in [0, 1] (0: off), got %v", *v)
		}
		h := *v
		cfg.CriticalKVHeadroom = &h
	}

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
	switch sd.Engine {
	case "":
	case EngineVLLM, EngineSGLang:
		cfg.Saturation.Engine = sd.Engine
	default:
		return Config{}, fieldError(root, "saturationDetector.engine", "must be %s or %s, got %q", EngineVLLM, EngineSGLang, sd.Engine)
	}
	if sh := fc.SharedInFlight; sh != nil {
		path := "sharedInFlight"
		if sh.Address == "" && sh.URL == "" {
			return Config{}, fieldError(root, path+".address", "required in a sharedInFlight section: the Redis host:port, or url: a redis:// or rediss:// URL")
		}
		cfg.Shared = SharedConfig{Address: sh.Address, URL: sh.URL, Mode: sh.Mode, ReplicaID: sh.ReplicaID}
		if sh.Period != nil {
			if *sh.Period <= 0 {
				return Config{}, fieldError(root, path+".period", "must be > 0, got %v", *sh.Period)
			}
			cfg.Shared.Period = *sh.Period
		}
		if sh.TTL != nil {
			if *sh.TTL <= 0 {
				return Config{}, fieldError(root, path+".ttl", "must be > 0, got %v", *sh.TTL)
			}
			cfg.Shared.TTL = *sh.TTL
		}
		if cfg.Shared.Period == 0 {
			cfg.Shared.Period = redisshare.DefaultPeriod
		}
		if cfg.Shared.TTL == 0 {
			cfg.Shared.TTL = redisshare.DefaultTTL
		}
		chk := cfg.Shared
		if chk.ReplicaID == "" {
			chk.ReplicaID = "-" // may come from the proxy's -replica-id; checked there
		}
		if err := chk.Validate(SharedFileFields); err != nil {
			// Name the line of the field the message starts with.
			field, msg, _ := strings.Cut(err.Error(), ": ")
			return Config{}, fieldError(root, field, "%s", msg)
		}
	}
	if cfg.Policy.Type == policyHoldback {
		prios := make([]int, len(cfg.Bands))
		for i, b := range cfg.Bands {
			prios[i] = b.Priority
		}
		c, err := flowcontrol.HoldbackCeilings(cfg.Policy.Holdback, prios)
		if err != nil {
			// holdbackParams checked the parameters and the bands'
			// priorities are distinct and sorted: not reached unless
			// the two disagree.
			return Config{}, fieldError(root, "flowControl.usageLimitPolicyPluginRef", "%s: %v", holdbackRef, err)
		}
		cfg.Policy.Ceilings = c
	}
	if cfg.Saturation.ScrapeInterval >= cfg.Saturation.MetricsStalenessThreshold {
		return Config{}, fieldError(root, "saturationDetector.scrapeInterval",
			"must be shorter than metricsStalenessThreshold (%v), or every pod reads as stale", cfg.Saturation.MetricsStalenessThreshold)
	}
	return cfg, nil
}

// holdbackParams reads priority-holdback-policy's parameters as llm-d does:
// shape (linear), domain (rank, value or explicit; default rank), minCeiling
// (required, in [0, 1)) and maxCeiling (default 1, in (0, 1], above
// minCeiling), or with domain explicit only ceilings (priority → ceiling in
// [0, 1], not increasing as priority falls). Errors name the key.
func holdbackParams(root, n *yaml.Node, path string) (flowcontrol.HoldbackConfig, error) {
	var h flowcontrol.HoldbackConfig
	if err := checkKeys(root, n, path, "shape", "domain", "minCeiling", "maxCeiling", "ceilings"); err != nil {
		return h, err
	}
	var params struct {
		Shape      *string   `yaml:"shape"`
		Domain     *string   `yaml:"domain"`
		MinCeiling *float64  `yaml:"minCeiling"`
		MaxCeiling *float64  `yaml:"maxCeiling"`
		Ceilings   yaml.Node `yaml:"ceilings"` // read below: its keys are priorities
	}
	if err := decodeNode(n, path, &params); err != nil {
		return h, err
	}
	ceilings, err := holdbackMap(root, &params.Ceilings, path+".ceilings")
	if err != nil {
		return h, err
	}
	h.Domain = flowcontrol.HoldbackRank
	if d := params.Domain; d != nil {
		switch *d {
		case flowcontrol.HoldbackRank, flowcontrol.HoldbackValue, flowcontrol.HoldbackExplicit:
			h.Domain = *d
		default:
			return h, fieldError(root, path+".domain", "must be %s, %s or %s, got %q",
				flowcontrol.HoldbackRank, flowcontrol.HoldbackValue, flowcontrol.HoldbackExplicit, *d)
		}
	}
	if h.Domain == flowcontrol.HoldbackExplicit {
		for _, k := range []struct {
			key string
			set bool
		}{{"shape", params.Shape != nil}, {"minCeiling", params.MinCeiling != nil}, {"maxCeiling", params.MaxCeiling != nil}} {
			if k.set {
				return h, fieldError(root, path+"."+k.key, "must not be set with domain %s (the ceilings are given)", flowcontrol.HoldbackExplicit)
			}
		}
		if len(ceilings) == 0 {
			return h, fieldError(root, path+".ceilings", "required with domain %s (a map of priority to ceiling)", flowcontrol.HoldbackExplicit)
		}
		prios := slices.Sorted(maps.Keys(ceilings))
		for i := len(prios) - 2; i >= 0; i-- {
			lo, hi := prios[i], prios[i+1]
			if ceilings[lo] > ceilings[hi] {
				return h, fieldError(root, fmt.Sprintf("%s.ceilings.%d", path, lo),
					"%v is above the ceiling of the higher priority %d (%v): ceilings must not increase as priority falls",
					ceilings[lo], hi, ceilings[hi])
			}
		}
		h.Ceilings = ceilings
		return h, nil
	}
	if params.Ceilings.Kind != 0 {
		return h, fieldError(root, path+".ceilings", "only with domain %s", flowcontrol.HoldbackExplicit)
	}
	if sh := params.Shape; sh != nil && *sh != flowcontrol.HoldbackLinear {
		return h, fieldError(root, path+".shape", "must be %s (the only shape), got %q", flowcontrol.HoldbackLinear, *sh)
	}
	if params.MinCeiling == nil {
		// Named at the parameters (or the plugin, without any): the key
		// itself is not there to point at.
		at := path
		if n.Kind == 0 {
			at = strings.TrimSuffix(path, ".parameters")
		}
		return h, fieldError(root, at, "minCeiling is required (the lowest band's ceiling, in [0, 1): llm-d has no default)")
	}
	h.MinCeiling = *params.MinCeiling
	if !(h.MinCeiling >= 0 && h.MinCeiling < 1) {
		return h, fieldError(root, path+".minCeiling", "must be in [0, 1), got %v", h.MinCeiling)
	}
	h.MaxCeiling = flowcontrol.DefaultHoldbackMaxCeiling
	if v := params.MaxCeiling; v != nil {
		if !(*v > 0 && *v <= 1) {
			return h, fieldError(root, path+".maxCeiling", "must be in (0, 1], got %v", *v)
		}
		h.MaxCeiling = *v
	}
	if h.MinCeiling >= h.MaxCeiling {
		return h, fieldError(root, path+".minCeiling", "%v must be below maxCeiling (%v)", h.MinCeiling, h.MaxCeiling)
	}
	return h, nil
}

// holdbackMap reads explicit ceilings: a mapping of priority (an integer) to
// ceiling (a number in [0, 1]); nil if absent. Errors name the entry.
func holdbackMap(root, n *yaml.Node, path string) (map[int]float64, error) {
	if n.Kind == 0 {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fieldError(root, path, "must be a mapping of priority to ceiling, such as {100: 0.9, 0: 0.4}, not %s", describeNode(n))
	}
	m := map[int]float64{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p, err := strconv.Atoi(k.Value)
		if k.Kind != yaml.ScalarNode || err != nil {
			return nil, fmt.Errorf("proxy: config: %s.%s (line %d): a key of ceilings is a priority, a whole number", path, k.Value, k.Line)
		}
		if _, dup := m[p]; dup {
			return nil, fmt.Errorf("proxy: config: %s.%d (line %d): priority %d given twice", path, p, k.Line, p)
		}
		c, err := strconv.ParseFloat(v.Value, 64)
		if v.Kind != yaml.ScalarNode || err != nil || !(c >= 0 && c <= 1) {
			return nil, fmt.Errorf("proxy: config: %s.%d (line %d): must be a number in [0, 1], got %q", path, p, v.Line, v.Value)
		}
		m[p] = c
	}
	return m, nil
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
