package cluster

import (
	"slices"
	"time"
)

// Class holds the measurements of one band's requests.
type Class struct {
	Requests  int // arrivals in the window
	Completed int // finished (within the drain limit)
	Rejected  int // refused by the gateway (queue full); expiries are off
	Shed      int // refused by the admission stage (Config.Admission)
	Timeouts  int // clients that gave up (Config.ClientTimeout) before completion
	Cut       int // started streams that an eviction ended (Config.Eviction.Started)
	// TTFTp50 and TTFTp99 are in ms, over requests that got a first token and, counted
	// at the client timeout (a lower bound: censored), those whose client gave up first.
	TTFTp50 float64
	TTFTp99 float64
	E2Ep50  float64 // ms, over completed requests
	E2Ep99  float64
	// Throughput is completions per second inside the arrival window: requests that
	// finished by the end of the window, over its length (goodput while load is offered).
	Throughput float64
	// Goodput is completions (within the client timeout, wherever they end) per second
	// of the arrival window.
	Goodput float64
}

// Result is one experiment's outcome.
type Result struct {
	Workload  string
	QPS       float64
	Policy    string
	Seed      uint64
	Critical  Class
	Sheddable Class
	// Shares of the window's ticks (summed over gateways) the sheddable band spent in the
	// dead zone (Every 1), the proportional regime (Every > 1) and the hard block.
	ShareDeadZone, ShareProportional, ShareHardBlock float64
	MeanSaturation                                   float64 // mean over the window's ticks
	Preemptions                                      uint64
	Steps                                            uint64
	MaxGatewayQueue                                  int
	Unfinished                                       int // requests left when the drain limit hit
	// TenantBCriticalTTFTp99 and TenantBSheddableTTFTp99 (ms) are tenant B's critical and
	// sheddable TTFT p99 when Config.Tenants is set (counted as TTFTp99 is), 0 otherwise.
	TenantBCriticalTTFTp99, TenantBSheddableTTFTp99 float64
	// TenantBSheddableWaitp99 (ms) is the p99 of the time tenant B's sheddable requests
	// spent in the gateway's queue (dispatched ones only) when Config.Tenants is set.
	TenantBSheddableWaitp99 float64
	// TenantATokenShare is, with Config.LongShort, tenant A's (the long requests')
	// share of the sheddable tokens (input + output) dispatched in the middle half of
	// the arrival window; 0 otherwise.
	TenantATokenShare float64
	// TotalThroughput is completions of both classes inside the arrival window per
	// second; TotalGoodput is completions of both classes per second of the window.
	TotalThroughput, TotalGoodput float64
	// BackendPriority is Config.BackendPriority (a row of its own in the tables).
	BackendPriority bool
	// Steps of the arrival window, for the step-time bound (see StepBound).
	StepStats StepStats
	// Evict is Config.Evict (a row of its own in the tables).
	Evict bool
	// Evictions counts the requests the evictors took back (all of them
	// sheddable: the simulator has two bands), per minute of the arrival window
	// too; Requeued of them went back to their gateway's queue (or, with no
	// dispatcher, straight to a replica) and Cut ended as failed (started
	// streams, Config.Eviction.Started). Immune counts the requests evicted
	// Eviction.MaxEvictions times.
	Evictions             int
	EvictionsPerMin       float64
	Requeued, Cut, Immune int
	// IdleVictims counts the victims that held no KV block when they were
	// taken (waiting in the replica's queue): their eviction freed nothing.
	IdleVictims int
	// WastedPrefill and WastedDecode are the work the victims had done when they
	// were aborted: prompt tokens whose KV they had computed, output tokens they
	// had sampled. ServedTokens is the prompt and output tokens of the completed
	// requests; WastedShare is (WastedPrefill + WastedDecode) / ServedTokens.
	WastedPrefill, WastedDecode, ServedTokens int64
	WastedShare                               float64
}

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted xs, 0 if empty.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (s *sim) result() Result {
	for _, g := range s.gws {
		s.account(g, s.winTicks)
	}
	res := Result{Workload: s.cfg.Workload.Name, QPS: s.cfg.QPS, Policy: s.cfg.Policy, Seed: s.cfg.Seed,
		Preemptions: s.preempts, Steps: s.steps, BackendPriority: s.cfg.BackendPriority, StepStats: s.signal.stats(s)}
	var ttft, e2e [2][]float64
	var cls [2]*Class = [2]*Class{&res.Critical, &res.Sheddable}
	for i := range s.reqs {
		q := &s.reqs[i]
		c := 1
		if q.critical {
			c = 0
		}
		cl := cls[c]
		cl.Requests++
		if q.rejected {
			cl.Rejected++
			continue
		}
		if q.shed {
			cl.Shed++
			continue
		}
		if q.first >= 0 {
			ttft[c] = append(ttft[c], ms(q.first-q.arrive))
		} else if q.timedOut {
			ttft[c] = append(ttft[c], ms(int64(s.cfg.ClientTimeout)))
		}
		if q.timedOut {
			cl.Timeouts++
			continue
		}
		if q.cut {
			cl.Cut++
			continue
		}
		if q.done >= 0 {
			res.ServedTokens += int64(q.vr.Input + q.vr.Output)
			cl.Completed++
			cl.Goodput++
			e2e[c] = append(e2e[c], ms(q.done-q.arrive))
			if q.done <= s.window {
				cl.Throughput++
			}
		} else {
			res.Unfinished++
		}
	}
	if s.cfg.LongShort {
		if t := s.tokens[0] + s.tokens[1]; t > 0 {
			res.TenantATokenShare = s.tokens[0] / t
		}
	}
	if s.tenants != nil {
		var b [2][]float64
		var wait []float64
		for i := range s.reqs {
			q := &s.reqs[i]
			if !q.tenantB || q.rejected || q.shed {
				continue
			}
			c := 1
			if q.critical {
				c = 0
			}
			if c == 1 && q.dispatch >= 0 {
				wait = append(wait, ms(q.dispatch-q.arrive))
			}
			switch {
			case q.first >= 0:
				b[c] = append(b[c], ms(q.first-q.arrive))
			case q.timedOut:
				b[c] = append(b[c], ms(int64(s.cfg.ClientTimeout)))
			}
		}
		for c := range 2 {
			slices.Sort(b[c])
		}
		res.TenantBCriticalTTFTp99, res.TenantBSheddableTTFTp99 = Percentile(b[0], 0.99), Percentile(b[1], 0.99)
		slices.Sort(wait)
		res.TenantBSheddableWaitp99 = Percentile(wait, 0.99)
	}
	for c := range 2 {
		slices.Sort(ttft[c])
		slices.Sort(e2e[c])
		cl := cls[c]
		cl.TTFTp50, cl.TTFTp99 = Percentile(ttft[c], 0.5), Percentile(ttft[c], 0.99)
		cl.E2Ep50, cl.E2Ep99 = Percentile(e2e[c], 0.5), Percentile(e2e[c], 0.99)
		res.TotalThroughput += cl.Throughput
		res.TotalGoodput += cl.Goodput
		cl.Throughput /= time.Duration(s.window).Seconds()
		cl.Goodput /= time.Duration(s.window).Seconds()
	}
	res.TotalThroughput /= time.Duration(s.window).Seconds()
	res.TotalGoodput /= time.Duration(s.window).Seconds()
	res.Evict = s.cfg.Evict
	res.Evictions, res.Requeued, res.Cut, res.IdleVictims = s.evc.evictions, s.evc.requeued, s.evc.cut, s.evc.idle
	res.EvictionsPerMin = float64(s.evc.evictions) / time.Duration(s.window).Minutes()
	res.WastedPrefill, res.WastedDecode = s.evc.wastedPrefill, s.evc.wastedDecode
	if res.ServedTokens > 0 {
		res.WastedShare = float64(res.WastedPrefill+res.WastedDecode) / float64(res.ServedTokens)
	}
	for _, g := range s.gws {
		if g.ev != nil {
			for _, n := range g.ev.Stats().Immune {
				res.Immune += int(n)
			}
		}
	}
	var total, satSum float64
	var reg [3]float64
	for _, g := range s.gws {
		for i := range reg {
			reg[i] += float64(g.regime[i])
		}
		satSum += g.satSum
		res.MaxGatewayQueue = max(res.MaxGatewayQueue, g.maxQueued)
	}
	total = reg[0] + reg[1] + reg[2]
	if total > 0 {
		res.ShareDeadZone, res.ShareProportional, res.ShareHardBlock = reg[0]/total, reg[1]/total, reg[2]/total
		res.MeanSaturation = satSum / total
	}
	return res
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }
