package main

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/cluster"
)

// TestDefaultRun: with no flags the simulator runs the overloaded published points and
// codegen@10, 5 seeds, none, llm-d parity (static and soft-reflective), flowgate and
// the floor, with no backend-priority rows, and prints the summary; -full is the whole
// grid with every figure, and explicit flags still apply under it.
func TestDefaultRun(t *testing.T) {
	o, err := parseFlags(nil, nil)
	require.NoError(t, err)
	require.Equal(t, []string{cluster.Floor, cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.SoftReflective,
		cluster.SoftReflective + EvictSuffix}, o.policiesRun())
	require.Equal(t, "summary", o.format)
	require.Equal(t, 5, o.seeds)
	require.Equal(t, "codegen@10, codegen@16, codegen@24, chat@80, reasoning@0.7, reasoning@1.2", pointsString(o.points))
	require.Equal(t, 6*6*5, len(o.jobs()))
	evicts := 0
	for _, j := range o.jobs() {
		if j.cfg.Evict {
			evicts++
			require.Equal(t, cluster.SoftReflective, j.cfg.Policy)
			require.Equal(t, j.cfg.Policy+EvictSuffix, j.label)
			require.Zero(t, j.cfg.Eviction, "the library's defaults")
		}
	}
	require.Equal(t, 6*5, evicts)

	o, err = parseFlags([]string{"-full"}, nil)
	require.NoError(t, err)
	require.Nil(t, o.points)
	require.Equal(t, "table", o.format)
	require.Equal(t, []string{cluster.Floor, cluster.None, cluster.LLMDStatic, cluster.LLMDSoftReflective, cluster.Static,
		cluster.SoftReflective, cluster.None + BPSuffix, cluster.SoftReflective + BPSuffix,
		cluster.SoftReflective + EvictSuffix, cluster.None + EvictSuffix}, o.policiesRun())
	require.Equal(t, 12*10*5, len(o.jobs()))

	o, err = parseFlags([]string{"-full", "-format", "json", "-backend-priority-rows", "", "-evict-rows", "", "-policy", "none"}, nil)
	require.NoError(t, err)
	require.Equal(t, "json", o.format)
	require.Equal(t, []string{cluster.Floor, cluster.None}, o.policiesRun())

	o, err = parseFlags([]string{"-workload", "chat"}, nil)
	require.NoError(t, err)
	require.Nil(t, o.points, "-workload alone: its published points")
	require.Equal(t, 4*6*5, len(o.jobs()))
}

// TestSummaryShape: the default output is sentences first (one per point, the
// rejections), then one table of at most 8 columns, then a legend naming every column;
// no line is longer than 120 characters. Progress goes to stderr with an ETA and names
// each run's variant, backend priority included.
func TestSummaryShape(t *testing.T) {
	var out, errb bytes.Buffer
	require.NoError(t, run([]string{"-duration", "20s", "-seeds", "2"}, &out, &errb))
	s := out.String()
	for _, l := range strings.Split(s, "\n") {
		require.LessOrEqual(t, utf8.RuneCountInString(l), summaryMaxWidth, "%q", l)
	}
	head := strings.Index(s, "\npoint ")
	require.Greater(t, head, 0, s)
	for _, p := range defaultPoints {
		name := pointsString([]sweepPoint{p})
		require.Contains(t, s[:head], "\n"+name+": critical TTFT p99 ", "a sentence per point before the table")
		require.Contains(t, s[head:], "\n"+name+" ", "a row per point")
	}
	require.Contains(t, s[:head], "No request was rejected in any run")
	header := strings.Fields(strings.NewReplacer("llm-d ", "llm-d_", "sheddable ", "sheddable_").Replace(strings.SplitN(s[head+1:], "\n", 2)[0]))
	require.Equal(t, []string{"point", "floor", "none", "llm-d_static", "llm-d_soft-refl.", "flowgate", "sheddable_p99", "throughput"}, header)
	require.LessOrEqual(t, len(header), summaryMaxColumns)
	legend := s[strings.Index(s[head:], "\n\n")+head:]
	for _, c := range []string{"floor:", "none:", "llm-d static, llm-d soft-refl.:", "flowgate:", "sheddable p99:", "throughput:"} {
		require.Contains(t, legend, c)
	}
	require.Contains(t, errb.String(), "[1/72] ")
	// The eviction table: its own rows, the price of flowgate+evict.
	ev := strings.Index(s, "\npoint ")
	ev = strings.Index(s[ev+1:], "\npoint ") + ev + 1
	require.Greater(t, ev, head, "a second table: eviction")
	require.Contains(t, s[head:ev], "Taking work back")
	header = strings.Fields(strings.NewReplacer("sheddable p99 TTFT/E2E", "sheddable_p99").Replace(strings.SplitN(s[ev+1:], "\n", 2)[0]))
	require.Equal(t, []string{"point", "flowgate", "flowgate+evict", "evict/min", "wasted", "sheddable_p99", "throughput"}, header)
	for _, p := range defaultPoints {
		require.Contains(t, s[ev:], "\n"+pointsString([]sweepPoint{p})+" ", "a row per point")
	}
	require.Contains(t, errb.String(), "; ETA ")

	errb.Reset()
	require.NoError(t, run([]string{"-workload", "chat", "-qps", "20", "-duration", "5s", "-seeds", "1", "-policy", "none",
		"-backend-priority-rows", "none"}, &out, &errb))
	require.Contains(t, errb.String(), " chat@20 none+bp seed 1: ")
	errb.Reset()
	require.NoError(t, run([]string{"-workload", "chat", "-qps", "20", "-duration", "5s", "-seeds", "1", "-policy", "none",
		"-backend-priority", "-floor=false"}, &out, &errb))
	require.Contains(t, errb.String(), " chat@20 none+bp seed 1: ")
}
