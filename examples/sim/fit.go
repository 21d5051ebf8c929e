package main

import (
	"fmt"
	"io"
	"math"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// published is one figure of the hardware experiment (2 × H100, Qwen3-14B, llm-d's
// flow controller; CALIBRATION.md): an absolute critical TTFT p99 of the baseline
// (llm-d static 1.0) or the treatment (llm-d soft-reflective), or the change between
// them, or a neutral point (no change, well under a second).
type published struct {
	w      workload.Workload
	qps    float64
	metric string // "TTFT p99 baseline", "TTFT p99 treatment", "TTFT p99 change", "E2E p99 change", "throughput change", "neutral"
	value  float64
}

// publishedPoints are every published figure the fit uses.
var publishedPoints = []published{
	{workload.Codegen, 16, "TTFT p99 baseline", 13600},
	{workload.Codegen, 16, "TTFT p99 treatment", 263},
	{workload.Codegen, 16, "TTFT p99 change", -96.7},
	{workload.Reasoning, 0.7, "TTFT p99 baseline", 330000},
	{workload.Reasoning, 0.7, "TTFT p99 treatment", 16000},
	{workload.Reasoning, 0.7, "TTFT p99 change", -91.2},
	{workload.Reasoning, 0.7, "E2E p99 change", -48.5},
	{workload.Reasoning, 0.7, "throughput change", 64.4},
	{workload.Chat, 40, "TTFT p99 change", 18},
	{workload.Chat, 60, "TTFT p99 change", 31},
	{workload.Chat, 80, "TTFT p99 change", -22.4},
	{workload.Chat, 80, "E2E p99 change", -14.6},
	{workload.Codegen, 4, "neutral", 0},
	{workload.Codegen, 10, "neutral", 0},
	{workload.Chat, 20, "neutral", 0},
	{workload.Reasoning, 0.2, "neutral", 0},
}

// runFit runs llm-d parity (baseline llmd-static, treatment llmd-soft-reflective) at
// every published point over the seeds and prints, per published figure, the hardware
// value, the model's (median over seeds, min–max), the residual and the loss the
// calibration minimised:
//
//	absolute TTFT p99:  residual = log10(model / hardware), loss term = residual²
//	change in %:        residual = model − hardware (points), loss term = (residual/100)²
//	neutral:            residual = the change in %, loss term = (residual/100)², plus
//	                    (log10(baseline / 1 s))² when the baseline exceeds a second
func runFit(o options, w, stderr io.Writer) error {
	type key struct {
		w   string
		qps float64
	}
	var js []job
	seen := map[key]bool{}
	for _, p := range publishedPoints {
		k := key{p.w.Name, p.qps}
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, pol := range []string{cluster.LLMDStatic, cluster.LLMDSoftReflective} {
			for s := range o.seeds {
				js = append(js, job{cfg: o.config(p.w, p.qps, pol, o.seed+uint64(s))})
			}
		}
	}
	rs, err := runJobs(js, o.parallel, o.quiet, stderr)
	if err != nil {
		return err
	}
	by := map[key]point{}
	for _, pt := range points(rs) {
		by[key{pt.workload, pt.qps}] = pt
	}
	ttft := func(r *cluster.Result) float64 { return r.Critical.TTFTp99 }
	e2e := func(r *cluster.Result) float64 { return r.Critical.E2Ep99 }
	thr := func(r *cluster.Result) float64 { return r.Critical.Throughput }
	pf := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	st := o.step
	pf("Fit of the step model (base %v, prefill %g ns/token, decode %g ns/token, context %g ns/token, per admitted request %v) to the published points; llm-d parity, %d seed(s), client timeout %v.\n\n",
		st.Base, st.PrefillNs, st.DecodeNs, st.ContextNs, st.PerAdmit, o.seeds, o.timeout)
	pf("| point | metric | hardware | model: median (min–max) | residual |\n| --- | --- | ---: | ---: | ---: |\n")
	loss := 0.0
	for _, p := range publishedPoints {
		pt := by[key{p.w.Name, p.qps}]
		base, treat := pt.by[cluster.LLMDStatic], pt.by[cluster.LLMDSoftReflective]
		// changePerSeed is the change of each seed's treatment against its baseline.
		changes := func(get func(*cluster.Result) float64) stat {
			xs := make([]float64, len(base))
			for i := range base {
				xs[i], _ = change(get(base[i]), get(treat[i]))
			}
			return statOf(xs)
		}
		pct := func(x float64) string { return fmt.Sprintf("%+.1f %%", x) }
		var hw, model, res string
		switch p.metric {
		case "TTFT p99 baseline", "TTFT p99 treatment":
			rs := base
			if p.metric == "TTFT p99 treatment" {
				rs = treat
			}
			s := statFor(rs, ttft)
			r := math.Log10(s.med / p.value)
			loss += r * r
			hw, model, res = fmtMs(p.value), fmtStat(s, fmtMs, o.seeds), fmt.Sprintf("×%.2f (log10 %+.2f)", s.med/p.value, r)
		case "neutral":
			s := changes(ttft)
			b := statFor(base, ttft)
			r := s.med / 100
			loss += r * r
			if b.med > 1000 {
				l := math.Log10(b.med / 1000)
				loss += l * l
			}
			hw = "no change, < 1 s"
			model = fmt.Sprintf("%s; baseline %s", fmtStat(s, pct, o.seeds), fmtStat(b, fmtMs, o.seeds))
			res = fmt.Sprintf("%+.1f pp", s.med)
		default:
			get := ttft
			switch p.metric {
			case "E2E p99 change":
				get = e2e
			case "throughput change":
				get = thr
			}
			s := changes(get)
			r := s.med - p.value
			loss += (r / 100) * (r / 100)
			hw, model, res = pct(p.value), fmtStat(s, pct, o.seeds), fmt.Sprintf("%+.1f pp", r)
		}
		pf("| %s@%g | %s | %s | %s | %s |\n", p.w.Name, p.qps, p.metric, hw, model, res)
	}
	pf("\nloss %.4f\n", loss)
	return nil
}
