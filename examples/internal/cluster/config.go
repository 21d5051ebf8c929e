package cluster

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
	"github.com/flowgate/flowgate/saturation"
)

// ErrInvalidConfig is wrapped by every error Run returns for a bad Config.
var ErrInvalidConfig = errors.New("cluster: invalid config")

// Policy names as the CLI and the JSON output spell them.
const (
	// None is no flow control: every request is dispatched on arrival.
	None = "none"
	// Static and SoftReflective are flowgate's policies in flowcontrol.Dispatcher.
	Static         = "static"
	SoftReflective = "soft-reflective"
	// StaticBlockCritical is Static with flowcontrol.Config.BlockCritical:
	// band 0 blocked at and above the threshold like every band (llm-d's
	// meaning), not paced at MaxCriticalEvery.
	StaticBlockCritical = "static-block-critical"
	// LLMDStatic and LLMDSoftReflective are llm-d parity: llmd.Dispatcher (package
	// flowcontrol/llmd: one item per cycle, strict priority, halt at the first gated
	// band) with llmd.NewStatic(1.0) or llmd.NewSoftReflective().
	LLMDStatic         = "llmd-static"
	LLMDSoftReflective = "llmd-soft-reflective"
	// PriorityHoldback and LLMDPriorityHoldback are llm-d's priority-holdback-policy
	// with Config.Holdback's ceilings: flowgate's flowcontrol.PriorityHoldback in
	// flowcontrol.Dispatcher, and llm-d parity (llmd.NewPriorityHoldback in
	// llmd.Dispatcher).
	PriorityHoldback     = "priority-holdback"
	LLMDPriorityHoldback = "llmd-priority-holdback"
	// Floor is the same critical arrivals with no sheddable traffic, dispatched on
	// arrival: the physical lower bound of critical latency.
	Floor = "floor"
)

// Policies lists every policy name, in the order the simulator reports them.
func Policies() []string {
	return []string{Floor, None, LLMDStatic, LLMDSoftReflective, LLMDPriorityHoldback, Static, SoftReflective, PriorityHoldback, StaticBlockCritical}
}

// Routing names: how a gateway picks the replica for a request it dispatches.
const (
	// RoutingScrape is the replica with the least max(scraped waiting + running,
	// in-flight count the gateway sees there) at the last scrape; ties go to fewer of
	// the gateway's own requests in flight, then the lower index. Several gateways
	// that scrape the same page herd onto the replica it shows emptiest.
	RoutingScrape = "scrape"
	// RoutingInFlight is the example proxy's and flowhttp.Router.LeastLoaded's
	// routing: the replica with the fewest requests in flight as this gateway sees
	// them (its own, plus the other gateways' with SharedInFlight, as the proxy's
	// shared view adds them), ties broken round-robin by a per-gateway counter.
	RoutingInFlight = "inflight"
)

// Critical routing names: how a flowgate gateway picks the replica for a critical
// request (Config.CriticalRouting). The critical routing is flowhttp.Gateway's
// (GatewayConfig.CriticalKVHeadroom): it applies to flowgate's policies only (Static,
// SoftReflective, PriorityHoldback, StaticBlockCritical); None, the Floor and the
// llm-d parity policies route every request by Config.Routing whatever it says.
const (
	// CriticalRoutingSame routes critical requests as every other (Config.Routing).
	CriticalRoutingSame = "same"
	// CriticalRoutingKV routes a critical request among the replicas that have at
	// least Config.CriticalKVHeadroom of their KV cache free at the gateway's last
	// scrape (1 − vllm:kv_cache_usage_perc), by Config.Routing; when none has,
	// among those with the lowest usage; when all have, among all
	// (flowhttp.Router.LeastLoadedFor(0) with RoutingInFlight).
	// Under vLLM's priority scheduling a critical request passes every sheddable
	// one in the waiting queue but still needs free KV blocks for its prompt, and
	// vLLM preempts no running request to admit a waiting one: on a replica whose
	// cache is full it waits until a running request's growth forces a preemption
	// (examples/sim/NOTES-2026.md, "Backend priority at reasoning@0.7").
	CriticalRoutingKV = "kv"
	// CriticalRoutingKVWithPriority is CriticalRoutingKV when the replicas
	// schedule by priority (Config.BackendPriority), CriticalRoutingSame
	// otherwise: flowhttp.Gateway's default, on when it forwards priority
	// (Options.ForwardPriority PrioritySet).
	CriticalRoutingKVWithPriority = "kv-bp"
)

// DefaultCriticalKVHeadroom is Config.CriticalKVHeadroom's zero value: the
// Gateway's default.
const DefaultCriticalKVHeadroom = flowhttp.DefaultCriticalKVHeadroom

// CriticalRoutings lists the critical routing names.
func CriticalRoutings() []string {
	return []string{CriticalRoutingSame, CriticalRoutingKV, CriticalRoutingKVWithPriority}
}

// Routings lists the routing names.
func Routings() []string { return []string{RoutingScrape, RoutingInFlight} }

// DefaultRouting is Config.Routing's zero value.
const DefaultRouting = RoutingScrape

func knownPolicy(p string) bool {
	for _, q := range Policies() {
		if p == q {
			return true
		}
	}
	return false
}

func (c Config) flowgate() bool {
	return c.Policy == Static || c.Policy == SoftReflective || c.Policy == PriorityHoldback || c.Policy == StaticBlockCritical
}
func (c Config) llmd() bool {
	return c.Policy == LLMDStatic || c.Policy == LLMDSoftReflective || c.Policy == LLMDPriorityHoldback
}

// DefaultHoldback is the holdback policies' configuration when Config.Holdback is
// the zero value: llm-d's rank domain, maxCeiling 1 (its default) and minCeiling
// 0.5 (llm-d has no default; examples/sim/NOTES-2026.md records the choice).
func DefaultHoldback() flowcontrol.HoldbackConfig {
	return flowcontrol.HoldbackConfig{Domain: flowcontrol.HoldbackRank, MinCeiling: 0.5, MaxCeiling: 1}
}

// bandPriorities are the priority values of the simulator's two bands (critical,
// sheddable) for the holdback policies' value and explicit domains.
var bandPriorities = []int{1, 0}

// Config is one experiment. Zero values of optional fields take the defaults noted.
type Config struct {
	Workload workload.Workload
	QPS      float64       // offered load, requests/s over all gateways (> 0)
	Policy   string        // one of Policies()
	Duration time.Duration // arrival window (> 0)
	// DrainLimit bounds the virtual time after the window during which the pool may
	// finish what it holds. 0 means 20·Duration (in practice, until empty).
	DrainLimit time.Duration
	Seed       uint64
	Replicas   int           // vLLM replicas (0 = 2)
	Gateways   int           // independent dispatchers sharing the pool (0 = 1)
	Tick       time.Duration // dispatcher tick (0 = flowcontrol.DefaultTick)
	Burst      int           // items per gated band per opportunity (0 = flowcontrol.DefaultBurst)
	// SharedInFlight models gateway replicas sharing their in-flight view
	// (saturation/redisshare): every SharedInFlight each gateway refreshes its copy of
	// the other gateways' in-flight counts per replica, which routing and the in-flight
	// credit then add to its own. 0 = no sharing. SharedInFlightExact shares them at
	// the end of every instant in which one changed instead (the limit of a period of
	// 0: "per request").
	SharedInFlight      time.Duration
	SharedInFlightExact bool
	// Routing is how each gateway picks a replica: RoutingScrape or RoutingInFlight
	// ("" = DefaultRouting).
	Routing string
	// CriticalRouting is how each flowgate gateway picks the replica for a critical
	// request: one of CriticalRoutings() ("" = CriticalRoutingSame); the other
	// policies ignore it.
	CriticalRouting string
	// CriticalKVHeadroom is CriticalRoutingKV's filter: the share of a replica's KV
	// cache that must be free at the last scrape for a replica to stay among those a
	// critical request is routed to (0 = DefaultCriticalKVHeadroom).
	CriticalKVHeadroom float64
	// Tenants, if > 0, is the noisy neighbour: the sheddable band's traffic is split
	// between two tenants, A sending Tenants times B's rate (each sheddable arrival is
	// B's with probability 1/(1+Tenants), from a stream of its own); every critical
	// arrival is B's. Fairness is the flowgate dispatchers' BandConfig.Fairness for
	// every band (flows are the tenants, cost input + output tokens). TenantBAlone
	// drops tenant A's arrivals (the same B arrivals, alone: the noisy neighbour's
	// baseline).
	Tenants      float64
	Fairness     string
	TenantBAlone bool
	// LongShort splits the sheddable band between two tenants at equal request rates
	// by length instead: an arrival whose cost (input + output tokens) is above the
	// workload's median cost is tenant A's ("long"), the others B's ("short"); critical
	// arrivals are split the same way. Result.TenantATokenShare is then A's share of
	// the sheddable tokens dispatched in the middle half of the arrival window.
	// Exclusive with Tenants.
	LongShort bool
	// Admission puts llm-d's probabilistic admitter (flowcontrol.Probabilistic: sheddable
	// shed with probability min(1, 300·s^5)) in front of each gateway's queue.
	Admission bool
	Credit    bool // count dispatched-but-invisible requests as waiting (flowgate's gateways; llm-d parity has none)
	// PlainController models flowgate's rows as a plain flowcontrol.Controller over a
	// saturation.Poller (no flowhttp.Gateway): the poller learns of releases from the
	// controller but not where each went, so it credits them to the pool
	// (saturation.Scorer.PoolReleased) instead of to each pod. Credit is then ignored.
	PlainController bool
	// QueueThreshold and KVThreshold are the flowgate gateways' saturation.Scorer
	// thresholds (0 = the reference 5 and 0.8, which the llm-d baselines and the
	// admitter always use).
	QueueThreshold, KVThreshold float64
	// Projection is the flowgate gateways' saturation.Scorer.Projection: how KV
	// usage is anticipated (from each replica's running count, mean prompt and
	// output lengths of finished requests and KV capacity, what vLLM exports).
	// MaxOverReplicas scores the pool by its most saturated replica
	// (saturation.Scorer.PoolMax) instead of the mean.
	Projection saturation.KVProjection
	// PromptTokens is the flowgate gateways' saturation.Scorer.PromptTokenThreshold
	// (0 = off).
	PromptTokens    float64
	MaxOverReplicas bool
	Scrape          time.Duration // metrics scrape interval (0 = 50 ms)
	CV              float64       // token-length coefficient of variation (<0 = workload.DefaultCV)
	Capacity        int           // per-band gateway queue capacity (0 = twice a gateway's expected arrivals, at least 1024)
	Replica         vllm.Config   // zero TotalBlocks = vllm.DefaultConfig()
	// CatchUp bounds how many skipped ticks are replayed when a dormant gateway wakes
	// (0 = 4096); see "Tick skipping" in examples/sim/README.md.
	CatchUp int
	// ClientTimeout is how long a client waits for its request to complete before it
	// gives up; the request is then aborted wherever it is (gateway queue or replica).
	// 0 = clients never give up.
	ClientTimeout time.Duration
	// BackendPriority makes the replicas schedule by priority (vLLM
	// --scheduling-policy priority): critical requests carry priority 0, sheddable 1.
	BackendPriority bool
	// LLMDTTL is the llm-d parity gateway's request TTL (0 = none), enforced by the
	// 1 s sweep.
	LLMDTTL time.Duration
	// Holdback configures PriorityHoldback and LLMDPriorityHoldback over the two
	// bands, critical at priority 1 and sheddable at 0. The zero value means
	// DefaultHoldback().
	Holdback flowcontrol.HoldbackConfig

	// Evict runs one flowcontrol.Evictor per gateway beside its dispatcher (or,
	// with None and the Floor, beside its dispatch on arrival): it takes back
	// dispatched sheddable requests from a replica where a critical request
	// waits without its first token for Eviction.Stall while the gateway's
	// saturation is at or above Eviction.Threshold (see "Eviction" in
	// examples/sim/README.md). A victim whose response has not started is
	// aborted at its replica and re-queued at the head of its band (None:
	// dispatched again at once); a started stream (Eviction.Started) ends as
	// failed. Only flowgate's policies, None and the Floor take it.
	Evict bool
	// Eviction tunes the evictor; zero fields are the library's defaults, except
	// Grace, which is at least Scrape (the freed capacity shows in the
	// saturation one scrape later). Enabled is ignored (Evict is the switch).
	Eviction flowcontrol.EvictionConfig
	// SheddableStream makes sheddable clients stream (their response starts at
	// the first token); CriticalNoStream makes critical clients not stream (it
	// starts when the request completes, the whole body at once). The default:
	// critical streams, sheddable does not, as batch and background jobs usually
	// call without stream. Only eviction reads it: a started response is no
	// victim unless Eviction.Started, and a request whose response has not
	// started counts as held after Eviction.Stall.
	SheddableStream, CriticalNoStream bool

	// noSkip makes every gateway tick on every tick of the run (tests compare it with
	// the skipping loop, which must give the same result).
	noSkip bool
	// policy, if set, replaces the policy of a flowgate row (tests compare a
	// user's PolicyFunc with the shipped policy it restates).
	policy flowcontrol.CeilingPolicy
	// onTick, if set, is called after every tick the dispatcher runs, with the
	// saturation the tick was accounted at (tests).
	onTick func(s *sim, g *gateway, sat float64)
	// onEventHook, if set, is called after every event (tests).
	onEventHook func(s *sim)
	// onRoute, if set, is called with every routing decision, before the request
	// counts on replica r (tests).
	onRoute func(s *sim, g *gateway, r int, id int32)
}

// Defaults returns cfg with every zero optional field set.
func (c Config) withDefaults() Config {
	if c.DrainLimit == 0 {
		c.DrainLimit = 20 * c.Duration
	}
	if c.Routing == "" {
		c.Routing = DefaultRouting
	}
	if c.CriticalRouting == "" {
		c.CriticalRouting = CriticalRoutingSame
	}
	if c.CriticalKVHeadroom == 0 {
		c.CriticalKVHeadroom = DefaultCriticalKVHeadroom
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.Gateways == 0 {
		c.Gateways = 1
	}
	if c.Tick == 0 {
		c.Tick = flowcontrol.DefaultTick
	}
	if c.Burst == 0 {
		c.Burst = flowcontrol.DefaultBurst
	}
	if c.Scrape == 0 {
		c.Scrape = 50 * time.Millisecond
	}
	if c.CV < 0 {
		c.CV = workload.DefaultCV
	}
	if c.Capacity == 0 && c.Gateways > 0 && c.QPS > 0 {
		// Big enough that no run rejects (the "queues big enough"), without
		// allocating a huge ring for a short run.
		c.Capacity = max(1024, int(min(2*c.QPS/float64(c.Gateways)*c.Duration.Seconds(), 1<<24)))
	}
	if c.Replica.TotalBlocks == 0 {
		c.Replica = vllm.DefaultConfig()
	}
	if c.CatchUp == 0 {
		c.CatchUp = 4096
	}
	if c.Evict && c.Eviction.Grace == 0 {
		c.Eviction.Grace = max(flowcontrol.DefaultEvictionGrace, c.Scrape)
	}
	if c.Holdback.Domain == "" && c.Holdback.Shape == "" && c.Holdback.MinCeiling == 0 && c.Holdback.MaxCeiling == 0 && c.Holdback.Ceilings == nil {
		c.Holdback = DefaultHoldback()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case !(c.QPS > 0):
		return fmt.Errorf("%w: QPS %v must be > 0", ErrInvalidConfig, c.QPS)
	case !(c.Tenants >= 0) || math.IsInf(c.Tenants, 1):
		return fmt.Errorf("%w: Tenants %v must be a finite ratio >= 0", ErrInvalidConfig, c.Tenants)
	case c.LongShort && c.Tenants > 0:
		return fmt.Errorf("%w: LongShort and Tenants are exclusive", ErrInvalidConfig)
	case c.LongShort && c.TenantBAlone:
		return fmt.Errorf("%w: TenantBAlone is for Tenants (the noisy neighbour)", ErrInvalidConfig)
	case !(c.QueueThreshold >= 0) || math.IsInf(c.QueueThreshold, 1):
		return fmt.Errorf("%w: QueueThreshold %v must be finite and >= 0 (0 = 5)", ErrInvalidConfig, c.QueueThreshold)
	case !(c.KVThreshold >= 0 && c.KVThreshold <= 1):
		return fmt.Errorf("%w: KVThreshold %v must be in [0, 1] (0 = 0.8)", ErrInvalidConfig, c.KVThreshold)
	case c.Projection > saturation.ProjectSteady:
		return fmt.Errorf("%w: Projection %v must be none, completion or steady", ErrInvalidConfig, c.Projection)
	case c.SharedInFlight < 0:
		return fmt.Errorf("%w: SharedInFlight %v must be >= 0", ErrInvalidConfig, c.SharedInFlight)
	case !knownPolicy(c.Policy):
		return fmt.Errorf("%w: Policy %q must be one of %q", ErrInvalidConfig, c.Policy, Policies())
	case c.Routing != RoutingScrape && c.Routing != RoutingInFlight:
		return fmt.Errorf("%w: Routing %q must be one of %q", ErrInvalidConfig, c.Routing, Routings())
	case !(c.CriticalKVHeadroom > 0 && c.CriticalKVHeadroom <= 1):
		return fmt.Errorf("%w: CriticalKVHeadroom %v must be in (0, 1]", ErrInvalidConfig, c.CriticalKVHeadroom)
	case !slices.Contains(CriticalRoutings(), c.CriticalRouting):
		return fmt.Errorf("%w: CriticalRouting %q must be one of %q", ErrInvalidConfig, c.CriticalRouting, CriticalRoutings())
	case c.Duration <= 0:
		return fmt.Errorf("%w: Duration %v must be > 0", ErrInvalidConfig, c.Duration)
	case c.DrainLimit < 0:
		return fmt.Errorf("%w: DrainLimit %v must be >= 0", ErrInvalidConfig, c.DrainLimit)
	case c.Replicas < 1:
		return fmt.Errorf("%w: Replicas %d must be >= 1", ErrInvalidConfig, c.Replicas)
	case c.Gateways < 1:
		return fmt.Errorf("%w: Gateways %d must be >= 1", ErrInvalidConfig, c.Gateways)
	case c.Tick < 0:
		return fmt.Errorf("%w: Tick %v must be >= 0", ErrInvalidConfig, c.Tick)
	case c.Burst < 0:
		return fmt.Errorf("%w: Burst %d must be >= 0", ErrInvalidConfig, c.Burst)
	case c.Scrape < 0:
		return fmt.Errorf("%w: Scrape %v must be >= 0", ErrInvalidConfig, c.Scrape)
	case c.Capacity < 0:
		return fmt.Errorf("%w: Capacity %d must be >= 0", ErrInvalidConfig, c.Capacity)
	case c.CatchUp < 0:
		return fmt.Errorf("%w: CatchUp %d must be >= 0", ErrInvalidConfig, c.CatchUp)
	case c.ClientTimeout < 0:
		return fmt.Errorf("%w: ClientTimeout %v must be >= 0", ErrInvalidConfig, c.ClientTimeout)
	case c.LLMDTTL < 0:
		return fmt.Errorf("%w: LLMDTTL %v must be >= 0", ErrInvalidConfig, c.LLMDTTL)
	}
	if c.Evict && c.llmd() {
		return fmt.Errorf("%w: Evict is for flowgate's policies, None and the Floor, not %q", ErrInvalidConfig, c.Policy)
	}
	if c.Policy == PriorityHoldback || c.Policy == LLMDPriorityHoldback {
		if _, err := c.Holdback.BandCeilings(bandPriorities); err != nil {
			return fmt.Errorf("%w: Holdback: %v", ErrInvalidConfig, err)
		}
	}
	return nil
}
