package flowcontrol

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// Admitter is an optional stage in front of the queues: it decides whether a
// request may enter its band at all. Flow control decides when a queued
// request goes; an Admitter sheds work at the door, before it has taken a
// queue slot. Controller.Wait asks it (ControllerConfig.Admitter) after the
// band, context and running checks and before the queue; a refusal returns
// ErrShed and is counted in Stats as BandStats.Refused.Shed.
//
// Admit receives the band and the number of bands, and no saturation, on
// purpose: an admitter measures what it needs from a source of its own. The
// dispatcher reads its Source once per tick on its own goroutine and keeps
// only the sanitised value (NaN already turned into 1), whereas an admitter
// must tell "unknown" from "full" (it admits when it cannot tell), may use a
// different formula (llm-d's admitter scores the pods without in-flight
// credit), and runs on every caller's goroutine, where reading the
// dispatcher's source (an EWMA that updates on read, say) would change it.
//
// Admit is called concurrently from every Wait: it must be safe for
// concurrent use, quick, and must not block or call the Controller.
type Admitter interface {
	// Admit reports whether a request for band (0 ≤ band < bands, band 0
	// the most critical) may enter its queue.
	Admit(band, bands int) bool
}

// Defaults of ProbabilisticConfig, those of llm-d's probabilistic admitter:
// at saturation s a sheddable request is refused with probability
// min(1, DefaultShedK·s^DefaultShedPower), which sheds little at low
// saturation and every sheddable request from s = 300^(−1/5) up.
const (
	// DefaultShedK is ProbabilisticConfig.K's default.
	DefaultShedK = 300
	// DefaultShedPower is ProbabilisticConfig.Power's default.
	DefaultShedPower = 5
)

// ProbabilisticConfig configures NewProbabilistic.
type ProbabilisticConfig struct {
	// Source is the saturation s the admitter sheds by, read once per
	// sheddable Admit. The reference is the mean over pods of
	// max(waiting/5, kv/0.8): a saturation.Poller with the zero Scorer
	// (without InFlightCredit). A NaN reading means unknown and admits.
	// (A Poller never reports NaN: like llm-d, it scores a pod it cannot
	// see as 1, and an empty pool as 1, so an unreachable pool sheds every
	// sheddable request; a host that prefers to admit then wraps the
	// source.) Required.
	Source SaturationSource
	// K scales the refusal probability min(1, K·s^Power): finite and > 0.
	// 0 means DefaultShedK.
	K float64
	// Power is the exponent of s: finite and > 0; a higher power sheds
	// less at low saturation and more steeply near the top. 0 means
	// DefaultShedPower.
	Power float64
	// FirstSheddable is the most critical band that may be shed: bands
	// FirstSheddable and above are sheddable, the ones before are always
	// admitted. 0 means 1: every band but band 0, as llm-d sheds every
	// negative priority and band 0 holds the critical traffic. Band 0 is
	// never shed. A value at or beyond the number of bands sheds nothing.
	FirstSheddable int
	// LastBandOnly makes only the last band sheddable (when there are at
	// least two), whatever FirstSheddable says.
	LastBandOnly bool
	// Rand is the randomness of the refusals. Nil means math/rand/v2's
	// global generator (safe for concurrent use, no lock). A seeded source
	// given here (a rand.PCG, say) makes the refusals deterministic for
	// tests and simulations; it is drawn from under a
	// mutex, once per sheddable Admit whose probability lies strictly
	// between 0 and 1, and never otherwise.
	Rand rand.Source
}

// Probabilistic is llm-d's probabilistic admitter: a request on a
// sheddable band is refused with probability min(1, K·s^Power) at
// saturation s (ShedProbability), a request on any other band is always
// admitted, and so is every request while s is unknown (NaN). Saturation at
// or below 0 never sheds; +Inf always sheds. Safe for concurrent use; Admit
// allocates nothing.
type Probabilistic struct {
	src      SaturationSource
	k, power float64
	first    int
	lastOnly bool
	mu       sync.Mutex // guards rnd
	rnd      rand.Source
}

// NewProbabilistic validates cfg and returns the admitter. Errors wrap
// ErrInvalidConfig and name the field.
func NewProbabilistic(cfg ProbabilisticConfig) (*Probabilistic, error) {
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: ProbabilisticConfig.Source is nil", ErrInvalidConfig)
	}
	if cfg.K == 0 {
		cfg.K = DefaultShedK
	}
	if !(cfg.K > 0) || math.IsInf(cfg.K, 1) {
		return nil, fmt.Errorf("%w: ProbabilisticConfig.K must be finite and > 0 (0 = default %d), got %v",
			ErrInvalidConfig, DefaultShedK, cfg.K)
	}
	if cfg.Power == 0 {
		cfg.Power = DefaultShedPower
	}
	if !(cfg.Power > 0) || math.IsInf(cfg.Power, 1) {
		return nil, fmt.Errorf("%w: ProbabilisticConfig.Power must be finite and > 0 (0 = default %d), got %v",
			ErrInvalidConfig, DefaultShedPower, cfg.Power)
	}
	if cfg.FirstSheddable < 0 {
		return nil, fmt.Errorf("%w: ProbabilisticConfig.FirstSheddable must be ≥ 0 (0 = band 1), got %d",
			ErrInvalidConfig, cfg.FirstSheddable)
	}
	if cfg.FirstSheddable == 0 {
		cfg.FirstSheddable = 1
	}
	return &Probabilistic{src: cfg.Source, k: cfg.K, power: cfg.Power,
		first: cfg.FirstSheddable, lastOnly: cfg.LastBandOnly, rnd: cfg.Rand}, nil
}

// Sheddable reports whether band (of bands) may be shed at all.
func (a *Probabilistic) Sheddable(band, bands int) bool {
	if band < 1 || band >= bands {
		return false
	}
	if a.lastOnly {
		return band == bands-1
	}
	return band >= a.first
}

// ShedProbability returns the probability that a sheddable request is
// refused at saturation s: min(1, K·s^Power); 0 when s is NaN (unknown) or
// at most 0, 1 when s is +Inf or K·s^Power overflows. Pure.
func (a *Probabilistic) ShedProbability(s float64) float64 {
	if !(s > 0) {
		return 0 // NaN, 0, negative
	}
	return min(1, a.k*math.Pow(s, a.power))
}

// Admit reads the source once for a sheddable band and refuses with
// ShedProbability of the reading; other bands are admitted without reading.
func (a *Probabilistic) Admit(band, bands int) bool {
	if !a.Sheddable(band, bands) {
		return true
	}
	p := a.ShedProbability(a.src.Saturation())
	switch {
	case p <= 0:
		return true
	case p >= 1:
		return false
	}
	return a.uniform() >= p
}

// uniform returns a number in [0, 1) from the configured randomness.
func (a *Probabilistic) uniform() float64 {
	if a.rnd == nil {
		return rand.Float64()
	}
	a.mu.Lock()
	x := a.rnd.Uint64()
	a.mu.Unlock()
	return float64(x>>11) * 0x1p-53
}
