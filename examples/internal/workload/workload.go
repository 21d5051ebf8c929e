package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ErrUnknown is returned by ByName for a workload name that does not exist.
var ErrUnknown = errors.New("workload: unknown workload")

// Workload is one traffic mix of the published experiment.
type Workload struct {
	Name          string
	InputMean     float64   // mean prompt tokens
	OutputMean    float64   // mean output tokens
	CriticalShare float64   // fraction of requests in the critical band (the rest are sheddable)
	QPS           []float64 // the published request rates
}

// The three workloads of the article, with the QPS points it reports.
var (
	Codegen   = Workload{Name: "codegen", InputMean: 1176, OutputMean: 195, CriticalShare: 0.3, QPS: []float64{4, 10, 16, 24}}
	Chat      = Workload{Name: "chat", InputMean: 39, OutputMean: 300, CriticalShare: 0.3, QPS: []float64{20, 40, 60, 80}}
	Reasoning = Workload{Name: "reasoning", InputMean: 780, OutputMean: 6200, CriticalShare: 0.5, QPS: []float64{0.2, 0.4, 0.7, 1.2}}
)

// All returns the workloads in the order the simulator reports them.
func All() []Workload { return []Workload{Codegen, Chat, Reasoning} }

// ByName returns the workload with the given name.
func ByName(name string) (Workload, error) {
	for _, w := range All() {
		if w.Name == name {
			return w, nil
		}
	}
	return Workload{}, fmt.Errorf("%w %q (want codegen, chat or reasoning)", ErrUnknown, name)
}

// Arrival is one request of the stream.
type Arrival struct {
	At       time.Duration // since the start of the run
	Critical bool
	Input    int
	Output   int
}

// DefaultCV is the coefficient of variation of the token lengths (std/mean).
const DefaultCV = 0.5

// MaxModelLen bounds prompt + output (Qwen3-14B's native context, 40,960).
const MaxModelLen = 40960

// Generator draws a Poisson stream of arrivals: exponential inter-arrival times at rate
// QPS, a Bernoulli class with the workload's critical share, and prompt and output lengths
// from log-normal distributions with the workload's means and coefficient of variation
// CV, each clamped to [1, 4·mean] (and prompt+output to MaxModelLen). It has its own PCG
// source, so two generators with the same seeds produce the same stream.
type Generator struct {
	w        Workload
	qps      float64
	rng      *rand.Rand
	t        float64 // seconds
	inMu     float64
	inSigma  float64
	outMu    float64
	outSigma float64
}

// NewGenerator returns a generator of w at qps requests/s (must be > 0) with coefficient
// of variation cv (0 = constant lengths), seeded by (seed, stream).
func NewGenerator(w Workload, qps, cv float64, seed, stream uint64) (*Generator, error) {
	if !(qps > 0) || math.IsInf(qps, 0) {
		return nil, fmt.Errorf("workload: qps %v must be > 0 and finite", qps)
	}
	if !(cv >= 0) || math.IsInf(cv, 0) {
		return nil, fmt.Errorf("workload: cv %v must be >= 0 and finite", cv)
	}
	if !(w.InputMean >= 1) || !(w.OutputMean >= 1) {
		return nil, fmt.Errorf("workload: %s: InputMean and OutputMean must be >= 1", w.Name)
	}
	if !(w.CriticalShare >= 0 && w.CriticalShare <= 1) {
		return nil, fmt.Errorf("workload: %s: CriticalShare %v must be in [0, 1]", w.Name, w.CriticalShare)
	}
	s2 := math.Log1p(cv * cv)
	return &Generator{
		w: w, qps: qps,
		rng:      rand.New(rand.NewPCG(seed, stream)),
		inMu:     math.Log(w.InputMean) - s2/2,
		inSigma:  math.Sqrt(s2),
		outMu:    math.Log(w.OutputMean) - s2/2,
		outSigma: math.Sqrt(s2),
	}, nil
}

func (g *Generator) length(mu, sigma, mean float64) int {
	v := math.Round(math.Exp(mu + sigma*g.rng.NormFloat64()))
	// Clamp in float64: 4·mean (or a sample) of a large custom mean does
	// not fit an int. Capping at MaxModelLen−1 leaves the other length at
	// least 1 when Next trims the pair to MaxModelLen.
	return int(min(max(v, 1), 4*mean, MaxModelLen-1))
}

// Next returns the next arrival.
func (g *Generator) Next() Arrival {
	g.t += g.rng.ExpFloat64() / g.qps
	a := Arrival{
		At:       time.Duration(math.Round(g.t * 1e9)),
		Critical: g.rng.Float64() < g.w.CriticalShare,
		Input:    g.length(g.inMu, g.inSigma, g.w.InputMean),
		Output:   g.length(g.outMu, g.outSigma, g.w.OutputMean),
	}
	if a.Input+a.Output > MaxModelLen {
		a.Output = MaxModelLen - a.Input
	}
	return a
}
