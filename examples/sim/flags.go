package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// options are the parsed command line.
type options struct {
	workloads   []workload.Workload
	qps         []float64    // nil = each workload's published points
	points      []sweepPoint // the default run's points; nil = workloads × qps
	full        bool         // -full: the whole grid and every figure
	policies    []string     // without the floor
	floor       bool
	duration    time.Duration
	seed        uint64 // the first seed
	seeds       int
	timeout     time.Duration
	backendPrio bool
	bpRows      []string // policies also run with backend priority, as rows "<policy>+bp"
	projection  saturation.KVProjection
	promptTok   float64
	maxReplicas bool // -aggregate max
	llmdTTL     time.Duration
	holdback    flowcontrol.HoldbackConfig
	format      string
	gateways    int
	plot        string
	tick        time.Duration
	burst       int
	shared      time.Duration
	sharedExact bool
	routing     string
	critRouting string
	critKVRoom  float64
	admission   bool
	tenants     float64
	fairness    string
	bAlone      bool
	longShort   bool
	credit      bool
	plain       bool // -plain-controller
	qthr, kvthr float64
	scrape      time.Duration
	replicas    int
	cv          float64
	step        vllm.StepModel
	parallel    int
	sweep       bool
	fit         bool
	sweepQPS    string
	sweepTicks  string
	sweepBursts string
	quiet       bool

	preemptWaiting bool // -preempt-for-waiting: vllm.Config.PreemptForWaiting (a what-if)

	evictRows    []string // policies also run with eviction, as rows "<policy>+evict"
	eviction     flowcontrol.EvictionConfig
	shedStream   bool // -sheddable-stream
	critNoStream bool // -critical-stream=false
}

// DefaultCredit is the simulator's saturation wiring: whether the gateway adds its
// dispatched-but-not-yet-visible requests to each pod's waiting count. On, as
// flowhttp.Gateway ships it: with it (and no -queue-threshold) flowgate's gateways
// score a pod's queue against flowhttp.CreditQueueDepthThreshold, the Gateway's
// wiring (TestGatewayWiringDefault keeps the two equal; the sweep that chose it is in
// NOTES-2026.md next to this file).
const DefaultCredit = true

// DefaultSharedInFlight is -shared-inflight's default: several gateways share their
// in-flight view every 5 ms, saturation/redisshare's DefaultPeriod, as the example proxy's
// replicas do when given a Redis.
const DefaultSharedInFlight = "5ms"

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.full, "full", false, "the whole grid: every published point of every workload, flowgate's static too, the backend-priority rows, and every figure as Markdown tables (-format table); flags given explicitly still apply")
	wl := fs.String("workload", "all", "workload: codegen, chat, reasoning or all (default: the points "+pointsString(defaultPoints)+"; with -workload or -qps, each workload's published points)")
	qps := fs.String("qps", "", "comma-separated request rates (default: the published points of each workload)")
	pol := fs.String("policy", strings.Join(defaultPolicies, ","),
		"comma-separated policies: none, llmd-static, llmd-soft-reflective, llmd-priority-holdback, static, soft-reflective, priority-holdback, static-block-critical (both = static,soft-reflective); -full adds static")
	fs.BoolVar(&o.floor, "floor", true, "also run the floor: the same critical arrivals with no sheddable traffic")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "arrival window (the pool then drains)")
	fs.Uint64Var(&o.seed, "seed", 1, "first random seed (same seeds, same output)")
	fs.IntVar(&o.seeds, "seeds", 5, "seeds per point: seed, seed+1, …, seed+seeds−1 (tables show median and min–max)")
	fs.DurationVar(&o.timeout, "client-timeout", DefaultClientTimeout, "clients give up after this long; the request is aborted wherever it is (0 = never)")
	fs.BoolVar(&o.backendPrio, "backend-priority", false, "replicas schedule by priority (vLLM --scheduling-policy priority) in every row")
	fs.BoolVar(&o.preemptWaiting, "preempt-for-waiting", false, "what-if, not vLLM's behaviour: in the rows with backend priority a waiting request preempts less urgent running ones for its KV blocks (vllm.Config.PreemptForWaiting; vLLM V1 never does, vllm-project/vllm#40004)")
	bpRows := fs.String("backend-priority-rows", "",
		"comma-separated policies also run with backend priority, as rows named <policy>+bp (-full: "+strings.Join(fullBPRows, ",")+"; ignored with -backend-priority)")
	evictRows := fs.String("evict-rows", strings.Join(defaultEvictRows, ","),
		"comma-separated policies (flowgate's, none) also run with eviction (flowcontrol.Evictor), as rows named <policy>+evict; empty for none (-full: "+strings.Join(fullEvictRows, ",")+")")
	fs.BoolVar(&o.shedStream, "sheddable-stream", false, "sheddable clients stream: their response starts at the first token, and a started response is no eviction victim unless -evict-started (default: sheddable calls without stream, its response starts when it completes)")
	critStream := fs.Bool("critical-stream", true, "critical clients stream (a critical request without its first token for -evict-stall is held)")
	fs.BoolVar(&o.eviction.Started, "evict-started", false, "eviction may take started streams too; they end as failed (EvictionConfig.Started)")
	fs.Float64Var(&o.eviction.Threshold, "evict-threshold", 0, "eviction gives way to a band held at the gateway at and above this saturation (0 = flowcontrol.DefaultEvictionThreshold)")
	fs.DurationVar(&o.eviction.Stall, "evict-stall", 0, "a request without its first byte this long is held (0 = flowcontrol.DefaultEvictionStall)")
	fs.DurationVar(&o.eviction.Grace, "evict-grace", 0, "pause after a confirmed eviction before the next on the same replica (0 = the larger of flowcontrol.DefaultEvictionGrace and -scrape)")
	fs.Float64Var(&o.eviction.KVThreshold, "evict-kv", 0, "a replica gives way to a request held there only at this KV-cache usage or above (0 = flowcontrol.DefaultEvictionKVThreshold)")
	fs.IntVar(&o.eviction.MaxEvictions, "evict-max", 0, "evictions of one request before it is immune (0 = flowcontrol.DefaultMaxEvictions)")
	projection := fs.String("kv-projection", DefaultProjection.String(), "flowgate's saturation: how KV usage is anticipated: none, completion or steady (saturation.Scorer.Projection)")
	fs.Float64Var(&o.promptTok, "prompt-tokens", DefaultPromptTokens, "flowgate's saturation: prompt tokens waiting on a replica that alone saturate it (saturation.Scorer.PromptTokenThreshold; 0 = off)")
	aggregate := fs.String("aggregate", DefaultAggregate, "flowgate's saturation: combine replicas by mean (saturation.Scorer.Pool) or max (Scorer.PoolMax)")
	fs.DurationVar(&o.llmdTTL, "llmd-ttl", 0, "llm-d parity: request TTL enforced by the 1 s sweep (0 = none)")
	hb := cluster.DefaultHoldback()
	fs.Float64Var(&o.holdback.MinCeiling, "holdback-min", hb.MinCeiling, "priority-holdback policies: minCeiling, the sheddable band's ceiling, in [0, 1)")
	fs.Float64Var(&o.holdback.MaxCeiling, "holdback-max", hb.MaxCeiling, "priority-holdback policies: maxCeiling, the critical band's ceiling, in (0, 1] and above -holdback-min")
	fs.StringVar(&o.format, "format", "summary", "output: summary (sentences and one table), table (every figure as Markdown tables; -full's default) or json (JSON Lines: one object per workload, qps, policy, seed)")
	fs.IntVar(&o.gateways, "gateways", 1, "independent gateways (dispatchers) sharing the pool, each with 1/N of the traffic")
	fs.StringVar(&o.plot, "plot", "", "write an SVG chart of the changes (soft-reflective vs static) to this file")
	fs.DurationVar(&o.tick, "tick", 0, "dispatcher tick (0 = flowcontrol.DefaultTick)")
	fs.IntVar(&o.burst, "burst", 0, "items a gated band releases per opportunity (0 = flowcontrol.DefaultBurst); open bands release everything")
	fs.BoolVar(&o.admission, "admission", false, "put llm-d's probabilistic admitter (sheddable shed with probability min(1, 300·s^5)) in front of each gateway")
	tenants := fs.String("tenants", "", "noisy neighbour A:B: tenant A sends A/B times tenant B's rate in the sheddable band and all critical traffic is B's (e.g. 10:1; JSON gets b_critical_ttft_p99_ms and b_sheddable_ttft_p99_ms); or long-short: tenant A sends the requests costing more than the median, B the others (JSON gets a_token_share)")
	fs.StringVar(&o.fairness, "fairness", "", "with -tenants: the flowgate bands' fairness (fcfs, round-robin, fair-share)")
	fs.BoolVar(&o.bAlone, "tenant-b-alone", false, "with -tenants: drop tenant A's arrivals (tenant B alone)")
	// Several gateways model proxy replicas as deployed: sharing their in-flight view at
	// saturation/redisshare's DefaultPeriod (TestSharedInFlightDefault keeps the two equal).
	// Without it each gateway's gate sees only its own dispatches (README.md next to this
	// file, Several gateways: codegen@16 1.9–5.0 s at G = 2..8 against 534 ms with one
	// gateway, and ×1.08–1.17 of one gateway with it).
	// With one gateway there is no one to share with and the flag changes nothing.
	shared := fs.String("shared-inflight", DefaultSharedInFlight, "gateways share their in-flight view: off, request (at every change) or a sync period such as 5ms (the default: saturation/redisshare's period)")
	fs.StringVar(&o.critRouting, "critical-routing", DefaultCriticalRouting, "how a flowgate gateway (static, soft-reflective, priority-holdback, static-block-critical; none, the floor and llm-d parity always route by -routing) picks the replica for a critical request: same (as -routing), kv (by -routing among the replicas with -critical-kv-headroom of their KV cache free at the last scrape: flowhttp.Router.LeastLoadedFor(0)) or kv-bp (kv in the rows with backend priority, same in the others: the Gateway's default, on when it forwards priority)")
	fs.Float64Var(&o.critKVRoom, "critical-kv-headroom", cluster.DefaultCriticalKVHeadroom, "with -critical-routing kv: the share of a replica's KV cache that must be free at the last scrape for it to stay among the replicas a critical request is routed to by -routing (when none has it, those with the lowest KV usage; when all have it, all of them)")
	fs.StringVar(&o.routing, "routing", cluster.DefaultRouting, "how a gateway picks a replica: scrape (least max(scraped waiting + running, in flight seen) at the last scrape) or inflight (fewest in flight as the gateway sees them, ties round-robin: the example proxy's routing)")
	fs.BoolVar(&o.credit, "credit", DefaultCredit, "count each gateway's in-flight requests not yet in the scraped metrics as waiting")
	fs.BoolVar(&o.plain, "plain-controller", false, "flowgate's rows as a plain flowcontrol.Controller over a saturation.Poller, without flowhttp.Gateway: releases are credited to the pool, not to each replica (saturation.Scorer.PoolReleased)")
	fs.Float64Var(&o.qthr, "queue-threshold", 0, "flowgate's saturation: waiting requests that alone saturate a pod (0 = flowhttp.Gateway's: flowhttp.CreditQueueDepthThreshold with -credit, the reference 5 without; llm-d baselines keep 5)")
	fs.Float64Var(&o.kvthr, "kv-threshold", 0, "flowgate's saturation: KV-cache usage that alone saturates a pod (0 = the reference 0.8; llm-d baselines keep 0.8)")
	fs.DurationVar(&o.scrape, "scrape", 50*time.Millisecond, "metrics scrape interval")
	fs.IntVar(&o.replicas, "replicas", 2, "vLLM replicas in the pool")
	fs.Float64Var(&o.cv, "cv", workload.DefaultCV, "coefficient of variation of token lengths (log-normal; 0 = constant)")
	def := vllm.FittedStepModel()
	base := fs.Duration("step-base", def.Base, "step model: fixed cost per step")
	fs.Float64Var(&o.step.PrefillNs, "step-prefill-ns", def.PrefillNs, "step model: ns per prefill token")
	fs.Float64Var(&o.step.DecodeNs, "step-decode-ns", def.DecodeNs, "step model: ns per decode token")
	fs.Float64Var(&o.step.ContextNs, "step-context-ns", def.ContextNs, "step model: ns per context token read")
	admit := fs.Duration("step-admit", def.PerAdmit, "step model: cost per request admitted in a step")
	fs.IntVar(&o.parallel, "parallel", 0, "experiments run concurrently (0 = GOMAXPROCS); output does not depend on it")
	fs.BoolVar(&o.fit, "fit", false, "print the calibration fit: llm-d parity at every published point, model vs hardware, residuals")
	fs.BoolVar(&o.sweep, "sweep", false, "run the Tick × Burst × credit sweep used to choose flowgate's defaults")
	fs.StringVar(&o.sweepQPS, "sweep-points", "codegen:4,codegen:16,chat:20,chat:80,reasoning:0.2,reasoning:0.7", "sweep: workload:qps points")
	fs.StringVar(&o.sweepTicks, "sweep-ticks", "", "sweep: comma-separated ticks (default 1ms,5ms,10ms,50ms)")
	fs.StringVar(&o.sweepBursts, "sweep-bursts", "", "sweep: comma-separated bursts (default 1,4,32)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.step.Base, o.step.PerAdmit = *base, *admit
	o.critNoStream = !*critStream
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.full {
		if !set["policy"] {
			*pol = strings.Join(fullPolicies, ",")
		}
		if !set["backend-priority-rows"] {
			*bpRows = strings.Join(fullBPRows, ",")
		}
		if !set["format"] {
			o.format = "table"
		}
		if !set["evict-rows"] {
			*evictRows = strings.Join(fullEvictRows, ",")
		}
	} else if !set["workload"] && !set["qps"] {
		o.points = defaultPoints
	}
	if *wl == "all" {
		o.workloads = workload.All()
	} else {
		w, err := workload.ByName(*wl)
		if err != nil {
			return o, fmt.Errorf("-workload: %w", err)
		}
		o.workloads = []workload.Workload{w}
	}
	if *qps != "" {
		for _, f := range strings.Split(*qps, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return o, fmt.Errorf("-qps: %q is not a positive number", f)
			}
			o.qps = append(o.qps, v)
		}
	}
	for _, f := range strings.Split(*pol, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "both":
			o.policies = append(o.policies, cluster.Static, cluster.SoftReflective)
		case cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.LLMDPriorityHoldback,
			cluster.Static, cluster.SoftReflective, cluster.PriorityHoldback, cluster.StaticBlockCritical:
			o.policies = append(o.policies, f)
		case cluster.Floor:
			o.floor = true
		default:
			return o, fmt.Errorf("-policy: %q must be none, llmd-static, llmd-soft-reflective, llmd-priority-holdback, static, soft-reflective, priority-holdback, static-block-critical or both", f)
		}
	}
	o.holdback.Domain = hb.Domain
	if err := o.holdback.Validate(); err != nil {
		return o, fmt.Errorf("-holdback-min, -holdback-max: %w", err)
	}
	switch *projection {
	case "none":
		o.projection = saturation.ProjectNone
	case "completion":
		o.projection = saturation.ProjectCompletion
	case "steady":
		o.projection = saturation.ProjectSteady
	default:
		return o, fmt.Errorf("-kv-projection: %q must be none, completion or steady", *projection)
	}
	switch *aggregate {
	case "mean":
	case "max":
		o.maxReplicas = true
	default:
		return o, fmt.Errorf("-aggregate: %q must be mean or max", *aggregate)
	}
	if !o.backendPrio && *bpRows != "" {
		for _, f := range strings.Split(*bpRows, ",") {
			switch f = strings.TrimSpace(f); f {
			case cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.Static, cluster.SoftReflective:
				o.bpRows = append(o.bpRows, f)
			default:
				return o, fmt.Errorf("-backend-priority-rows: %q must be none, llmd-static, llmd-soft-reflective, static or soft-reflective", f)
			}
		}
	}
	if *tenants == "long-short" {
		o.longShort = true
	} else if *tenants != "" {
		a, b, ok := strings.Cut(*tenants, ":")
		x, err1 := strconv.ParseFloat(a, 64)
		y, err2 := strconv.ParseFloat(b, 64)
		if !ok || err1 != nil || err2 != nil || !(x > 0) || !(y > 0) || math.IsInf(x/y, 0) {
			return o, fmt.Errorf("-tenants: %q must be A:B with positive numbers, or long-short", *tenants)
		}
		o.tenants = x / y
	}
	switch *shared {
	case "off", "0", "":
	case "request":
		o.sharedExact = true
	default:
		d, err := time.ParseDuration(*shared)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("-shared-inflight: %q must be off, request or a positive duration", *shared)
		}
		o.shared = d
	}
	if !(o.critKVRoom > 0 && o.critKVRoom <= 1) {
		return o, fmt.Errorf("-critical-kv-headroom: %v must be in (0, 1]", o.critKVRoom)
	}
	if !slices.Contains(cluster.CriticalRoutings(), o.critRouting) {
		return o, fmt.Errorf("-critical-routing: %q must be same, kv or kv-bp", o.critRouting)
	}
	if !slices.Contains(cluster.Routings(), o.routing) {
		return o, fmt.Errorf("-routing: %q must be scrape or inflight", o.routing)
	}
	if o.format != "summary" && o.format != "table" && o.format != "json" {
		return o, fmt.Errorf("-format: %q must be summary, table or json", o.format)
	}
	switch {
	case o.duration <= 0:
		return o, errors.New("-duration must be > 0")
	case o.gateways < 1:
		return o, errors.New("-gateways must be >= 1")
	case o.tick < 0:
		return o, errors.New("-tick must be >= 0")
	case o.burst < 0:
		return o, errors.New("-burst must be >= 0")
	case o.scrape <= 0:
		return o, errors.New("-scrape must be > 0")
	case o.replicas < 1:
		return o, errors.New("-replicas must be >= 1")
	case !(o.cv >= 0):
		return o, errors.New("-cv must be >= 0")
	case o.parallel < 0:
		return o, errors.New("-parallel must be >= 0")
	case o.seeds < 1:
		return o, errors.New("-seeds must be >= 1")
	case o.timeout < 0:
		return o, errors.New("-client-timeout must be >= 0")
	case o.llmdTTL < 0:
		return o, errors.New("-llmd-ttl must be >= 0")
	case !(o.eviction.Threshold >= 0) || math.IsInf(o.eviction.Threshold, 1):
		return o, errors.New("-evict-threshold must be finite and >= 0")
	case !(o.eviction.KVThreshold >= 0 && o.eviction.KVThreshold <= 1):
		return o, errors.New("-evict-kv must be in [0, 1]")
	case o.eviction.Stall < 0 || o.eviction.Grace < 0 || o.eviction.MaxEvictions < 0:
		return o, errors.New("-evict-stall, -evict-grace and -evict-max must be >= 0")
	}
	if *evictRows != "" {
		for _, f := range strings.Split(*evictRows, ",") {
			switch f = strings.TrimSpace(f); f {
			case cluster.None, cluster.Static, cluster.SoftReflective, cluster.PriorityHoldback, cluster.StaticBlockCritical:
				o.evictRows = append(o.evictRows, f)
			default:
				return o, fmt.Errorf("-evict-rows: %q must be none or one of flowgate's policies", f)
			}
		}
	}
	rc := vllm.DefaultConfig()
	rc.Step = o.step
	rc.PreemptForWaiting = o.preemptWaiting
	if err := rc.Validate(); err != nil {
		return o, fmt.Errorf("step model: %w", err)
	}
	return o, nil
}

// defaultEvictRows are the policies the default run also runs with eviction:
// flowgate's shipped policy. fullEvictRows (-full) add no gate at all, which
// the default run leaves out for its time: without a gate every request is
// tracked at once (thousands at codegen@24), and each check scans them all
// (4 s a run there instead of 0.1 s).
var (
	defaultEvictRows = []string{cluster.SoftReflective}
	fullEvictRows    = []string{cluster.SoftReflective, cluster.None}
)

// EvictSuffix marks a row run with eviction (-evict-rows).
const EvictSuffix = "+evict"

// fullBPRows are the policies -full also runs with backend priority: no gateway
// gate and flowgate's shipped policy, each beside its row without.
var fullBPRows = []string{cluster.None, cluster.SoftReflective}

// defaultPoints are the default run's points: every overloaded published point and
// codegen@10, the under-capacity point nearest the knee (the one where a gate could
// cost the most while protecting nothing).
var defaultPoints = []sweepPoint{
	{workload.Codegen, 10}, {workload.Codegen, 16}, {workload.Codegen, 24},
	{workload.Chat, 80}, {workload.Reasoning, 0.7}, {workload.Reasoning, 1.2},
}

func pointsString(ps []sweepPoint) string {
	var ss []string
	for _, p := range ps {
		ss = append(ss, fmt.Sprintf("%s@%g", p.w.Name, p.qps))
	}
	return strings.Join(ss, ", ")
}

// BPSuffix marks a row run with backend priority (-backend-priority-rows).
const BPSuffix = "+bp"

// DefaultProjection and DefaultAggregate are the simulator's flowgate saturation
// wiring, chosen by the signal sweep (NOTES-2026.md next to this file).
const (
	DefaultProjection = saturation.ProjectNone
	DefaultAggregate  = "mean"
	// DefaultPromptTokens is saturation.Scorer.PromptTokenThreshold (0 = off): what
	// flowhttp.Gateway ships.
	DefaultPromptTokens = saturation.DefaultPromptTokenThreshold
)

// DefaultCriticalRouting is -critical-routing's default: with backend priority a
// critical request is routed among the replicas with KV-cache headroom (NOTES-2026.md
// next to this file, "Backend priority at reasoning@0.7").
const DefaultCriticalRouting = cluster.CriticalRoutingKVWithPriority

// defaultPolicies are the policies of the default run (the floor is added by -floor):
// no flow control, llm-d parity with its static and soft-reflective policies, and
// flowgate's shipped policy. fullPolicies (-full) add flowgate's static.
var (
	defaultPolicies = []string{cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.SoftReflective}
	fullPolicies    = []string{cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.Static, cluster.SoftReflective}
)

// DefaultClientTimeout is how long the simulated clients wait before giving up.
const DefaultClientTimeout = 300 * time.Second

// config builds one experiment's configuration from the options.
func (o options) config(w workload.Workload, qps float64, policy string, seed uint64) cluster.Config {
	rc := vllm.DefaultConfig()
	rc.Step = o.step
	rc.PreemptForWaiting = o.preemptWaiting
	qthr := o.qthr
	if o.credit && !o.plain {
		// flowhttp.Gateway's wiring with its credit on: it scores a pod's
		// queue against CreditQueueDepthThreshold (TestGatewayWiringDefault).
		// A plain Controller over a Poller keeps the Poller's defaults.
		if qthr == 0 {
			qthr = flowhttp.CreditQueueDepthThreshold
		}
	}
	return cluster.Config{
		Workload: w, QPS: qps, Policy: policy, Duration: o.duration, Seed: seed,
		Replicas: o.replicas, Gateways: o.gateways, Tick: o.tick, Burst: o.burst,
		SharedInFlight: o.shared, SharedInFlightExact: o.sharedExact, Routing: o.routing, CriticalRouting: o.critRouting, CriticalKVHeadroom: o.critKVRoom, Admission: o.admission,
		Tenants: o.tenants, LongShort: o.longShort, Fairness: o.fairness, TenantBAlone: o.bAlone,
		Credit: o.credit, PlainController: o.plain, QueueThreshold: qthr, KVThreshold: o.kvthr, Projection: o.projection, PromptTokens: o.promptTok, MaxOverReplicas: o.maxReplicas, Scrape: o.scrape, CV: o.cv, Replica: rc,
		ClientTimeout: o.timeout, BackendPriority: o.backendPrio, LLMDTTL: o.llmdTTL,
		Holdback: o.holdback, Eviction: o.eviction, SheddableStream: o.shedStream, CriticalNoStream: o.critNoStream,
	}
}
