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
	"slices"
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
	// requests nothing else places) or llm-d's band template (a
	// fileQueue: the defaults of bands that do not set them).
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
	// flowgate's: Config.BodyPriority and Config.CriticalKVHeadroom.
	BodyPriority       string   `yaml:"bodyPriority"`
	CriticalKVHeadroom *float64 `yaml:"criticalKVHeadroom"`
}

type fileBand struct {
	Name      string         `yaml:"name"`
	Priority  *int           `yaml:"priority"`
	Capacity  *int           `yaml:"capacity"`
	MaxWait   *time.Duration `yaml:"maxWait"`
	fileQueue `yaml:",inline"`
}

// fileQueue is what a band and the band template share.
type fileQueue struct {
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

// fileThresholds is what flowgate's saturationDetector section and llm-d's
// utilization-detector parameters share; the section's win.
type fileThresholds struct {
	QueueDepthThreshold       *float64       `yaml:"queueDepthThreshold"`
	KVCacheUtilThreshold      *float64       `yaml:"kvCacheUtilThreshold"`
	MetricsStalenessThreshold *time.Duration `yaml:"metricsStalenessThreshold"`
}

type fileSaturationDetector struct {
	fileThresholds `yaml:",inline"`
	ScrapeInterval *time.Duration `yaml:"scrapeInterval"`
	InFlightCredit *bool          `yaml:"inFlightCredit"`
	Engine         string         `yaml:"engine"` // the metric names: vllm (default) or sglang
}

// fileDetector is llm-d's utilization-detector parameters.
type fileDetector struct {
	fileThresholds  `yaml:",inline"`
	StalenessPolicy string   `yaml:"stalenessPolicy"`
	Headroom        *float64 `yaml:"headroom"`
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
// the value as written and what the field takes (decode.go); a semantic
// error names the field's path (and its line when the field was written).
func ParseConfig(r io.Reader) (cfg Config, err error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("proxy: config: %w", err)
	}
	if len(data) > maxConfigBytes {
		return Config{}, fmt.Errorf("proxy: config: larger than %d bytes", maxConfigBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root, extra yaml.Node
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, syntaxError(err, data)
	}
	defer func() {
		if r := recover(); r != nil {
			ce, ok := r.(configError)
			if !ok {
				panic(r)
			}
			cfg, err = Config{}, ce.error
		}
	}()
	p := &parser{keys: map[string]*yaml.Node{}, seen: map[aliasUse]bool{}}
	var fc fileConfig
	p.decode(&root, "", &fc)
	// A second document would be silently ignored: refuse it.
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("proxy: config: more than one YAML document")
	}
	return p.resolve(&fc), nil
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

// resolve validates the decoded document and fills the defaults.
func (p *parser) resolve(fc *fileConfig) Config {
	cfg := DefaultConfig()
	for _, section := range []string{"data", "featureGates", "parser", "requestControl", "schedulingProfiles"} {
		if p.keys[section] != nil { // fileConfig's yaml.Node fields
			p.warn("%s: ignored (flowgate orders requests; it does not pick endpoints)", p.at(section))
		}
	}
	d := p.plugins(fc.Plugins)
	fcf := &fc.FlowControl
	const refPath = "flowControl.usageLimitPolicyPluginRef"
	ref := fcf.UsageLimitPolicyPluginRef
	switch r, ok := d.policies[ref]; {
	case ref == "":
	case ok:
		cfg.Policy = r
	case ref == policyStatic:
		cfg.Policy = PolicyRef{Type: policyStatic, Threshold: 1.0}
	case ref == policySoftReflective:
		cfg.Policy = PolicyRef{Type: policySoftReflective}
	case ref == policyHoldback: // llm-d has no default minCeiling either
		p.fail(refPath, "%s has no default minCeiling: declare it under plugins with parameters.minCeiling and name that plugin here", policyHoldback)
	default:
		p.fail(refPath, "%q is neither a declared policy plugin nor a policy type (%s, %s, %s)", ref, policyStatic, policySoftReflective, policyHoldback)
	}
	p.saturationDetector(&fc.SaturationDetector, fcf, d.detectors)
	p.bands(&cfg, fcf, d.queueing)
	if v := fcf.Tick; v != nil {
		p.check(*v >= flowcontrol.MinTick && *v <= time.Second, "flowControl.tick", "must be in [%v, 1s], got %v", flowcontrol.MinTick, *v)
		cfg.Tick = *v
	}
	if v := fcf.Burst; v != nil {
		p.check(*v > 0 && *v <= 1<<20, "flowControl.burst", "must be in 1..%d, got %d", 1<<20, *v)
		cfg.Burst = *v
	}
	switch v := fcf.BodyPriority; v {
	case "":
	case BodyPriorityKeep, BodyPriorityStrip, BodyPriorityIgnore, BodyPrioritySet:
		cfg.BodyPriority = v
	default:
		p.fail("flowControl.bodyPriority", "must be %s, %s, %s or %s, got %q", BodyPriorityKeep, BodyPriorityStrip, BodyPriorityIgnore, BodyPrioritySet, v)
	}
	if v := fcf.CriticalKVHeadroom; v != nil {
		p.check(finite(*v) && *v >= 0 && *v <= 1, "flowControl.criticalKVHeadroom", "must be in [0, 1] (0: off), got %v", *v)
		cfg.CriticalKVHeadroom = new(*v)
	}
	p.saturation(&cfg.Saturation, fc.SaturationDetector)
	if sh := fc.SharedInFlight; sh != nil {
		cfg.Shared = p.shared(sh)
	}
	if cfg.Policy.Type == policyHoldback {
		prios := make([]int, len(cfg.Bands))
		for i, b := range cfg.Bands {
			prios[i] = b.Priority
		}
		c, err := flowcontrol.HoldbackCeilings(cfg.Policy.Holdback, prios)
		// holdback checked the parameters and the bands' priorities are
		// distinct and sorted: not reached unless the two disagree.
		p.check(err == nil, refPath, "%s: %v", ref, err)
		cfg.Policy.Ceilings = c
	}
	s := cfg.Saturation
	p.check(s.ScrapeInterval < s.MetricsStalenessThreshold, "saturationDetector.scrapeInterval",
		"must be shorter than metricsStalenessThreshold (%v), or every pod reads as stale", s.MetricsStalenessThreshold)
	cfg.Warnings = p.warnings
	return cfg
}

// declared is what the plugins section declares, by plugin name.
type declared struct {
	policies  map[string]PolicyRef
	detectors map[string]fileDetector
	queueing  map[string]string // fairness and ordering plugins: their type
}

// plugins reads the plugins section: names unique; policy types checked
// strictly; llm-d's utilization detector read; anything else ignored with a
// warning.
func (p *parser) plugins(plugins []filePlugin) declared {
	d := declared{map[string]PolicyRef{}, map[string]fileDetector{}, map[string]string{}}
	seen := map[string]bool{}
	for i, pl := range plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		params := path + ".parameters"
		p.check(pl.Type != "", path+".type", "required (%s, %s or %s)", policyStatic, policySoftReflective, policyHoldback)
		name := cmp.Or(pl.Name, pl.Type)
		p.check(!seen[name], path+".name", "duplicate plugin name %q", name)
		seen[name] = true
		switch pl.Type {
		case policyStatic:
			var sp struct {
				Threshold *float64 `yaml:"threshold"`
			}
			p.decode(&pl.Parameters, params, &sp)
			ref := PolicyRef{Type: policyStatic, Threshold: 1.0}
			if t := sp.Threshold; t != nil {
				p.check(finite(*t) && *t > 0, params+".threshold", "must be a finite number > 0, got %v", *t)
				ref.Threshold = *t
			}
			d.policies[name] = ref
		case policyHoldback:
			d.policies[name] = PolicyRef{Type: policyHoldback, Holdback: p.holdback(&pl.Parameters, params)}
		case policySoftReflective:
			if n := &pl.Parameters; n.Kind == yaml.MappingNode && len(n.Content) > 0 {
				k := n.Content[0]
				p.keys[params+"."+k.Value] = k
				p.fail(params+"."+k.Value, "%s takes no %s (it has no free parameter)", policySoftReflective, k.Value)
			}
			d.policies[name] = PolicyRef{Type: policySoftReflective}
		case detectorUtilization:
			var det fileDetector
			p.decode(&pl.Parameters, params, &det)
			d.detectors[name] = det
		case fairnessDefault, fairnessRoundRobin, fairnessProgramAware, orderingDefault, orderingEDF, orderingSLO:
			d.queueing[name] = pl.Type
		default:
			p.warn("%s: plugin type %q ignored (flowgate implements %s, %s, %s and %s)", p.at(path),
				pl.Type, policyStatic, policySoftReflective, policyHoldback, detectorUtilization)
		}
	}
	return d
}

// saturationDetector fills the thresholds sd leaves unset from the
// utilization-detector flowControl.saturationDetector names (or the only one
// declared), and warns of its parameters flowgate does not apply.
func (p *parser) saturationDetector(sd *fileSaturationDetector, fcf *fileFlowControl, detectors map[string]fileDetector) {
	var det *fileDetector
	if sdr := fcf.SaturationDetector; sdr != nil && sdr.PluginRef != "" {
		d, ok := detectors[sdr.PluginRef]
		p.check(ok, "flowControl.saturationDetector.pluginRef", "%q is not a declared %s plugin (flowgate has no %s)",
			sdr.PluginRef, detectorUtilization, detectorConcurrency)
		det = &d
	} else if len(detectors) == 1 {
		for _, d := range detectors {
			det = &d
		}
	}
	if det == nil {
		return
	}
	if det.StalenessPolicy != "" && det.StalenessPolicy != "saturated" {
		p.warn("%s stalenessPolicy %q ignored: a stale pod reads saturated", detectorUtilization, det.StalenessPolicy)
	}
	if det.Headroom != nil && *det.Headroom != 0 {
		p.warn("%s headroom %v ignored", detectorUtilization, *det.Headroom)
	}
	sd.QueueDepthThreshold = cmp.Or(sd.QueueDepthThreshold, det.QueueDepthThreshold)
	sd.KVCacheUtilThreshold = cmp.Or(sd.KVCacheUtilThreshold, det.KVCacheUtilThreshold)
	sd.MetricsStalenessThreshold = cmp.Or(sd.MetricsStalenessThreshold, det.MetricsStalenessThreshold)
}

// bands resolves the bands, the default band and the objectives: the bands of
// priorityBands, or flowgate's default ones, each under llm-d's band
// template (defaultPriorityBand) and global limits (maxRequests, maxBytes,
// defaultRequestTTL).
func (p *parser) bands(cfg *Config, fcf *fileFlowControl, queueing map[string]string) {
	globalReqs := p.quantity(&fcf.MaxRequests, "flowControl.maxRequests")
	globalBytes := p.quantity(&fcf.MaxBytes, "flowControl.maxBytes")
	if globalReqs != nil || globalBytes != nil {
		p.warn("flowControl.maxRequests/maxBytes: applied per band (no band exceeds them); flowgate has no limit shared by the bands")
	}
	if v := fcf.DefaultRequestTTL; v != nil {
		p.check(*v >= 0, "flowControl.defaultRequestTTL", "must not be negative, got %v", *v)
	}
	const tp = "flowControl.defaultPriorityBand"
	var tmpl fileQueue
	var tmplQueue Band // the template's fairness, ordering and flow capacity
	defaultBand := ""
	switch n := &fcf.DefaultPriorityBand; n.Kind {
	case 0:
	case yaml.ScalarNode:
		defaultBand = n.Value
	case yaml.MappingNode:
		p.decode(n, tp, &tmpl)
		tmplQueue = p.queueing(tmpl, tp, queueing, Band{})
	default:
		p.fail(tp, "must be a band name or a band template")
	}
	tmplReqs := p.quantity(&tmpl.MaxRequests, tp+".maxRequests")
	tmplBytes := p.quantity(&tmpl.MaxBytes, tp+".maxBytes")

	if fcf.PriorityBands == nil {
		// flowgate's default bands take the template's fairness, ordering
		// and flow capacity (and the default request TTL).
		for i := range cfg.Bands {
			b := &cfg.Bands[i]
			if w := fcf.DefaultRequestTTL; w != nil {
				b.MaxWait = *w
			}
			b.Fairness, b.Ordering, b.FlowCapacity = tmplQueue.Fairness, tmplQueue.Ordering, tmplQueue.FlowCapacity
			p.checkFlowCapacity(*b, tp+".flowCapacity")
		}
	} else {
		p.check(len(fcf.PriorityBands) > 0, "flowControl.priorityBands", "at least one band is required")
		cfg.Bands = nil
		names, prios := map[string]bool{}, map[int]bool{}
		total := 0
		for i, b := range fcf.PriorityBands {
			path := fmt.Sprintf("flowControl.priorityBands[%d]", i)
			p.check(b.Priority != nil, path+".priority", "required (higher is more important)")
			p.check(!prios[*b.Priority], path+".priority", "duplicate priority %d", *b.Priority)
			prios[*b.Priority] = true
			name := cmp.Or(b.Name, fmt.Sprintf("priority%d", *b.Priority)) // llm-d's bands have no name
			p.checkBandName(name, path+".name")
			p.check(!names[name], path+".name", "duplicate band name %q", name)
			names[name] = true
			band := p.queueing(b.fileQueue, path, queueing, tmplQueue)
			band.Name, band.Priority, band.Capacity, band.MaxBytes = name, *b.Priority, defaultBandCapacity, DefaultBandBytes

			reqs, capPath := p.quantity(&b.MaxRequests, path+".maxRequests"), path+".capacity"
			switch {
			case b.Capacity != nil && reqs != nil:
				p.fail(path+".maxRequests", "capacity and maxRequests are one setting: give one")
			case b.Capacity != nil:
				reqs = new(int64(*b.Capacity))
			case reqs != nil:
				capPath = path + ".maxRequests"
			case tmplReqs != nil:
				reqs, capPath = tmplReqs, tp+".maxRequests"
			}
			if globalReqs != nil && (reqs == nil || *reqs > *globalReqs) {
				reqs, capPath = globalReqs, "flowControl.maxRequests"
			}
			if reqs != nil {
				p.check(*reqs > 0 && *reqs <= MaxBandCapacity, capPath, "must be in 1..%d, got %d", MaxBandCapacity, *reqs)
				band.Capacity = int(*reqs)
			}
			total += band.Capacity
			p.check(total <= MaxTotalCapacity, capPath, "the bands' capacities add up to more than %d waiting requests", MaxTotalCapacity)

			bytes := cmp.Or(p.quantity(&b.MaxBytes, path+".maxBytes"), tmplBytes)
			if globalBytes != nil && *globalBytes > 0 && (bytes == nil || *bytes == 0 || *bytes > *globalBytes) {
				bytes = globalBytes
			}
			if bytes != nil {
				band.MaxBytes = *bytes // 0: no budget
			}
			if w := b.MaxWait; w != nil {
				p.check(*w >= 0, path+".maxWait", "must not be negative, got %v", *w)
			}
			if w := cmp.Or(b.MaxWait, fcf.DefaultRequestTTL); w != nil {
				band.MaxWait = *w
			}
			fcPath := tp + ".flowCapacity"
			if b.FlowCapacity != nil {
				fcPath = path + ".flowCapacity"
			}
			p.checkFlowCapacity(band, fcPath)
			cfg.Bands = append(cfg.Bands, band)
		}
		slices.SortStableFunc(cfg.Bands, func(a, b Band) int { return cmp.Compare(b.Priority, a.Priority) })
		cfg.DefaultBand = len(cfg.Bands) - 1
		cfg.Objectives = defaultObjectives(cfg.Bands)
	}
	if defaultBand != "" {
		cfg.DefaultBand = p.bandIndex(cfg.Bands, tp, defaultBand)
	}
	for _, obj := range slices.Sorted(maps.Keys(fcf.Objectives)) {
		p.check(obj != "", "flowControl.objectives", "empty objective name")
		cfg.Objectives[obj] = p.bandIndex(cfg.Bands, "flowControl.objectives."+obj, fcf.Objectives[obj])
	}
}

// saturation applies the saturationDetector section to the poller's settings.
func (p *parser) saturation(s *SaturationConfig, sd fileSaturationDetector) {
	const at = "saturationDetector."
	if v := sd.QueueDepthThreshold; v != nil {
		p.check(finite(*v) && *v > 0, at+"queueDepthThreshold", "must be a finite number > 0, got %v", *v)
		s.QueueDepthThreshold = *v
	}
	if v := sd.KVCacheUtilThreshold; v != nil {
		p.check(finite(*v) && *v > 0 && *v <= 1, at+"kvCacheUtilThreshold", "must be in (0, 1], got %v", *v)
		s.KVCacheUtilThreshold = *v
	}
	if v := sd.MetricsStalenessThreshold; v != nil {
		p.check(*v >= saturation.MinStaleness && *v <= saturation.MaxStaleness, at+"metricsStalenessThreshold",
			"must be in [%v, %v], got %v", saturation.MinStaleness, saturation.MaxStaleness, *v)
		s.MetricsStalenessThreshold = *v
	}
	if v := sd.ScrapeInterval; v != nil {
		p.check(*v >= saturation.MinInterval && *v <= saturation.MaxInterval, at+"scrapeInterval",
			"must be in [%v, %v], got %v", saturation.MinInterval, saturation.MaxInterval, *v)
		s.ScrapeInterval = *v
	}
	if v := sd.InFlightCredit; v != nil {
		s.InFlightCredit = *v
	}
	switch sd.Engine {
	case "":
	case EngineVLLM, EngineSGLang:
		s.Engine = sd.Engine
	default:
		p.fail(at+"engine", "must be %s or %s, got %q", EngineVLLM, EngineSGLang, sd.Engine)
	}
}

// shared resolves the sharedInFlight section; SharedConfig.Validate states
// the rules, bar the replica's name, which may come from -replica-id.
func (p *parser) shared(sh *fileSharedInFlight) SharedConfig {
	p.check(sh.Address != "" || sh.URL != "", "sharedInFlight.address",
		"required in a sharedInFlight section: the Redis host:port, or url: a redis:// or rediss:// URL")
	s := SharedConfig{Address: sh.Address, URL: sh.URL, Mode: sh.Mode, ReplicaID: sh.ReplicaID}
	if v := sh.Period; v != nil {
		p.check(*v > 0, "sharedInFlight.period", "must be > 0, got %v", *v)
		s.Period = *v
	}
	if v := sh.TTL; v != nil {
		p.check(*v > 0, "sharedInFlight.ttl", "must be > 0, got %v", *v)
		s.TTL = *v
	}
	chk := s
	chk.ReplicaID = cmp.Or(chk.ReplicaID, "-")
	if err := chk.Validate(SharedFileFields); err != nil {
		field, msg, _ := strings.Cut(err.Error(), ": ") // Validate's message starts with the field
		p.fail(field, "%s", msg)
	}
	s.Period, s.TTL = chk.Period, chk.TTL // the defaults Validate filled
	return s
}

// quantity reads an optional quantity node at path (a maxRequests, a count
// of requests, or a maxBytes, of bytes); nil if absent.
func (p *parser) quantity(n *yaml.Node, path string) *int64 {
	if n.Kind == 0 {
		return nil
	}
	p.check(n.Kind == yaml.ScalarNode, path, "must be a quantity such as 500, \"1k\" or \"10Gi\", not %s", describeNode(n))
	unit := "requests"
	if strings.HasSuffix(path, "maxBytes") {
		unit = "bytes"
	}
	v, err := parseQuantity(n.Value, unit)
	p.check(err == nil, path, "%v", err)
	return &v
}

// queueing resolves a band's fairness, ordering and flow capacity from
// flowgate's keys (fairness, ordering, flowCapacity) and llm-d's references
// (fairnessPolicyRef, orderingPolicyRef: a declared plugin's name or a policy
// type), over the template's; the two spellings of one setting must agree.
func (p *parser) queueing(q fileQueue, path string, plugins map[string]string, tmpl Band) Band {
	out := tmpl
	for _, f := range []struct {
		native, ref, nativeField, refField string
		table                              map[string]string
		valid                              []string
		dst                                *string
	}{
		{q.Fairness, q.FairnessPolicyRef, "fairness", "fairnessPolicyRef", llmdFairness,
			[]string{flowcontrol.FairnessFCFS, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare}, &out.Fairness},
		{q.Ordering, q.OrderingPolicyRef, "ordering", "orderingPolicyRef", llmdOrdering,
			[]string{flowcontrol.OrderingFCFS, flowcontrol.OrderingEDF}, &out.Ordering},
	} {
		v := ""
		if f.ref != "" {
			typ := cmp.Or(plugins[f.ref], f.ref)
			var ok bool
			v, ok = f.table[typ]
			p.check(ok, path+"."+f.refField, "%q is neither a declared plugin of, nor one of, the types %s",
				f.ref, strings.Join(slices.Sorted(maps.Keys(f.table)), ", "))
			if typ == fairnessProgramAware {
				p.warn("%s: %q is approximated by flowgate's fair-share (start-time fair queuing on prompt + output tokens, without the 60 s decay)",
					p.at(path+"."+f.refField), f.ref)
			}
		}
		if f.native != "" {
			at := path + "." + f.nativeField
			p.check(slices.Contains(f.valid, f.native), at, "%q must be one of %s", f.native, strings.Join(f.valid, ", "))
			p.check(v == "" || v == f.native, at, "%q contradicts %s %q (%s): give one", f.native, f.refField, f.ref, v)
			v = f.native
		}
		if v != "" {
			*f.dst = v
		}
	}
	if c := q.FlowCapacity; c != nil {
		p.check(*c >= 0 && *c <= MaxBandCapacity, path+".flowCapacity", "must be in 0..%d (0: no per-flow bound), got %d", MaxBandCapacity, *c)
		out.FlowCapacity = *c
	}
	return out
}

// checkFlowCapacity applies flowcontrol's rules for a per-flow bound to a
// resolved band, naming the field at path: at most the band's capacity, and
// only on a band that has flows.
func (p *parser) checkFlowCapacity(b Band, path string) {
	if b.FlowCapacity == 0 {
		return
	}
	p.check(b.Fairness == flowcontrol.FairnessRoundRobin || b.Fairness == flowcontrol.FairnessShare, path,
		"band %q: a per-flow capacity needs fairness %s or %s (the band has %q)",
		b.Name, flowcontrol.FairnessRoundRobin, flowcontrol.FairnessShare, cmp.Or(b.Fairness, flowcontrol.FairnessFCFS))
	p.check(b.FlowCapacity <= b.Capacity, path, "band %q: %d exceeds the band's capacity %d", b.Name, b.FlowCapacity, b.Capacity)
}

func (p *parser) bandIndex(bands []Band, path, name string) int {
	i := slices.IndexFunc(bands, func(b Band) bool { return b.Name == name })
	p.check(i >= 0, path, "no band named %q", name)
	return i
}

// checkBandName refuses a band name that would make metrics, logs or HTTP
// headers unreadable.
func (p *parser) checkBandName(name, path string) {
	p.check(len(name) <= flowcontrol.MaxBandNameLen, path, "%q: longer than %d bytes", name, flowcontrol.MaxBandNameLen)
	p.check(utf8.ValidString(name), path, "%q: not valid UTF-8", name)
	for _, r := range name {
		p.check(!unicode.IsControl(r) && unicode.IsPrint(r) && r != ' ', path, "%q: holds %q: band names are printable, without spaces", name, r)
	}
}

// holdback reads priority-holdback-policy's parameters as llm-d does: shape
// (linear), domain (rank, value or explicit; default rank), minCeiling
// (required, in [0, 1)) and maxCeiling (default 1, in (0, 1], above
// minCeiling), or with domain explicit only ceilings (priority → ceiling in
// [0, 1], not increasing as priority falls).
func (p *parser) holdback(n *yaml.Node, path string) flowcontrol.HoldbackConfig {
	var params struct {
		Shape      *string   `yaml:"shape"`
		Domain     *string   `yaml:"domain"`
		MinCeiling *float64  `yaml:"minCeiling"`
		MaxCeiling *float64  `yaml:"maxCeiling"`
		Ceilings   yaml.Node `yaml:"ceilings"` // read below: its keys are priorities
	}
	p.decode(n, path, &params)
	ceilings := p.holdbackCeilings(&params.Ceilings, path+".ceilings")
	h := flowcontrol.HoldbackConfig{Domain: flowcontrol.HoldbackRank}
	if d := params.Domain; d != nil {
		h.Domain = *d
		p.check(slices.Contains([]string{flowcontrol.HoldbackRank, flowcontrol.HoldbackValue, flowcontrol.HoldbackExplicit}, *d), path+".domain",
			"must be %s, %s or %s, got %q", flowcontrol.HoldbackRank, flowcontrol.HoldbackValue, flowcontrol.HoldbackExplicit, *d)
	}
	if h.Domain == flowcontrol.HoldbackExplicit {
		for i, set := range []bool{params.Shape != nil, params.MinCeiling != nil, params.MaxCeiling != nil} {
			key := []string{"shape", "minCeiling", "maxCeiling"}[i]
			p.check(!set, path+"."+key, "must not be set with domain %s (the ceilings are given)", flowcontrol.HoldbackExplicit)
		}
		p.check(len(ceilings) > 0, path+".ceilings", "required with domain %s (a map of priority to ceiling)", flowcontrol.HoldbackExplicit)
		prios := slices.Sorted(maps.Keys(ceilings))
		for i := len(prios) - 2; i >= 0; i-- {
			lo, hi := prios[i], prios[i+1]
			p.check(ceilings[lo] <= ceilings[hi], fmt.Sprintf("%s.ceilings.%d", path, lo),
				"%v is above the ceiling of the higher priority %d (%v): ceilings must not increase as priority falls", ceilings[lo], hi, ceilings[hi])
		}
		h.Ceilings = ceilings
		return h
	}
	p.check(params.Ceilings.Kind == 0, path+".ceilings", "only with domain %s", flowcontrol.HoldbackExplicit)
	if sh := params.Shape; sh != nil {
		p.check(*sh == flowcontrol.HoldbackLinear, path+".shape", "must be %s (the only shape), got %q", flowcontrol.HoldbackLinear, *sh)
	}
	if params.MinCeiling == nil {
		// Named at the parameters (or the plugin, without any): the key
		// itself is not there to point at.
		at := path
		if n.Kind == 0 {
			at = strings.TrimSuffix(path, ".parameters")
		}
		p.fail(at, "minCeiling is required (the lowest band's ceiling, in [0, 1): llm-d has no default)")
	}
	h.MinCeiling, h.MaxCeiling = *params.MinCeiling, flowcontrol.DefaultHoldbackMaxCeiling
	p.check(h.MinCeiling >= 0 && h.MinCeiling < 1, path+".minCeiling", "must be in [0, 1), got %v", h.MinCeiling)
	if v := params.MaxCeiling; v != nil {
		p.check(*v > 0 && *v <= 1, path+".maxCeiling", "must be in (0, 1], got %v", *v)
		h.MaxCeiling = *v
	}
	p.check(h.MinCeiling < h.MaxCeiling, path+".minCeiling", "%v must be below maxCeiling (%v)", h.MinCeiling, h.MaxCeiling)
	return h
}

// holdbackCeilings reads explicit ceilings: a mapping of priority (a whole
// number) to ceiling (a number in [0, 1]); nil if absent.
func (p *parser) holdbackCeilings(n *yaml.Node, path string) map[int]float64 {
	if n.Kind == 0 {
		return nil
	}
	p.check(n.Kind == yaml.MappingNode, path, "must be a mapping of priority to ceiling, such as {100: 0.9, 0: 0.4}, not %s", describeNode(n))
	m := map[int]float64{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		prio, err := strconv.Atoi(k.Value)
		at := path + "." + k.Value
		p.keys[at] = k
		p.check(k.Kind == yaml.ScalarNode && err == nil, at, "a key of ceilings is a priority, a whole number")
		at = fmt.Sprintf("%s.%d", path, prio)
		p.keys[at] = k
		_, dup := m[prio]
		p.check(!dup, at, "priority %d given twice", prio)
		c, err := strconv.ParseFloat(v.Value, 64)
		p.check(v.Kind == yaml.ScalarNode && err == nil && c >= 0 && c <= 1, at, "must be a number in [0, 1], got %q", v.Value)
		m[prio] = c
	}
	return m
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
