package main

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/flowgate/flowgate/examples/internal/cluster"
)

// writeSVG draws, in the spirit of the article's chart, one panel per workload and per
// QPS point three bars: the improvement of soft-reflective over static in critical
// TTFT p99, E2E p99 (both −change) and throughput (+change). Above zero is better.
// Bars are clipped at ±100 %; the label gives the exact value. A dashed line marks the
// first QPS point at which the sheddable band spent over 5 % of its ticks gated.
func writeSVG(w io.Writer, rs []cluster.Result) error {
	ps := pairs(rs)
	var panels [][]pair
	for _, p := range ps {
		if p.static == nil || p.soft == nil {
			return fmt.Errorf("-plot needs -policy both")
		}
		if n := len(panels); n > 0 && panels[n-1][0].static.Workload == p.static.Workload {
			panels[n-1] = append(panels[n-1], p)
			continue
		}
		panels = append(panels, []pair{p})
	}
	const (
		width  = 960.0
		panelH = 250.0
		top    = 60.0
		left   = 70.0
		right  = 20.0
		plotH  = 170.0
	)
	colors := [3]string{"#1f3b73", "#6fa8dc", "#2a9d8f"}
	names := [3]string{"TTFT p99", "E2E p99", "throughput"}
	height := top + panelH*float64(len(panels)) + 20
	var b strings.Builder
	f := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	f(`<text x="%.0f" y="22" font-size="16" font-weight="bold">soft-reflective vs static ceiling: improvement for the critical band (%%, above zero is better)</text>`+"\n", left)
	for i, n := range names {
		x := left + float64(i)*140
		f(`<rect x="%.0f" y="34" width="12" height="12" fill="%s"/><text x="%.0f" y="45">%s</text>`+"\n", x, colors[i], x+16, n)
	}
	f(`<text x="%.0f" y="45">dashed: proportional gating begins</text>`+"\n", left+3*140)
	for pi, panel := range panels {
		y0 := top + panelH*float64(pi)
		zero := y0 + 30 + plotH/2
		scale := plotH / 2 / 100
		f(`<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", left, y0+20, panel[0].static.Workload)
		for _, t := range []float64{-100, -50, 0, 50, 100} {
			y := zero - t*scale
			stroke := "#dddddd"
			if t == 0 {
				stroke = "#444444"
			}
			f(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="%s"/>`+"\n", left, y, width-right, y, stroke)
			f(`<text x="%.0f" y="%.1f" text-anchor="end">%+.0f%%</text>`+"\n", left-6, y+4, t)
		}
		groupW := (width - left - right) / float64(len(panel))
		barW := groupW / 5
		marked := false
		for gi, p := range panel {
			gx := left + groupW*float64(gi)
			if !marked && p.soft.ShareDeadZone < 0.95 {
				marked = true
				f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888888" stroke-dasharray="5,4"/>`+"\n", gx, y0+28, gx, zero+plotH/2)
			}
			vals := [3]float64{}
			ok := [3]bool{}
			var c float64
			c, ok[0] = change(p.static.Critical.TTFTp99, p.soft.Critical.TTFTp99)
			vals[0] = -c
			c, ok[1] = change(p.static.Critical.E2Ep99, p.soft.Critical.E2Ep99)
			vals[1] = -c
			vals[2], ok[2] = change(p.static.Critical.Throughput, p.soft.Critical.Throughput)
			for k := range 3 {
				if !ok[k] {
					continue
				}
				v := math.Max(-100, math.Min(100, vals[k]))
				x := gx + barW*(1+float64(k))
				y, h := zero-v*scale, math.Abs(v*scale)
				if v < 0 {
					y = zero
				}
				f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y, barW*0.9, h, colors[k])
				ly := zero - v*scale - 4
				if v < 0 {
					ly = zero - v*scale + 12
				}
				f(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", x+barW*0.45, ly, signed(vals[k]))
			}
			f(`<text x="%.1f" y="%.1f" text-anchor="middle">%g QPS</text>`+"\n", gx+groupW/2, zero+plotH/2+16, p.static.QPS)
		}
	}
	f("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// signed formats a percentage rounded to an integer, without a "-0".
func signed(v float64) string {
	r := math.Round(v)
	if r == 0 {
		return "0"
	}
	return fmt.Sprintf("%+.0f", r)
}
