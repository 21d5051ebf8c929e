package main

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/flowgate/flowgate/examples/internal/cluster"
)

// policyColors gives each policy one colour in the chart.
var policyColors = map[string]string{
	cluster.Floor:              "#9e9e9e",
	cluster.None:               "#d62728",
	cluster.LLMDStatic:         "#ff7f0e",
	cluster.LLMDSoftReflective: "#bcbd22",
	cluster.Static:             "#1f77b4",
	cluster.SoftReflective:     "#2ca02c",
}

// writeSVG draws the simulation's absolute values, as the tables report them (lower is
// better): per workload two rows, critical TTFT p99 and sheddable TTFT p99 (the cost of
// protecting critical), and per QPS point one bar per policy at the median over seeds
// with a min–max whisker, on a log scale from 10 ms to 1,000 s.
func writeSVG(w io.Writer, o options, rs []cluster.Result) error {
	ps := points(rs)
	pols := o.policiesRun()
	var panels [][]point
	for _, p := range ps {
		if n := len(panels); n > 0 && panels[n-1][0].workload == p.workload {
			panels[n-1] = append(panels[n-1], p)
			continue
		}
		panels = append(panels, []point{p})
	}
	const (
		width = 1000.0
		rowH  = 170.0
		top   = 85.0
		left  = 80.0
		right = 20.0
		plotH = 120.0
		lo    = 1.0 // log10(10 ms)
		hi    = 6.0 // log10(1,000 s)
	)
	rows := []struct {
		name string
		get  func(*cluster.Result) float64
	}{
		{"critical TTFT p99", func(r *cluster.Result) float64 { return r.Critical.TTFTp99 }},
		{"sheddable TTFT p99 (cost)", func(r *cluster.Result) float64 { return r.Sheddable.TTFTp99 }},
	}
	height := top + rowH*float64(len(panels)*len(rows)) + 20
	var b strings.Builder
	f := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	f(`<text x="%.0f" y="22" font-size="16" font-weight="bold">SIMULATION (examples/sim), not hardware measurements</text>`+"\n", left)
	f(`<text x="%.0f" y="40">TTFT p99 per policy: median of %d seed(s), whisker min–max; log scale; lower is better</text>`+"\n", left, o.seeds)
	for i, p := range pols {
		x := left + float64(i)*150
		f(`<rect x="%.0f" y="50" width="12" height="12" fill="%s"/><text x="%.0f" y="61">%s</text>`+"\n", x, policyColors[p], x+16, p)
	}
	y := func(ms float64, y0 float64) float64 {
		v := math.Log10(math.Max(ms, 1))
		v = math.Max(lo, math.Min(hi, v))
		return y0 + plotH - (v-lo)/(hi-lo)*plotH
	}
	ri := 0
	for _, panel := range panels {
		for _, row := range rows {
			y0 := top + rowH*float64(ri) + 25
			ri++
			f(`<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s — %s</text>`+"\n", left, y0-8, panel[0].workload, row.name)
			for _, t := range []struct {
				ms    float64
				label string
			}{{10, "10 ms"}, {100, "100 ms"}, {1000, "1 s"}, {10000, "10 s"}, {100000, "100 s"}, {1000000, "1000 s"}} {
				yy := y(t.ms, y0)
				f(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, yy, width-right, yy)
				f(`<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, yy+4, t.label)
			}
			groupW := (width - left - right) / float64(len(panel))
			barW := groupW / float64(len(pols)+2)
			for gi, pt := range panel {
				gx := left + groupW*float64(gi)
				for k, p := range pols {
					rs := pt.by[p]
					if len(rs) == 0 {
						continue
					}
					if p == cluster.Floor && row.name != rows[0].name {
						continue // the floor has no sheddable traffic
					}
					st := statFor(rs, row.get)
					x := gx + barW*(1+float64(k))
					ym := y(st.med, y0)
					f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s@%g %s: %s</title></rect>`+"\n",
						x, ym, barW*0.85, y0+plotH-ym, policyColors[p], p, pt.workload, pt.qps, row.name, fmtStat(st, fmtMs, o.seeds))
					cx := x + barW*0.425
					f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222222"/>`+"\n", cx, y(st.lo, y0), cx, y(st.hi, y0))
				}
				f(`<text x="%.1f" y="%.1f" text-anchor="middle">%g QPS</text>`+"\n", gx+groupW/2, y0+plotH+15, pt.qps)
			}
		}
	}
	f("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
