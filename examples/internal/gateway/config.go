package gateway

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
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
	"github.com/flowgate/flowgate/saturation/redisshare"
	"github.com/redis/go-redis/v9"
)

// fileConfig is the document (llm-d's EndpointPickerConfig) as written; a
// field's tag in is the range it takes.
type fileConfig struct {
	APIVersion         string           `yaml:"apiVersion"`
	Kind               string           `yaml:"kind"`
	Plugins            []filePlugin     `yaml:"plugins"`
	FlowControl        fileFlowControl  `yaml:"flowControl"`
	SaturationDetector SaturationConfig `yaml:"saturationDetector"` // over the defaults
	SharedInFlight     *SharedConfig    `yaml:"sharedInFlight"`

	FeatureGates       yaml.Node `yaml:"featureGates"`
	SchedulingProfiles yaml.Node `yaml:"schedulingProfiles"`
	Data               yaml.Node `yaml:"data"`
	Parser             yaml.Node `yaml:"parser"`
	RequestControl     yaml.Node `yaml:"requestControl"`
}

type filePlugin struct {
	Name       string    `yaml:"name"`
	Type       string    `yaml:"type"`
	Parameters yaml.Node `yaml:"parameters"` // decoded by type
}

type fileFlowControl struct {
	UsageLimitPolicyPluginRef string     `yaml:"usageLimitPolicyPluginRef"`
	PriorityBands             []fileBand `yaml:"priorityBands"`
	// A band's name, or llm-d's band template (a fileQueue).
	DefaultPriorityBand yaml.Node         `yaml:"defaultPriorityBand"`
	Objectives          map[string]string `yaml:"objectives"`
	Tick                time.Duration     `yaml:"tick" in:"[100µs, 1s]"` // flowcontrol.MinTick
	Burst               int               `yaml:"burst" in:"[1, 1048576]"`
	// llm-d's default max wait and global limits (applied per band).
	DefaultRequestTTL  *time.Duration `yaml:"defaultRequestTTL" in:"[0, +Inf)"`
	MaxRequests        yaml.Node      `yaml:"maxRequests"`
	MaxBytes           yaml.Node      `yaml:"maxBytes"`
	SaturationDetector struct {
		PluginRef string `yaml:"pluginRef"`
	} `yaml:"saturationDetector"`
	BodyPriority       string   `yaml:"bodyPriority"`
	CriticalKVHeadroom *float64 `yaml:"criticalKVHeadroom" in:"[0, 1]"`
	EnableEviction     bool     `yaml:"enableEviction"` // llm-d's switch (FlowControlConfig.EnableEviction)
}

type fileBand struct {
	Name      string         `yaml:"name"`
	Priority  *int           `yaml:"priority"`
	Capacity  *int           `yaml:"capacity"`
	MaxWait   *time.Duration `yaml:"maxWait" in:"[0, +Inf)"`
	fileQueue `yaml:",inline"`
}

// fileQueue is what a band and the band template share: llm-d's and
// flowgate's names for capacity, byte budget, fairness and ordering.
type fileQueue struct {
	MaxRequests       yaml.Node `yaml:"maxRequests"`
	MaxBytes          yaml.Node `yaml:"maxBytes"`
	FairnessPolicyRef string    `yaml:"fairnessPolicyRef"`
	OrderingPolicyRef string    `yaml:"orderingPolicyRef"`
	Fairness          string    `yaml:"fairness"`
	Ordering          string    `yaml:"ordering"`
	FlowCapacity      *int      `yaml:"flowCapacity" in:"[0, 4194304]"` // MaxBandCapacity; 0: no bound
}

// fileDetector is llm-d's utilization-detector parameters.
type fileDetector struct {
	QueueDepthThreshold       *float64       `yaml:"queueDepthThreshold" in:"(0, +Inf)"`
	KVCacheUtilThreshold      *float64       `yaml:"kvCacheUtilThreshold" in:"(0, 1]"`
	MetricsStalenessThreshold *time.Duration `yaml:"metricsStalenessThreshold" in:"[1ms, 1h]"`
	StalenessPolicy           string         `yaml:"stalenessPolicy"`
	Headroom                  float64        `yaml:"headroom"`
}

// Plugin types flowgate reads: the usage-limit policies and llm-d's detectors.
const (
	policyStatic         = "static-usage-limit-policy"
	policySoftReflective = "soft-reflective-ceiling-policy"
	policyHoldback       = "priority-holdback-policy"
	detectorUtilization  = "utilization-detector"
	detectorConcurrency  = "concurrency-detector"
)

// llm-d's fairness and ordering policy types and the flowcontrol policy each
// maps to (program-aware-fairness approximately, with a warning).
const fairnessProgramAware = "program-aware-fairness"

var (
	llmdFairness = map[string]string{"global-strict-fairness-policy": flowcontrol.FairnessFCFS,
		"round-robin-fairness-policy": flowcontrol.FairnessRoundRobin, fairnessProgramAware: flowcontrol.FairnessShare}
	llmdOrdering = map[string]string{"fcfs-ordering-policy": flowcontrol.OrderingFCFS,
		"edf-ordering-policy": flowcontrol.OrderingEDF, "slo-deadline-ordering-policy": flowcontrol.OrderingEDF}
)

// Limits of a configuration: every band's queue is allocated at start.
const (
	MaxBandCapacity     = 1 << 22 // waiting requests one band holds
	MaxTotalCapacity    = 1 << 22 // ... all bands together
	DefaultBandBytes    = 1 << 30 // a band's byte budget when the file sets none (llm-d's)
	defaultBandCapacity = 1024    // a band's capacity when the file sets none
)

// Body priority handling (Config.BodyPriority).
const (
	BodyPriorityKeep   = "keep"   // classify by it, forward it unchanged (default)
	BodyPriorityStrip  = "strip"  // classify by it, remove it from the forwarded body
	BodyPriorityIgnore = "ignore" // do not classify by it; forward it unchanged
	// BodyPrioritySet classifies by it and writes the request's band into the
	// forwarded body, for model servers that schedule by priority.
	BodyPrioritySet = "set"
)

// Band is one priority band after validation, in band order (0 first).
type Band struct {
	Name     string
	Priority int
	Capacity int
	MaxWait  time.Duration // 0: no limit
	MaxBytes int64         // byte budget of the band's waiting bodies; 0: none
	// Fairness, Ordering and FlowCapacity are flowcontrol.BandConfig's
	// ("" and 0: fcfs, no per-flow bound).
	Fairness     string
	Ordering     string
	FlowCapacity int
}

// PolicyRef is the selected usage-limit policy: a type and its parameters.
type PolicyRef struct {
	Type      string
	Threshold float64                    // static-usage-limit-policy only
	Holdback  flowcontrol.HoldbackConfig // priority-holdback-policy only
	Ceilings  []float64                  // Holdback's ceiling of each band, band 0 first
}

// SaturationConfig configures the metrics poller; its yaml keys are the
// saturationDetector section's.
type SaturationConfig struct {
	// QueueDepthThreshold is the waiting requests per pod that score it
	// saturated; 0 (the default) is flowhttp.CreditQueueDepthThreshold with
	// InFlightCredit, saturation.DefaultQueueDepthThreshold without.
	QueueDepthThreshold       float64       `yaml:"queueDepthThreshold" in:"(0, +Inf)"`
	KVCacheUtilThreshold      float64       `yaml:"kvCacheUtilThreshold" in:"(0, 1]"`
	MetricsStalenessThreshold time.Duration `yaml:"metricsStalenessThreshold" in:"[1ms, 1h]"` // saturation.MinStaleness, MaxStaleness
	ScrapeInterval            time.Duration `yaml:"scrapeInterval" in:"[1ms, 1h]"`            // saturation.MinInterval, MaxInterval
	InFlightCredit            bool          `yaml:"inFlightCredit"`                           // count forwarded requests a scrape does not show yet as waiting
	Engine                    string        `yaml:"engine"`                                   // the backends' metrics: "vllm" (default) or "sglang"
}

// SharedConfig configures the per-backend in-flight counts shared with the
// other gateway replicas through Redis (package saturation/redisshare); its
// yaml keys are the sharedInFlight section's. Sharing is on when Address or
// URL is set, never both.
type SharedConfig struct {
	Address   string        `yaml:"address"`               // a "host:port": one server, no auth, no TLS
	URL       string        `yaml:"url"`                   // redis://[user:password@]host[:port][/db], rediss://, read by redisshare.ParseURL
	Mode      string        `yaml:"mode"`                  // how URL is read: redisshare.ModeStandalone ("" too), ModeSentinel or ModeCluster
	ReplicaID string        `yaml:"replicaId"`             // unique among the replicas (a pod name); required
	Period    time.Duration `yaml:"period" in:"(0, +Inf)"` // between two syncs; default redisshare.DefaultPeriod
	TTL       time.Duration `yaml:"ttl" in:"(0, +Inf)"`    // how long counts outlive their source; ≥ 4 Periods, default redisshare.DefaultTTL
}

// Enabled reports whether sharing is on.
func (s SharedConfig) Enabled() bool { return s.Address != "" || s.URL != "" }

// RedisOptions returns the connection for redisshare.Options.Redis.
func (s SharedConfig) RedisOptions() (*redis.UniversalOptions, error) {
	if s.URL != "" {
		return redisshare.ParseURL(s.URL, s.Mode)
	}
	return &redis.UniversalOptions{Addrs: []string{s.Address}}, nil
}

// Validate fills the defaults and checks the settings, naming each field as
// names does (the file's paths, or the proxy's flags).
func (s *SharedConfig) Validate(names SharedFieldNames) error {
	s.Period, s.TTL = cmp.Or(s.Period, redisshare.DefaultPeriod), cmp.Or(s.TTL, redisshare.DefaultTTL)
	_, _, addrErr := net.SplitHostPort(s.Address)
	_, urlErr := redisshare.ParseURL(s.URL, s.Mode)
	modes := []string{redisshare.ModeStandalone, redisshare.ModeSentinel, redisshare.ModeCluster}
	switch on := s.Enabled(); {
	case !on && s.ReplicaID != "":
		return fmt.Errorf("%s: set without %s", names.ReplicaID, names.Address)
	case !on && s.Mode != "":
		return fmt.Errorf("%s: set without %s", names.Mode, names.URL)
	case !on:
		return nil
	case s.Address != "" && s.URL != "":
		return fmt.Errorf("%s: set beside %s; give one", names.URL, names.Address)
	case strings.Contains(s.Address, "://"):
		return fmt.Errorf("%s: a URL; give it as %s (%s is a host:port)", names.Address, names.URL, names.Address)
	case s.Address != "" && s.Mode != "":
		return fmt.Errorf("%s: applies to %s only; %s is one server", names.Mode, names.URL, names.Address)
	case s.Address != "" && addrErr != nil:
		return fmt.Errorf("%s: %q is not a host:port: %v", names.Address, s.Address, addrErr)
	case s.Mode != "" && !slices.Contains(modes, s.Mode):
		return fmt.Errorf("%s: must be %s, %s or %s, got %q", names.Mode, modes[0], modes[1], modes[2], s.Mode)
	case s.URL != "" && urlErr != nil: // its message never repeats the URL (it may hold a password)
		return fmt.Errorf("%s: %s", names.URL, strings.TrimPrefix(urlErr.Error(), redisshare.ErrInvalidConfig.Error()+": "))
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
var SharedFileFields = SharedFieldNames{"sharedInFlight.address", "sharedInFlight.url", "sharedInFlight.mode",
	"sharedInFlight.replicaId", "sharedInFlight.period", "sharedInFlight.ttl"}

// Config is the validated proxy configuration.
type Config struct {
	Bands       []Band
	Policy      PolicyRef
	DefaultBand int
	// Objectives maps the x-gateway-inference-objective header value to a band.
	Objectives   map[string]int
	Tick         time.Duration // 0: flowcontrol's default
	Burst        int           // 0: flowcontrol's default
	Saturation   SaturationConfig
	BodyPriority string // BodyPriorityKeep ("" too), Strip, Ignore or Set
	// CriticalKVHeadroom is flowhttp.GatewayConfig.CriticalKVHeadroom: nil
	// takes the gateway's default, 0 turns it off.
	CriticalKVHeadroom *float64
	Shared             SharedConfig // off by default
	// Eviction is flowControl.enableEviction, llm-d's switch: it turns on
	// flowhttp.GatewayConfig.Eviction with its defaults. Off by default.
	Eviction bool
	// Warnings lists what the file held that the proxy ignores.
	Warnings []string
}

// DefaultConfig is what the proxy runs with when no -config is given: two
// bands, the soft-reflective policy and llm-d's thresholds (CALIBRATION.md).
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
			KVCacheUtilThreshold:      0.8,
			MetricsStalenessThreshold: 200 * time.Millisecond,
			ScrapeInterval:            50 * time.Millisecond,
			InFlightCredit:            true,
			Engine:                    EngineVLLM,
		},
		BodyPriority: BodyPriorityKeep,
	}
}

// Backend kinds (SaturationConfig.Engine).
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

const maxConfigBytes = 1 << 20 // the file read's bound: a configuration is a few hundred bytes

// LoadConfig reads and parses the config file at path (see ParseConfig).
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	return ParseConfig(f)
}

// ParseConfig reads and validates a YAML configuration shaped like llm-d's
// EndpointPickerConfig (examples/proxy/config.yaml); the band of highest
// priority is band 0. The first problem ends the parse with an error naming
// the field's path and line.
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
		return Config{}, syntaxError(err)
	}
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("proxy: config: more than one YAML document") // else silently ignored
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
	p := &parser{keys: map[string]*yaml.Node{}}
	fc := fileConfig{SaturationDetector: DefaultConfig().Saturation}
	p.decode(&root, "", &fc)
	return p.resolve(&fc), nil
}

// resolve validates the decoded document and fills the defaults.
func (p *parser) resolve(fc *fileConfig) Config {
	cfg := DefaultConfig()
	for _, section := range []string{"data", "featureGates", "parser", "requestControl", "schedulingProfiles"} {
		if p.keys[section] != nil { // fileConfig's yaml.Node fields
			p.warn("%s: ignored (flowgate orders requests; it does not pick endpoints)", p.at(section))
		}
	}
	policies, detectors, queueing := p.plugins(fc.Plugins)
	fcf := &fc.FlowControl
	const refPath = "flowControl.usageLimitPolicyPluginRef"
	if ref := fcf.UsageLimitPolicyPluginRef; ref != "" {
		r, ok := policies[ref]
		p.check(ok || ref != policyHoldback, refPath, // llm-d has no default minCeiling either
			"%s has no default minCeiling: declare it under plugins with parameters.minCeiling and name that plugin here", policyHoldback)
		p.check(ok, refPath, "%q is neither a declared policy plugin nor a policy type (%s, %s, %s)", ref, policyStatic, policySoftReflective, policyHoldback)
		cfg.Policy = r
	}
	cfg.Saturation = p.saturation(fc.SaturationDetector, fcf.SaturationDetector.PluginRef, detectors)
	p.bands(&cfg, fcf, queueing)
	p.oneOf(fcf.BodyPriority, "flowControl.bodyPriority", BodyPriorityKeep, BodyPriorityStrip, BodyPriorityIgnore, BodyPrioritySet)
	cfg.Tick, cfg.Burst, cfg.CriticalKVHeadroom = fcf.Tick, fcf.Burst, fcf.CriticalKVHeadroom
	cfg.Eviction = fcf.EnableEviction
	cfg.BodyPriority = cmp.Or(fcf.BodyPriority, cfg.BodyPriority)
	if sh := fc.SharedInFlight; sh != nil {
		cfg.Shared = p.shared(*sh)
	}
	if cfg.Policy.Type == policyHoldback {
		prios := make([]int, len(cfg.Bands))
		for i, b := range cfg.Bands {
			prios[i] = b.Priority
		}
		c, err := cfg.Policy.Holdback.BandCeilings(prios)
		p.check(err == nil, refPath, "%v", err) // not reached: holdback and bands checked both
		cfg.Policy.Ceilings = c
	}
	cfg.Warnings = p.warnings
	return cfg
}

// oneOf checks that v is "" or one of valid.
func (p *parser) oneOf(v, path string, valid ...string) {
	p.check(v == "" || slices.Contains(valid, v), path, "must be %s or %s, got %q",
		strings.Join(valid[:len(valid)-1], ", "), valid[len(valid)-1], v)
}

// plugins reads the plugins section (types flowgate does not use: a warning)
// into policies (and policy types), detectors and queueing plugins' types.
func (p *parser) plugins(plugins []filePlugin) (policies map[string]PolicyRef, detectors map[string]fileDetector, queueing map[string]string) {
	policies = map[string]PolicyRef{policyStatic: {Type: policyStatic, Threshold: 1.0}, policySoftReflective: {Type: policySoftReflective}}
	detectors, queueing = map[string]fileDetector{}, map[string]string{}
	seen := map[string]bool{}
	for i, pl := range plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		params := path + ".parameters"
		p.check(pl.Type != "", path+".type", "required (%s, %s or %s)", policyStatic, policySoftReflective, policyHoldback)
		name := cmp.Or(pl.Name, pl.Type)
		p.check(!seen[name], path+".name", "duplicate plugin name %q", name)
		seen[name] = true
		switch _, fairness := llmdFairness[pl.Type]; {
		case pl.Type == policyStatic:
			sp := struct {
				Threshold float64 `yaml:"threshold" in:"(0, +Inf)"`
			}{1.0}
			p.decode(&pl.Parameters, params, &sp)
			policies[name] = PolicyRef{Type: policyStatic, Threshold: sp.Threshold}
		case pl.Type == policyHoldback:
			policies[name] = PolicyRef{Type: policyHoldback, Holdback: p.holdback(&pl.Parameters, params)}
		case pl.Type == policySoftReflective:
			p.decode(&pl.Parameters, params, &struct{}{}) // it has no parameter
			policies[name] = PolicyRef{Type: policySoftReflective}
		case pl.Type == detectorUtilization:
			var det fileDetector
			p.decode(&pl.Parameters, params, &det)
			detectors[name] = det
		case fairness || llmdOrdering[pl.Type] != "":
			queueing[name] = pl.Type
		default:
			p.warn("%s: plugin type %q ignored (flowgate implements %s, %s, %s and %s)", p.at(path),
				pl.Type, policyStatic, policySoftReflective, policyHoldback, detectorUtilization)
		}
	}
	return policies, detectors, queueing
}

// saturation resolves the poller's settings: the saturationDetector section
// over those of the utilization-detector ref names (or the only one
// declared), over the defaults.
func (p *parser) saturation(s SaturationConfig, ref string, detectors map[string]fileDetector) SaturationConfig {
	const at = "saturationDetector."
	det, ok := detectors[ref]
	p.check(ok || ref == "", "flowControl.saturationDetector.pluginRef", "%q is not a declared %s plugin (flowgate has no %s)",
		ref, detectorUtilization, detectorConcurrency)
	if ref == "" && len(detectors) == 1 {
		det, ok = slices.Collect(maps.Values(detectors))[0], true
	}
	if ok && det.StalenessPolicy != "" && det.StalenessPolicy != "saturated" {
		p.warn("%s stalenessPolicy %q ignored: a stale pod reads saturated", detectorUtilization, det.StalenessPolicy)
	}
	if ok && det.Headroom != 0 {
		p.warn("%s headroom %v ignored", detectorUtilization, det.Headroom)
	}
	if v := det.QueueDepthThreshold; v != nil && p.keys[at+"queueDepthThreshold"] == nil {
		s.QueueDepthThreshold = *v
	}
	if v := det.KVCacheUtilThreshold; v != nil && p.keys[at+"kvCacheUtilThreshold"] == nil {
		s.KVCacheUtilThreshold = *v
	}
	if v := det.MetricsStalenessThreshold; v != nil && p.keys[at+"metricsStalenessThreshold"] == nil {
		s.MetricsStalenessThreshold = *v
	}
	p.check(s.ScrapeInterval < s.MetricsStalenessThreshold, at+"scrapeInterval",
		"must be shorter than metricsStalenessThreshold (%v), or every pod reads as stale", s.MetricsStalenessThreshold)
	p.oneOf(s.Engine, at+"engine", EngineVLLM, EngineSGLang)
	s.Engine = cmp.Or(s.Engine, EngineVLLM)
	return s
}

// bands resolves the bands (priorityBands, or the default ones, under llm-d's
// band template and global limits), the default band and the objectives.
func (p *parser) bands(cfg *Config, fcf *fileFlowControl, queueing map[string]string) {
	globalReqs := p.quantity(&fcf.MaxRequests, "flowControl.maxRequests")
	globalBytes := p.quantity(&fcf.MaxBytes, "flowControl.maxBytes")
	if globalReqs != nil || globalBytes != nil {
		p.warn("flowControl.maxRequests/maxBytes: applied per band (no band exceeds them); flowgate has no limit shared by the bands")
	}
	const tp = "flowControl.defaultPriorityBand"
	var tmpl fileQueue
	defaultBand := ""
	if n := &fcf.DefaultPriorityBand; n.Kind == yaml.ScalarNode {
		defaultBand = n.Value
	} else {
		p.decode(n, tp, &tmpl) // a band template (absent: nothing)
	}
	tmplQueue := p.queueing(tmpl, tp, queueing, Band{}) // its fairness, ordering and flow capacity
	tmplReqs := p.quantity(&tmpl.MaxRequests, tp+".maxRequests")
	tmplBytes := p.quantity(&tmpl.MaxBytes, tp+".maxBytes")

	if fcf.PriorityBands == nil {
		// The default bands take the template's queueing and the default TTL.
		for i := range cfg.Bands {
			b := &cfg.Bands[i]
			b.MaxWait = *cmp.Or(fcf.DefaultRequestTTL, &b.MaxWait)
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
			p.check(b.Capacity == nil || reqs == nil, path+".maxRequests", "capacity and maxRequests are one setting: give one")
			switch {
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
			band.MaxBytes = *cmp.Or(bytes, &band.MaxBytes) // 0: no budget
			band.MaxWait = *cmp.Or(b.MaxWait, fcf.DefaultRequestTTL, &band.MaxWait)
			p.checkFlowCapacity(band, map[bool]string{true: path, false: tp}[b.FlowCapacity != nil]+".flowCapacity")
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

// shared checks the sharedInFlight section but for the replica's name, which
// may come from -replica-id.
func (p *parser) shared(s SharedConfig) SharedConfig {
	p.check(s.Enabled(), "sharedInFlight.address",
		"required in a sharedInFlight section: the Redis host:port, or url: a redis:// or rediss:// URL")
	chk := s
	chk.ReplicaID = cmp.Or(chk.ReplicaID, "-")
	if err := chk.Validate(SharedFileFields); err != nil {
		field, msg, _ := strings.Cut(err.Error(), ": ") // Validate's message starts with the field
		p.check(false, field, "%s", msg)
	}
	s.Period, s.TTL = chk.Period, chk.TTL // the defaults Validate filled
	return s
}

// queueing resolves a band's fairness, ordering and flow capacity over tmpl's.
func (p *parser) queueing(q fileQueue, path string, plugins map[string]string, tmpl Band) Band {
	tmpl.Fairness = p.policy(tmpl.Fairness, q.Fairness, q.FairnessPolicyRef, path, "fairness", llmdFairness, plugins)
	tmpl.Ordering = p.policy(tmpl.Ordering, q.Ordering, q.OrderingPolicyRef, path, "ordering", llmdOrdering, plugins)
	tmpl.FlowCapacity = *cmp.Or(q.FlowCapacity, &tmpl.FlowCapacity)
	return tmpl
}

// policy resolves a band's fairness or ordering (key), v unless written:
// flowgate's key (native) or llm-d's reference (ref, at keyPolicyRef: a
// declared plugin's name or a policy type of table). The two must agree.
func (p *parser) policy(v, native, ref, path, key string, table, plugins map[string]string) string {
	if at := path + "." + key + "PolicyRef"; ref != "" {
		typ := cmp.Or(plugins[ref], ref)
		var ok bool
		v, ok = table[typ]
		p.check(ok, at, "%q is neither a declared plugin of, nor one of, the types %s", ref, strings.Join(slices.Sorted(maps.Keys(table)), ", "))
		if typ == fairnessProgramAware {
			p.warn("%s: %q is approximated by flowgate's fair-share (start-time fair queuing on prompt + output tokens, without the 60 s decay)", p.at(at), ref)
		}
	}
	if native != "" {
		valid := slices.Compact(slices.Sorted(maps.Values(table)))
		p.check(slices.Contains(valid, native), path+"."+key, "%q must be one of %s", native, strings.Join(valid, ", "))
		p.check(ref == "" || v == native, path+"."+key, "%q contradicts %sPolicyRef %q (%s): give one", native, key, ref, v)
		v = native
	}
	return v
}

// checkFlowCapacity applies flowcontrol's rules for a per-flow bound.
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

// holdback reads priority-holdback-policy's parameters as llm-d does
// (flowcontrol.HoldbackConfig.Validate), minCeiling required.
func (p *parser) holdback(n *yaml.Node, path string) flowcontrol.HoldbackConfig {
	var params struct {
		Shape      string             `yaml:"shape"`
		Domain     string             `yaml:"domain"`
		MinCeiling *float64           `yaml:"minCeiling" in:"[0, 1)"`
		MaxCeiling *float64           `yaml:"maxCeiling" in:"(0, 1]"`
		Ceilings   map[string]float64 `yaml:"ceilings" in:"[0, 1]"` // keys: priorities, as JSON writes them
	}
	p.decode(n, path, &params)
	h := flowcontrol.HoldbackConfig{Domain: cmp.Or(params.Domain, flowcontrol.HoldbackRank)}
	for _, k := range slices.Sorted(maps.Keys(params.Ceilings)) {
		prio, err := strconv.Atoi(k)
		_, dup := h.Ceilings[prio]
		p.check(err == nil && !dup, path+".ceilings."+k, "a key of ceilings is a priority, a whole number, given once")
		if h.Ceilings == nil {
			h.Ceilings = map[int]float64{}
		}
		h.Ceilings[prio] = params.Ceilings[k]
	}
	explicit := h.Domain == flowcontrol.HoldbackExplicit
	p.check(!explicit || params.MinCeiling == nil, path+".minCeiling", "must not be set with domain %s", flowcontrol.HoldbackExplicit)
	p.check(!explicit || params.MaxCeiling == nil, path+".maxCeiling", "must not be set with domain %s", flowcontrol.HoldbackExplicit)
	p.check(explicit || params.MinCeiling != nil, path+".minCeiling", "required (the lowest band's ceiling, in [0, 1): llm-d has no default)")
	if !explicit {
		h.MinCeiling, h.MaxCeiling = *params.MinCeiling, *cmp.Or(params.MaxCeiling, new(flowcontrol.DefaultHoldbackMaxCeiling))
	}
	chk := h
	chk.Shape = params.Shape               // checked, not kept: linear is the only shape
	if err := chk.Validate(); err != nil { // "...: priority-holdback-policy key: message", key such as ceilings[100]
		_, msg, _ := strings.Cut(err.Error(), policyHoldback+" ")
		key, msg, _ := strings.Cut(msg, ": ")
		p.check(false, path+"."+strings.NewReplacer("[", ".", "]", "").Replace(key), "%s", msg)
	}
	return h
}

// defaultObjectives maps every band's own name to it, and "critical" and
// "sheddable", unless bands have those names, to the first and last band.
func defaultObjectives(bands []Band) map[string]int {
	m := map[string]int{"critical": 0, "sheddable": len(bands) - 1}
	for i, b := range bands {
		m[b.Name] = i
	}
	return m
}
