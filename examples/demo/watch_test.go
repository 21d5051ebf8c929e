package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/memnet"
)

// liveLine matches one live line: elapsed seconds, then the saturation.
var liveLine = regexp.MustCompile(`(?m)^ +\d+(\.\d)?s +\d+\.\d\d\*? +\d+ +\d+ `)

// TestWatch runs the watch mode for a few seconds of arrivals, with the
// no-flow-control contrast, and once interrupted (Ctrl-C) mid-run. It checks
// the output's shape (live lines, the summary) and that every request sent
// got exactly one outcome; it asserts nothing on latencies. The short run
// is on virtual time (a synctest bubble on a memnet network: its 2 × 3 s of
// arrivals take what their CPU takes); the interrupted one on loopback and
// the wall clock, as ./examples/demo -watch runs, in parallel with the rest.
func TestWatch(t *testing.T) {
	t.Parallel()
	checkPhases := func(t *testing.T, phases []*WatchPhase) {
		t.Helper()
		for _, ph := range phases {
			for _, c := range []*ClassResult{&ph.Load.Critical, &ph.Load.Sheddable} {
				require.Positive(t, c.Sent, ph.Name)
				require.True(t, OneResponse(c), "%s: sent %d ≠ answered %d + no response %d + given up %d", ph.Name, c.Sent, c.Answered(), c.Errors, c.Abandoned)
			}
		}
	}

	t.Run("short", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			load := watchLoad()
			load.Duration = 3 * time.Second
			load.Drain = 30 * time.Second
			var out bytes.Buffer
			phases, err := RunWatch(context.Background(), WatchSpec{Backends: 2, Load: load, Contrast: ContrastNone, Out: &out, Net: new(memnet.Network)})
			require.NoError(t, err)
			t.Log("\n" + out.String())
			require.Len(t, phases, 2)
			checkPhases(t, phases)
			for _, ph := range phases {
				require.False(t, ph.Interrupted)
				require.Zero(t, ph.Load.Critical.Errors+ph.Load.Sheddable.Errors+ph.Load.Critical.Abandoned+ph.Load.Sheddable.Abandoned, "%s: a request without a response", ph.Name)
			}
			s := out.String()
			// Two phases of at least three seconds each: a live line a
			// second, and the final line of each.
			require.GreaterOrEqual(t, len(liveLine.FindAllString(s, -1)), 2*(3+1), "live lines")
			for _, want := range []string{
				"gateway: examples/proxy's, in-process, at its defaults",
				"arrivals over",
				"Summary:",
				"critical  TTFT p50",
				"sheddable TTFT p50",
				"every request sent got exactly one outcome",
				"Contrast, the same arrivals (same seed) with no flow control",
			} {
				require.Contains(t, s, want)
			}
			require.NotContains(t, s, "ACCOUNTING ERROR")
		})
	})

	t.Run("interrupted", func(t *testing.T) {
		t.Parallel()
		load := watchLoad() // a minute of arrivals, stopped after 2 s
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(2*time.Second, cancel)
		var out bytes.Buffer
		start := time.Now()
		phases, err := RunWatch(ctx, WatchSpec{Backends: 2, Load: load, Contrast: ContrastStatic, Out: &out})
		require.NoError(t, err)
		t.Log("\n" + out.String())
		require.Less(t, time.Since(start), 30*time.Second, "a cancelled watch returns promptly")
		require.Len(t, phases, 1, "no contrast run after an interrupt")
		require.True(t, phases[0].Interrupted)
		checkPhases(t, phases)
		s := out.String()
		require.Contains(t, s, "interrupted at")
		require.Contains(t, s, "Summary:")
		require.True(t, strings.Contains(s, "every request sent got exactly one outcome"))
	})
}
