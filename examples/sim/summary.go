package main

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// Limits of the summary's table: a newcomer reads it in a terminal.
const (
	summaryMaxColumns = 8
	summaryMaxWidth   = 120
	summaryWrap       = 100 // the sentences' line length
)

// displayName is a row's name in the summary: flowgate's shipped policy is "flowgate".
func displayName(row string) string {
	row, evict := strings.CutSuffix(row, EvictSuffix)
	pol, bp := strings.CutSuffix(row, BPSuffix)
	n, ok := map[string]string{
		cluster.LLMDStatic:           "llm-d static",
		cluster.LLMDSoftReflective:   "llm-d soft-refl.",
		cluster.LLMDPriorityHoldback: "llm-d holdback",
		cluster.Static:               "flowgate static",
		cluster.SoftReflective:       "flowgate",
		cluster.PriorityHoldback:     "flowgate holdback",
		cluster.StaticBlockCritical:  "static block-crit.",
	}[pol]
	if !ok {
		n = pol
	}
	if bp {
		n += BPSuffix
	}
	if evict {
		n += EvictSuffix
	}
	return n
}

// fmtRange prints min–max, the unit once when both share it.
func fmtRange(lo, hi float64) string {
	a, b := fmtMs(lo), fmtMs(hi)
	ua, ub := a[strings.LastIndexByte(a, ' '):], b[strings.LastIndexByte(b, ' '):]
	if ua == ub {
		a = strings.TrimSuffix(a, ua)
	}
	return a + "–" + b
}

// fmtDuration prints a run length the way a reader says it.
func fmtDuration(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.String()
}

// unitRE matches a word that is a unit and stays with the number before it.
var unitRE = regexp.MustCompile(`^(ms|s|min|%)[.,;:)]*$`)

// wrap breaks text into lines of at most width runes at spaces, never between a number
// and its unit, indenting every line but the first by indent spaces.
func wrap(text string, width, indent int) string {
	var words []string
	for _, f := range strings.Fields(text) {
		if n := len(words); n > 0 && unitRE.MatchString(f) {
			words[n-1] += " " + f
			continue
		}
		words = append(words, f)
	}
	var b strings.Builder
	n := 0
	for i, word := range words {
		l := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case n+1+l > width:
			b.WriteString("\n" + strings.Repeat(" ", indent))
			n = indent
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += l
	}
	return b.String() + "\n"
}

var (
	critTTFT  = func(r *cluster.Result) float64 { return r.Critical.TTFTp99 }
	shedTTFT  = func(r *cluster.Result) float64 { return r.Sheddable.TTFTp99 }
	totalThr  = func(r *cluster.Result) float64 { return r.TotalThroughput }
	critTOs   = func(r *cluster.Result) float64 { return float64(r.Critical.Timeouts) }
	shedTOs   = func(r *cluster.Result) float64 { return float64(r.Sheddable.Timeouts) }
	refusedOf = func(r *cluster.Result) int {
		return r.Critical.Rejected + r.Sheddable.Rejected + r.Critical.Shed + r.Sheddable.Shed
	}
)

// writeSummary prints the default report: a few sentences that answer whether flowgate
// protects critical traffic, at what price and against what (per point: critical TTFT
// p99 without flow control → with flowgate, beside llm-d and the floor; the sheddable
// price), then one table with a legend that explains every column.
func writeSummary(w io.Writer, o options, rs []cluster.Result) error {
	ps := points(rs)
	var pols, evictRows []string // the main table's rows; the eviction table's
	for _, p := range o.policiesRun() {
		if strings.HasSuffix(p, EvictSuffix) {
			evictRows = append(evictRows, p)
		} else {
			pols = append(pols, p)
		}
	}
	has := func(p string) bool { return slices.Contains(pols, p) }
	compare := has(cluster.None) && has(cluster.SoftReflective)
	var b strings.Builder
	para := func(format string, a ...any) { b.WriteString(wrap(fmt.Sprintf(format, a...), summaryWrap, 0)) }
	item := func(format string, a ...any) { b.WriteString(wrap(fmt.Sprintf(format, a...), summaryWrap, 2)) }

	seeds := fmt.Sprintf("the median of %d seeds", o.seeds)
	if o.seeds == 1 {
		seeds = fmt.Sprintf("seed %d", o.seed)
	}
	var shares []string
	for _, pt := range ps {
		wl, err := workload.ByName(pt.workload)
		sh := fmt.Sprintf("%s %.0f %%", pt.workload, wl.CriticalShare*100)
		if err == nil && !slices.Contains(shares, sh) {
			shares = append(shares, sh)
		}
	}
	gw := ""
	if o.gateways > 1 {
		gw = fmt.Sprintf(" behind %d gateways", o.gateways)
	}
	wiring := "wired as flowhttp.Gateway ships it"
	if o.plain {
		wiring = "in a plain flowcontrol.Controller over a saturation.Poller (-plain-controller)"
	}
	para("Does flowgate protect critical traffic, at what price, against what? A simulated pool of %d vLLM "+
		"replicas (Qwen3-14B on H100, step model fitted to llm-d's published runs)%s gets %s of Poisson "+
		"arrivals per point, critical share %s; every figure is %s. Critical TTFT p99 is the time to first "+
		"token that 99 %% of critical requests beat. flowgate is its soft-reflective policy %s; llm-d is "+
		"llm-d's flow controller modelled for parity; the floor is the same critical arrivals with no "+
		"sheddable traffic at all.",
		o.replicas, gw, fmtDuration(o.duration), strings.Join(shares, ", "), seeds, wiring)
	b.WriteString("\n")

	if compare {
		for _, pt := range ps {
			item("%s", pointSentences(pt, o.timeout))
		}
		b.WriteString("\n")
	}
	refused := 0
	for i := range rs {
		refused += refusedOf(&rs[i])
	}
	if refused == 0 {
		para("No request was rejected in any run: flow control orders and delays, it never refuses.")
	} else {
		para("%d requests were rejected or shed over all runs.", refused)
	}
	para("More: -full runs every published point, flowgate's static policy and rows where the replicas " +
		"schedule by priority (vLLM --scheduling-policy priority); " +
		"-format json writes every run; -h lists every knob; examples/sim/README.md explains the model and the results.")
	b.WriteString("\n")

	// The table.
	head := []string{"point"}
	for _, p := range pols {
		head = append(head, displayName(p))
	}
	if compare {
		head = append(head, "sheddable p99", "throughput")
	}
	rows := [][]string{head}
	for _, pt := range ps {
		row := []string{fmt.Sprintf("%s@%g", pt.workload, pt.qps)}
		for _, p := range pols {
			st := statFor(pt.by[p], critTTFT)
			cell := fmtMs(st.med)
			switch {
			case p == cluster.Floor && aboveFloor(pt):
				cell += "†"
			case p == cluster.SoftReflective && fmtMs(st.lo) != fmtMs(st.hi):
				cell += " [" + fmtRange(st.lo, st.hi) + "]"
			}
			row = append(row, cell)
		}
		if compare {
			no, fg := pt.by[cluster.None], pt.by[cluster.SoftReflective]
			row = append(row,
				fmtMs(statFor(no, shedTTFT).med)+" → "+fmtMs(statFor(fg, shedTTFT).med),
				fmtChange(statFor(no, totalThr).med, statFor(fg, totalThr).med))
		}
		rows = append(rows, row)
	}
	b.WriteString(formatColumns(rows))

	// The legend: every column.
	b.WriteString("\n")
	item("%s to %s: critical TTFT p99, %s; a client that got no first token within %s counts at %s.",
		displayName(pols[0]), displayName(pols[len(pols)-1]), seeds, fmtDuration(o.timeout), fmtDuration(o.timeout))
	if has(cluster.Floor) {
		item("floor: no sheddable traffic, so no gate can do better; † it needs less throughput than the load: " +
			"the step-time bound (2 steps at the batch that keeps 97 %% of none's throughput) is above it.")
	}
	if has(cluster.None) {
		item("none: no flow control, every request dispatched on arrival.")
	}
	if has(cluster.LLMDStatic) || has(cluster.LLMDSoftReflective) || has(cluster.LLMDPriorityHoldback) {
		item("llm-d static, llm-d soft-refl.: llm-d's flow controller modelled for parity, with its static " +
			"ceiling 1.0 (the published hardware baseline) or its soft-reflective ceiling.")
	}
	if has(cluster.SoftReflective) {
		item("flowgate: flowcontrol.SoftReflective %s; [min–max] over the seeds.", wiring)
	}
	if has(cluster.Static) {
		item("flowgate static: flowcontrol.NewStatic(1.0), the same wiring.")
	}
	if len(o.bpRows) > 0 {
		item("+bp: the replicas schedule by priority (vLLM --scheduling-policy priority).")
	}
	if compare {
		item("sheddable p99: the price in latency, sheddable TTFT p99 with none → with flowgate.")
		item("throughput: the price in work, flowgate's completed requests per second (both classes) against none's.")
	}
	if len(evictRows) > 0 {
		b.WriteString("\n")
		writeEvictSummary(&b, o, ps, evictRows, seeds)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Eviction figures of a result.
var (
	shedE2E     = func(r *cluster.Result) float64 { return r.Sheddable.E2Ep99 }
	evictPerMin = func(r *cluster.Result) float64 { return r.EvictionsPerMin }
	wastedPct   = func(r *cluster.Result) float64 { return r.WastedShare * 100 }
	cutOf       = func(r *cluster.Result) float64 { return float64(r.Cut) }
)

// writeEvictSummary prints the eviction rows (-evict-rows): a paragraph, one
// table of critical TTFT p99 with and without eviction, and the price of the
// first eviction row (flowgate's when it runs): evictions per minute, the
// victims' wasted work, the sheddable TTFT and E2E p99 and the throughput
// against none.
func writeEvictSummary(b *strings.Builder, o options, ps []point, rows []string, seeds string) {
	para := func(format string, a ...any) { b.WriteString(wrap(fmt.Sprintf(format, a...), summaryWrap, 0)) }
	item := func(format string, a ...any) { b.WriteString(wrap(fmt.Sprintf(format, a...), summaryWrap, 2)) }
	stream := "critical clients stream, sheddable ones do not (their response starts when it completes)"
	switch {
	case o.shedStream && !o.critNoStream:
		stream = "every client streams (-sheddable-stream)"
	case o.shedStream:
		stream = "sheddable clients stream, critical ones do not"
	case o.critNoStream:
		stream = "no client streams"
	}
	cut := "a started response is never cut"
	if o.eviction.Started {
		cut = "a started stream may be cut, and ends as failed (-evict-started)"
	}
	para("Taking work back (eviction, flowcontrol.Evictor): a gateway takes back sheddable requests released "+
		"to a replica before a critical one that has waited there for its first token past the stall bound, "+
		"while that replica's KV cache is full (eviction frees memory, not compute), and re-queues them "+
		"(without a gate: sends them again at once); %s; %s.", stream, cut)
	b.WriteString("\n")
	main := rows[0]
	base := strings.TrimSuffix(main, EvictSuffix) // the row main is compared with
	if !slices.Contains(o.policiesRun(), base) {
		base = ""
	}
	head := []string{"point"}
	if base != "" {
		head = append(head, displayName(base))
	}
	for _, p := range rows {
		head = append(head, displayName(p))
	}
	head = append(head, "evict/min", "wasted", "sheddable p99 TTFT/E2E", "throughput")
	table := [][]string{head}
	for _, pt := range ps {
		row := []string{fmt.Sprintf("%s@%g", pt.workload, pt.qps)}
		if base != "" {
			row = append(row, fmtMs(statFor(pt.by[base], critTTFT).med))
		}
		for _, p := range rows {
			st := statFor(pt.by[p], critTTFT)
			cell := fmtMs(st.med)
			if p == main && fmtMs(st.lo) != fmtMs(st.hi) {
				cell += " [" + fmtRange(st.lo, st.hi) + "]"
			}
			row = append(row, cell)
		}
		m := pt.by[main]
		row = append(row, fmt.Sprintf("%.1f", statFor(m, evictPerMin).med), fmt.Sprintf("%.1f %%", statFor(m, wastedPct).med),
			fmtMs(statFor(m, shedTTFT).med)+" / "+fmtMs(statFor(m, shedE2E).med),
			fmtChange(statFor(pt.by[cluster.None], totalThr).med, statFor(m, totalThr).med))
		table = append(table, row)
	}
	b.WriteString(formatColumns(table))
	b.WriteString("\n")
	item("critical TTFT p99, %s; +evict: the same row with eviction; [min–max] over the seeds.", seeds)
	item("evict/min to throughput: the price of %s: evictions per minute of arrivals; wasted, the prompt "+
		"tokens the victims had computed and the output tokens they had sampled, as a share of the tokens "+
		"served; sheddable TTFT and E2E p99; total throughput against none's.", displayName(main))
	if o.eviction.Started {
		n := 0.0
		for _, pt := range ps {
			n += statFor(pt.by[main], cutOf).med
		}
		item("cut streams (median per point, summed over the points): %.0f.", n)
	}
}

// aboveFloor reports whether the point's step-time bound (median over seeds) exceeds its
// floor: the floor's p99 needs smaller steps than none's throughput allows.
func aboveFloor(pt point) bool {
	bs, ok := stepBounds(pt)
	return ok && statOf(bs).med > statFor(pt.by[cluster.Floor], critTTFT).med
}

// pointSentences says, for one point, what flowgate did to critical TTFT p99 against no
// flow control, how far that is from the floor (or the step-time bound where the floor
// is out of reach), what llm-d did, and the sheddable price.
func pointSentences(pt point, timeout time.Duration) string {
	no, fg := pt.by[cluster.None], pt.by[cluster.SoftReflective]
	n, f := statFor(no, critTTFT), statFor(fg, critTTFT)
	var b strings.Builder
	pf := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	pf("%s@%g: critical TTFT p99 %s without flow control, %s with flowgate (%s)", pt.workload, pt.qps,
		fmtMs(n.med), fmtMs(f.med), fmtChange(n.med, f.med))
	if f.lo > 0 && f.hi >= 4*f.lo {
		pf(", from %s to %s across seeds", fmtMs(f.lo), fmtMs(f.hi))
	}
	if fl := pt.by[cluster.Floor]; len(fl) > 0 {
		floor := max(statFor(fl, critTTFT).med, 1e-9)
		if bs, ok := stepBounds(pt); ok && aboveFloor(pt) {
			bound := statOf(bs).med
			pf(": %.1f× the step-time bound, %s (the floor, %s, is out of reach at this throughput)",
				f.med/bound, fmtMs(bound), fmtMs(floor))
		} else {
			pf(": %.1f× the floor, %s", f.med/floor, fmtMs(floor))
			if floor > 1000 {
				pf(" (critical traffic alone overloads the pool)")
			}
		}
	}
	ls, lsr := pt.by[cluster.LLMDStatic], pt.by[cluster.LLMDSoftReflective]
	switch {
	case len(ls) > 0 && len(lsr) > 0:
		pf(". llm-d: %s static, %s soft-reflective", fmtMs(statFor(ls, critTTFT).med), fmtMs(statFor(lsr, critTTFT).med))
	case len(ls) > 0:
		pf(". llm-d static: %s", fmtMs(statFor(ls, critTTFT).med))
	case len(lsr) > 0:
		pf(". llm-d soft-reflective: %s", fmtMs(statFor(lsr, critTTFT).med))
	}
	pf(". Price: sheddable TTFT p99 %s → %s, total throughput %s",
		fmtMs(statFor(no, shedTTFT).med), fmtMs(statFor(fg, shedTTFT).med),
		fmtChange(statFor(no, totalThr).med, statFor(fg, totalThr).med))
	nc, fc := statFor(no, critTOs).med, statFor(fg, critTOs).med
	ns, fs := statFor(no, shedTOs).med, statFor(fg, shedTOs).med
	if nc+fc+ns+fs > 0 {
		pf("; clients gave up after %s: critical %.0f → %.0f, sheddable %.0f → %.0f", fmtDuration(timeout), nc, fc, ns, fs)
	}
	pf(".")
	return b.String()
}

// formatColumns lays rows out in columns two spaces apart, the first left-aligned and
// the others right-aligned, with a rule under the header.
func formatColumns(rows [][]string) string {
	var width []int
	for _, r := range rows {
		for i, c := range r {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	line := func(r []string) {
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	total := 0
	for _, x := range width {
		total += x
	}
	b.WriteString(strings.Repeat("-", total+2*(len(width)-1)) + "\n")
	for _, r := range rows[1:] {
		line(r)
	}
	return b.String()
}
