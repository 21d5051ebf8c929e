package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runArgs(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	require.NoError(t, run(args, &out, &errb), errb.String())
	return out.String()
}

func TestSameSeedSameBytes(t *testing.T) {
	dir := t.TempDir()
	args := func(svg string) []string {
		return []string{"-workload", "codegen", "-qps", "4,16", "-duration", "20s", "-seed", "3", "-seeds", "2", "-quiet",
			"-plot", filepath.Join(dir, svg)}
	}
	a := runArgs(t, args("a.svg")...)
	b := runArgs(t, append(args("b.svg"), "-parallel", "1")...)
	require.Equal(t, a, b, "same seed, same output, whatever the parallelism")
	sa, err := os.ReadFile(filepath.Join(dir, "a.svg"))
	require.NoError(t, err)
	sb, err := os.ReadFile(filepath.Join(dir, "b.svg"))
	require.NoError(t, err)
	require.Equal(t, sa, sb)
	require.True(t, bytes.HasPrefix(sa, []byte("<svg")))
	require.Contains(t, a, "\ncodegen@16 ")
	c := runArgs(t, "-workload", "codegen", "-qps", "4,16", "-duration", "20s", "-seed", "4", "-seeds", "2", "-quiet")
	require.NotEqual(t, a, c)
}

func TestJSONKeys(t *testing.T) {
	out := runArgs(t, "-workload", "chat", "-qps", "20", "-duration", "10s", "-format", "json", "-quiet", "-gateways", "2",
		"-seeds", "2", "-policy", "none,llmd-static,llmd-soft-reflective,static,soft-reflective",
		"-backend-priority-rows", "none,soft-reflective", "-evict-rows", "")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	pols := []string{"floor", "none", "llmd-static", "llmd-soft-reflective", "static", "soft-reflective", "none+bp", "soft-reflective+bp"}
	require.Len(t, lines, 2*len(pols), "one object per (workload, qps, policy, seed): JSON Lines")
	want := []string{"workload", "qps", "policy", "seed", "backend_priority", "requests", "completed", "rejected",
		"critical_ttft_p50_ms", "critical_ttft_p99_ms", "critical_e2e_p99_ms", "sheddable_ttft_p99_ms",
		"sheddable_e2e_p99_ms", "throughput_rps", "total_throughput_rps", "goodput_rps", "critical_timeouts",
		"sheddable_timeouts", "share_dead_zone", "share_proportional", "share_hard_block"}
	for i, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		require.Len(t, m, len(want))
		for _, k := range want {
			require.Contains(t, m, k)
		}
		require.Equal(t, pols[i/2], m["policy"])
		require.Equal(t, strings.HasSuffix(pols[i/2], "+bp"), m["backend_priority"])
		require.EqualValues(t, 1+i%2, m["seed"])
		require.Equal(t, m["requests"], m["completed"])
		require.EqualValues(t, 0, m["rejected"])
		if m["policy"] == "floor" {
			require.EqualValues(t, 0, m["sheddable_ttft_p99_ms"], "the floor has no sheddable traffic")
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	var out, errb bytes.Buffer
	require.NoError(t, run([]string{"-h"}, &out, &errb))
	require.Contains(t, errb.String(), "-client-timeout")
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-workload", "poetry"}, {"-qps", "1,x"}, {"-qps", "-3"}, {"-policy", "fifo"}, {"-format", "xml"},
		{"-duration", "0s"}, {"-gateways", "0"}, {"-burst", "-1"}, {"-step-decode-ns", "-1"}, {"extra"},
		{"-seeds", "0"}, {"-client-timeout", "-1s"}, {"-policy", "none,fifo"},
		{"-evict-rows", "llmd-static"}, {"-evict-stall", "-1s"}, {"-evict-threshold", "-1"}, {"-evict-max", "-1"},
	} {
		var out, errb bytes.Buffer
		require.Error(t, run(args, &out, &errb), "%v", args)
	}
}

func TestSweepRuns(t *testing.T) {
	out := runArgs(t, "-sweep", "-sweep-points", "chat:20", "-duration", "5s", "-quiet")
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| tick") {
			rows++
		}
	}
	require.Equal(t, 2*len(sweepTicks)*len(sweepBursts), rows, out)
}

// TestSameSeedSameBytesGateways4: with four gateways sharing the pool (ties between
// their events resolved by the documented total order), the same seed gives the same
// bytes, whatever the parallelism; the acceptance command's policies in JSON.
func TestSameSeedSameBytesGateways4(t *testing.T) {
	args := []string{"-workload", "codegen", "-qps", "16", "-duration", "15s", "-seeds", "2", "-gateways", "4", "-quiet",
		"-policy", "none,llmd-static,llmd-soft-reflective,soft-reflective", "-backend-priority-rows", "none,soft-reflective", "-format", "json"}
	a := runArgs(t, args...)
	b := runArgs(t, append(args, "-parallel", "1")...)
	require.Equal(t, a, b)
	require.Equal(t, 2*8, strings.Count(a, "\n"), "floor + 4 policies + 2 backend-priority rows + 1 eviction row, 2 seeds")
}

// TestFitRuns: -fit prints one row per published figure, each with the hardware value,
// the model's and a residual, and the loss.
func TestFitRuns(t *testing.T) {
	out := runArgs(t, "-fit", "-duration", "5s", "-seeds", "1", "-quiet")
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| codegen@") || strings.HasPrefix(l, "| chat@") || strings.HasPrefix(l, "| reasoning@") {
			rows++
			require.Regexp(t, `(×[0-9.]+ \(log10 [+-][0-9.]+\)|[+-][0-9.]+ pp) \|$`, l)
		}
	}
	require.Equal(t, len(publishedPoints), rows, out)
	require.Regexp(t, `\nloss [0-9.]+\n`, out)
}

// TestTableStepBoundAndBackendPriorityRows: the Markdown table (-format table) has the
// step-time bound beside the floor and the backend-priority rows beside the rows without;
// an empty -backend-priority-rows drops them, and -backend-priority runs every row with it
// (no +bp rows). A bound is printed for an overloaded point (a finite figure, not –).
func TestTableStepBoundAndBackendPriorityRows(t *testing.T) {
	out := runArgs(t, "-workload", "chat", "-qps", "80", "-duration", "20s", "-seeds", "1", "-quiet", "-policy", "none,soft-reflective",
		"-format", "table", "-backend-priority-rows", "none,soft-reflective", "-evict-rows", "soft-reflective,none")
	require.Contains(t, out, "| workload | QPS | floor | step-time bound | none | soft-reflective | none+bp | soft-reflective+bp | soft-reflective+evict | none+evict |")
	row := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| chat | 80 |") {
			row = l
			break
		}
	}
	cells := strings.Split(row, "|")
	require.Greater(t, len(cells), 4, out)
	require.Regexp(t, `^ [0-9]+ ms $`, cells[4], "the bound of chat@80: %q", row)
	out = runArgs(t, "-workload", "chat", "-qps", "80", "-duration", "20s", "-seeds", "1", "-quiet", "-policy", "none", "-format", "table", "-evict-rows", "")
	require.Contains(t, out, "| workload | QPS | floor | step-time bound | none |\n")
	out = runArgs(t, "-workload", "chat", "-qps", "80", "-duration", "20s", "-seeds", "1", "-quiet", "-policy", "none", "-backend-priority", "-format", "json")
	require.NotContains(t, out, "+bp")
	require.Contains(t, out, `"backend_priority":true`)
	require.NotContains(t, out, `"backend_priority":false`)
}
