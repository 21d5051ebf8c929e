package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// sweepTicks, sweepBursts: the default grid of the defaults sweep (Tick × Burst × credit).
var (
	sweepTicks  = []time.Duration{time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond}
	sweepBursts = []int{1, 4, 32}
)

func parseTicks(s string) ([]time.Duration, error) {
	var ts []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("-sweep-ticks: %q is not a positive duration", f)
		}
		ts = append(ts, d)
	}
	return ts, nil
}

func parseBursts(s string) ([]int, error) {
	var bs []int
	for _, f := range strings.Split(s, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || b < 1 {
			return nil, fmt.Errorf("-sweep-bursts: %q is not a positive integer", f)
		}
		bs = append(bs, b)
	}
	return bs, nil
}

type sweepPoint struct {
	w   workload.Workload
	qps float64
}

func parsePoints(s string) ([]sweepPoint, error) {
	var ps []sweepPoint
	for _, f := range strings.Split(s, ",") {
		name, q, ok := strings.Cut(strings.TrimSpace(f), ":")
		if !ok {
			return nil, fmt.Errorf("-sweep-points: %q is not workload:qps", f)
		}
		w, err := workload.ByName(name)
		if err != nil {
			return nil, fmt.Errorf("-sweep-points: %w", err)
		}
		v, err := strconv.ParseFloat(q, 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("-sweep-points: %q is not a positive rate", q)
		}
		ps = append(ps, sweepPoint{w, v})
	}
	return ps, nil
}

// runSweep runs, for every (tick, burst, credit) cell, the static baseline and
// soft-reflective at each sweep point, and prints the change in critical TTFT p99 per
// point plus the worst |change| on the no-op points and the rejections.
func runSweep(o options, w, stderr io.Writer) error {
	pts, err := parsePoints(o.sweepQPS)
	if err != nil {
		return err
	}
	ticks, bursts := sweepTicks, sweepBursts
	if o.sweepTicks != "" {
		if ticks, err = parseTicks(o.sweepTicks); err != nil {
			return err
		}
	}
	if o.sweepBursts != "" {
		if bursts, err = parseBursts(o.sweepBursts); err != nil {
			return err
		}
	}
	type cell struct {
		tick   time.Duration
		burst  int
		credit bool
	}
	var cells []cell
	for _, c := range []bool{false, true} {
		for _, t := range ticks {
			for _, b := range bursts {
				cells = append(cells, cell{t, b, c})
			}
		}
	}
	var js []job
	for _, c := range cells {
		for _, p := range pts {
			for _, pol := range []string{cluster.Static, cluster.SoftReflective} {
				oc := o
				oc.tick, oc.burst, oc.credit = c.tick, c.burst, c.credit
				js = append(js, job{cfg: oc.config(p.w, p.qps, pol, o.seed),
					note: fmt.Sprintf("tick %v, burst %d, credit %v", c.tick, c.burst, c.credit)})
			}
		}
	}
	rs, err := runJobs(js, o.parallel, o.quiet, stderr)
	if err != nil {
		return err
	}
	pf := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	pf("Critical TTFT p99: static → soft-reflective (change) per point; rate cap of a band at Every 2 = Burst/(2·Tick).\n\n")
	pf("| tick | burst | credit | cap @Every 2 (req/s) |")
	for _, p := range pts {
		pf(" %s@%g |", p.w.Name, p.qps)
	}
	pf(" rejected |\n|---|---:|---|---:|")
	for range pts {
		pf("---|")
	}
	pf("---:|\n")
	i := 0
	for _, c := range cells {
		pf("| %v | %d | %v | %.0f |", c.tick, c.burst, c.credit, float64(c.burst)/(2*c.tick.Seconds()))
		rej := 0
		for range pts {
			a, b := rs[i], rs[i+1]
			i += 2
			pf(" %s → %s (%s) |", fmtMs(a.Critical.TTFTp99), fmtMs(b.Critical.TTFTp99), fmtChange(a.Critical.TTFTp99, b.Critical.TTFTp99))
			rej += a.Critical.Rejected + a.Sheddable.Rejected + b.Critical.Rejected + b.Sheddable.Rejected
		}
		pf(" %d |\n", rej)
	}
	return nil
}
