package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flowgate/flowgate/examples/internal/cluster"
)

// job is one experiment in output order.
type job struct {
	cfg   cluster.Config
	label string // the row's name when it is not cfg.Policy ("<policy>+bp")
	note  string // what else sets the run apart, for the progress (the sweep's cell)
}

// policiesRun is the policies of the run in output order, the floor first.
func (o options) policiesRun() []string {
	var ps []string
	if o.floor {
		ps = append(ps, cluster.Floor)
	}
	ps = append(ps, o.policies...)
	for _, p := range o.bpRows {
		ps = append(ps, p+BPSuffix)
	}
	for _, p := range o.evictRows {
		ps = append(ps, p+EvictSuffix)
	}
	return ps
}

// jobs lists the experiments in output order: workload, QPS, policy, seed.
func (o options) jobs() []job {
	ps := o.points
	if ps == nil {
		for _, w := range o.workloads {
			qs := o.qps
			if qs == nil {
				qs = w.QPS
			}
			for _, q := range qs {
				ps = append(ps, sweepPoint{w, q})
			}
		}
	}
	var js []job
	for _, pt := range ps {
		for _, p := range o.policiesRun() {
			pol, evict := strings.CutSuffix(p, EvictSuffix)
			pol, bp := strings.CutSuffix(pol, BPSuffix)
			for k := range o.seeds {
				j := job{cfg: o.config(pt.w, pt.qps, pol, o.seed+uint64(k))}
				if bp {
					j.cfg.BackendPriority, j.label = true, p
				}
				if evict {
					j.cfg.Evict, j.label = true, p
				}
				js = append(js, j)
			}
		}
	}
	return js
}

// name is the job's variant as the progress shows it: the row ("<policy>+bp" for a
// run with backend priority), then any note.
func (j job) name() string {
	n := j.cfg.Policy
	if j.label != "" {
		n = j.label
	}
	if j.cfg.BackendPriority && !strings.Contains(n, BPSuffix) {
		n += BPSuffix
	}
	if j.note != "" {
		n += " (" + j.note + ")"
	}
	return n
}

// runJobs runs the experiments on up to parallel goroutines. Each experiment is
// self-contained and deterministic, and results are stored by index, so the output
// does not depend on the parallelism or the scheduling. Progress and the wall time go
// to stderr unless quiet: one line per experiment naming its variant, with an
// estimate of the time left (the mean wall time per finished experiment so far).
func runJobs(js []job, parallel int, quiet bool, stderr io.Writer) ([]cluster.Result, error) {
	if parallel == 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	res := make([]cluster.Result, len(js))
	errs := make([]error, len(js))
	start := time.Now()
	var mu sync.Mutex
	done := 0
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, len(js)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				res[i], errs[i] = cluster.Run(js[i].cfg)
				if js[i].label != "" {
					res[i].Policy = js[i].label
				}
				if !quiet {
					mu.Lock()
					done++
					c := js[i].cfg
					el := time.Since(start)
					eta := time.Duration(float64(el) / float64(done) * float64(len(js)-done))
					fmt.Fprintf(stderr, "[%d/%d] %s@%g %s seed %d: %v; ETA %v\n", done, len(js), c.Workload.Name, c.QPS, js[i].name(), c.Seed,
						time.Since(t0).Round(time.Millisecond), eta.Round(time.Second))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range js {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if !quiet {
		fmt.Fprintf(stderr, "%d experiments in %v wall clock (process CPU so far %v, GOMAXPROCS %d)\n", len(js),
			time.Since(start).Round(time.Millisecond), cpuTime().Round(time.Millisecond), runtime.GOMAXPROCS(0))
	}
	return res, nil
}

func runAll(o options, stderr io.Writer) ([]cluster.Result, error) {
	return runJobs(o.jobs(), o.parallel, o.quiet, stderr)
}

// jsonRecord is one JSON Lines object: one experiment (workload, qps, policy, seed).
type jsonRecord struct {
	Workload          string  `json:"workload"`
	QPS               float64 `json:"qps"`
	Policy            string  `json:"policy"`
	Seed              uint64  `json:"seed"`
	BackendPriority   bool    `json:"backend_priority"`
	Requests          int     `json:"requests"`
	Completed         int     `json:"completed"`
	Rejected          int     `json:"rejected"`
	Shed              int     `json:"shed,omitempty"`
	BCriticalTTFTp99  float64 `json:"b_critical_ttft_p99_ms,omitempty"`
	BSheddableTTFTp99 float64 `json:"b_sheddable_ttft_p99_ms,omitempty"`
	ATokenShare       float64 `json:"a_token_share,omitempty"`
	BSheddableWaitp99 float64 `json:"b_sheddable_wait_p99_ms,omitempty"`
	CriticalTTFTp50   float64 `json:"critical_ttft_p50_ms"`
	CriticalTTFTp99   float64 `json:"critical_ttft_p99_ms"`
	CriticalE2Ep99    float64 `json:"critical_e2e_p99_ms"`
	SheddableTTFTp99  float64 `json:"sheddable_ttft_p99_ms"`
	SheddableE2Ep99   float64 `json:"sheddable_e2e_p99_ms"`
	Throughput        float64 `json:"throughput_rps"`
	TotalThroughput   float64 `json:"total_throughput_rps"`
	Goodput           float64 `json:"goodput_rps"`
	CriticalTimeouts  int     `json:"critical_timeouts"`
	SheddableTimeouts int     `json:"sheddable_timeouts"`
	ShareDeadZone     float64 `json:"share_dead_zone"`
	ShareProportional float64 `json:"share_proportional"`
	ShareHardBlock    float64 `json:"share_hard_block"`
	// Eviction rows only (-evict-rows).
	Evict           bool    `json:"evict,omitempty"`
	Evictions       *int    `json:"evictions,omitempty"`
	EvictionsPerMin float64 `json:"evictions_per_min,omitempty"`
	Requeued        int     `json:"requeued,omitempty"`
	Cut             int     `json:"cut,omitempty"`
	Immune          int     `json:"immune,omitempty"`
	IdleVictims     int     `json:"idle_victims,omitempty"`
	WastedPrefill   int64   `json:"wasted_prefill_tokens,omitempty"`
	WastedDecode    int64   `json:"wasted_decode_tokens,omitempty"`
	WastedShare     float64 `json:"wasted_share,omitempty"`
}

func writeJSON(w io.Writer, rs []cluster.Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		rec := jsonRecord{
			Workload: r.Workload, QPS: r.QPS, Policy: r.Policy, Seed: r.Seed, BackendPriority: r.BackendPriority,
			Requests:          r.Critical.Requests + r.Sheddable.Requests,
			Completed:         r.Critical.Completed + r.Sheddable.Completed,
			Rejected:          r.Critical.Rejected + r.Sheddable.Rejected,
			Shed:              r.Critical.Shed + r.Sheddable.Shed,
			BCriticalTTFTp99:  round3(r.TenantBCriticalTTFTp99),
			BSheddableTTFTp99: round3(r.TenantBSheddableTTFTp99),
			ATokenShare:       round3(r.TenantATokenShare),
			BSheddableWaitp99: round3(r.TenantBSheddableWaitp99),
			CriticalTTFTp50:   round3(r.Critical.TTFTp50),
			CriticalTTFTp99:   round3(r.Critical.TTFTp99),
			CriticalE2Ep99:    round3(r.Critical.E2Ep99),
			SheddableTTFTp99:  round3(r.Sheddable.TTFTp99),
			SheddableE2Ep99:   round3(r.Sheddable.E2Ep99),
			Throughput:        round3(r.Critical.Throughput),
			TotalThroughput:   round3(r.TotalThroughput),
			Goodput:           round3(r.TotalGoodput),
			CriticalTimeouts:  r.Critical.Timeouts,
			SheddableTimeouts: r.Sheddable.Timeouts,
			ShareDeadZone:     round3(r.ShareDeadZone), ShareProportional: round3(r.ShareProportional),
			ShareHardBlock: round3(r.ShareHardBlock),
		}
		if r.Evict {
			n := r.Evictions
			rec.Evict, rec.Evictions, rec.EvictionsPerMin = true, &n, round3(r.EvictionsPerMin)
			rec.Requeued, rec.Cut, rec.Immune, rec.IdleVictims = r.Requeued, r.Cut, r.Immune, r.IdleVictims
			rec.WastedPrefill, rec.WastedDecode, rec.WastedShare = r.WastedPrefill, r.WastedDecode, round3(r.WastedShare)
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return nil
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// fmtMs prints a latency in ms below a second and in s above.
func fmtMs(ms float64) string {
	switch {
	case ms >= 100000:
		return fmt.Sprintf("%.0f s", ms/1000)
	case ms >= 1000:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// change is (b − a)/a in percent.
func change(a, b float64) (float64, bool) {
	if a == 0 {
		return 0, false
	}
	return (b - a) / a * 100, true
}

func fmtChange(a, b float64) string {
	c, ok := change(a, b)
	if !ok {
		return "n/a"
	}
	if math.Abs(c) < 0.05 {
		c = 0 // no "-0.0 %"
	}
	return fmt.Sprintf("%+.1f %%", c)
}

// stat is a figure over seeds: median (mean of the two middle values for an even
// count), minimum and maximum.
type stat struct{ med, lo, hi float64 }

func statOf(xs []float64) stat {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return stat{}
	}
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return stat{m, s[0], s[n-1]}
}

// fmtStat formats a stat with f: the median, and the range when there are several
// seeds and they differ.
func fmtStat(st stat, f func(float64) string, seeds int) string {
	if seeds <= 1 || st.lo == st.hi {
		return f(st.med)
	}
	return fmt.Sprintf("%s (%s–%s)", f(st.med), f(st.lo), f(st.hi))
}

// point is one (workload, QPS) with its results per policy (one per seed).
type point struct {
	workload string
	qps      float64
	by       map[string][]*cluster.Result
}

// points groups the results, in output order.
func points(rs []cluster.Result) []point {
	var ps []point
	for i := range rs {
		r := &rs[i]
		if n := len(ps); n == 0 || ps[n-1].workload != r.Workload || ps[n-1].qps != r.QPS {
			ps = append(ps, point{r.Workload, r.QPS, map[string][]*cluster.Result{}})
		}
		p := &ps[len(ps)-1]
		p.by[r.Policy] = append(p.by[r.Policy], r)
	}
	return ps
}

// figure is one reported quantity of a result.
type figure struct {
	name string
	get  func(*cluster.Result) float64
	fmt  func(float64) string
}

func f3(x float64) string   { return fmt.Sprintf("%.3f", x) }
func f2(x float64) string   { return fmt.Sprintf("%.2f", x) }
func f1(x float64) string   { return fmt.Sprintf("%.1f", x) }
func fint(x float64) string { return fmt.Sprintf("%.0f", x) }

var figures = []figure{
	{"critical TTFT p50", func(r *cluster.Result) float64 { return r.Critical.TTFTp50 }, fmtMs},
	{"critical TTFT p99", func(r *cluster.Result) float64 { return r.Critical.TTFTp99 }, fmtMs},
	{"critical E2E p99", func(r *cluster.Result) float64 { return r.Critical.E2Ep99 }, fmtMs},
	{"sheddable TTFT p99", func(r *cluster.Result) float64 { return r.Sheddable.TTFTp99 }, fmtMs},
	{"sheddable E2E p99", func(r *cluster.Result) float64 { return r.Sheddable.E2Ep99 }, fmtMs},
	{"critical throughput (req/s)", func(r *cluster.Result) float64 { return r.Critical.Throughput }, f3},
	{"total throughput (req/s)", func(r *cluster.Result) float64 { return r.TotalThroughput }, f3},
	{"goodput (req/s)", func(r *cluster.Result) float64 { return r.TotalGoodput }, f3},
	{"critical timeouts", func(r *cluster.Result) float64 { return float64(r.Critical.Timeouts) }, fint},
	{"sheddable timeouts", func(r *cluster.Result) float64 { return float64(r.Sheddable.Timeouts) }, fint},
	{"rejected", func(r *cluster.Result) float64 { return float64(r.Critical.Rejected + r.Sheddable.Rejected) }, fint},
	{"mean saturation", func(r *cluster.Result) float64 { return r.MeanSaturation }, f2},
	{"preemptions", func(r *cluster.Result) float64 { return float64(r.Preemptions) }, fint},
	{"evictions/min", func(r *cluster.Result) float64 { return r.EvictionsPerMin }, f1},
	{"wasted tokens %", func(r *cluster.Result) float64 { return r.WastedShare * 100 }, f1},
	{"idle victims", func(r *cluster.Result) float64 { return float64(r.IdleVictims) }, fint},
	{"cut streams", func(r *cluster.Result) float64 { return float64(r.Cut) }, fint},
}

func statFor(rs []*cluster.Result, get func(*cluster.Result) float64) stat {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = get(r)
	}
	return statOf(xs)
}

// comparisons are the changes the headline table quotes: (treatment, baseline).
var comparisons = [][2]string{
	{cluster.LLMDSoftReflective, cluster.None},
	{cluster.LLMDSoftReflective, cluster.LLMDStatic},
	{cluster.SoftReflective, cluster.None},
	{cluster.SoftReflective, cluster.LLMDStatic},
	{cluster.SoftReflective + EvictSuffix, cluster.SoftReflective},
	{cluster.None + EvictSuffix, cluster.None},
}

func writeTable(w io.Writer, o options, rs []cluster.Result) error {
	ps := points(rs)
	pols := o.policiesRun()
	pf := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	ttft := figures[1]
	var cmps [][2]string
	for _, c := range comparisons {
		if slices.Contains(pols, c[0]) && slices.Contains(pols, c[1]) {
			cmps = append(cmps, c)
		}
	}
	bound := slices.Contains(pols, cluster.Floor) && slices.Contains(pols, cluster.None)
	pf("Critical TTFT p99, median (min–max) over %d seed(s); change = (treatment − baseline)/baseline of the medians, negative is better.", o.seeds)
	if bound {
		pf(" Step-time bound: 2 steps at the batch that keeps %.0f %% of none's throughput, from the step lengths measured in the floor and none runs (the p99 no gateway can beat at that throughput; – where none does not need larger steps).", BoundThroughput*100)
	}
	pf("\n\n| workload | QPS |")
	for _, p := range pols {
		pf(" %s |", p)
		if p == cluster.Floor && bound {
			pf(" step-time bound |")
		}
	}
	for _, c := range cmps {
		pf(" %s vs %s |", c[0], c[1])
	}
	pf("\n| --- | ---: |")
	for range len(pols) + len(cmps) {
		pf(" ---: |")
	}
	if bound {
		pf(" ---: |")
	}
	pf("\n")
	for _, pt := range ps {
		pf("| %s | %g |", pt.workload, pt.qps)
		for _, p := range pols {
			pf(" %s |", fmtStat(statFor(pt.by[p], ttft.get), ttft.fmt, o.seeds))
			if p == cluster.Floor && bound {
				if bs, ok := stepBounds(pt); ok {
					pf(" %s |", fmtStat(statOf(bs), fmtMs, len(bs)))
				} else {
					pf(" – |")
				}
			}
		}
		for _, c := range cmps {
			pf(" %s |", fmtChange(statFor(pt.by[c[1]], ttft.get).med, statFor(pt.by[c[0]], ttft.get).med))
		}
		pf("\n")
	}
	pf("\nEvery figure per policy, median (min–max) over %d seed(s). TTFT of a request whose client gave up before its first token counts as the client timeout (a lower bound); E2E is over completed requests.\n\n", o.seeds)
	pf("| workload | QPS | policy |")
	for _, f := range figures {
		pf(" %s |", f.name)
	}
	pf("\n| --- | ---: | --- |")
	for range figures {
		pf(" ---: |")
	}
	pf("\n")
	for _, pt := range ps {
		for _, p := range pols {
			pf("| %s | %g | %s |", pt.workload, pt.qps, p)
			for _, f := range figures {
				pf(" %s |", fmtStat(statFor(pt.by[p], f.get), f.fmt, o.seeds))
			}
			pf("\n")
		}
	}
	return nil
}
