package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/saturation"
)

// TestSignalReadingsAreWhatVLLMExports: at every tick the gateway's readings
// carry, per replica, the mean prompt and output lengths of the requests that
// replica finished so far (what vLLM's histograms give) and its KV capacity in
// tokens, and the run with every signal option on keeps the invariants.
func TestSignalReadingsAreWhatVLLMExports(t *testing.T) {
	w, err := workload.ByName("codegen")
	require.NoError(t, err)
	cfg := short(w, 16, SoftReflective)
	cfg.Projection, cfg.PromptTokens, cfg.MaxOverReplicas = saturation.ProjectSteady, 2048, true
	checked := 0
	cfg.onTick = func(s *sim, g *gateway, _ float64) {
		for r := range s.replicas {
			var n, p, o float64
			for i := range s.reqs {
				q := &s.reqs[i]
				// finished on r before the last scrape
				if q.replica == int32(r) && q.done >= 0 && q.done <= g.readings[r].At.Sub(s.base).Nanoseconds() {
					n, p, o = n+1, p+float64(q.vr.Input), o+float64(q.vr.Output)
				}
			}
			rd := g.readings[r]
			if n == 0 {
				require.Zero(t, rd.OutputMean)
				continue
			}
			require.InDelta(t, p/n, rd.PromptMean, 1e-9)
			require.InDelta(t, o/n, rd.OutputMean, 1e-9)
			require.Equal(t, float64(s.cfg.Replica.TotalBlocks*s.cfg.Replica.BlockSize), rd.KVCapacity)
			checked++
		}
	}
	cfg.noSkip = false
	s, err := run(cfg)
	require.NoError(t, err)
	require.Positive(t, checked)
	checkInvariants(t, s)
}

// TestSignalOptionsAreFlowgates: the saturation options change flowgate's
// gateways only; the llm-d baselines keep the reference score.
func TestSignalOptionsAreFlowgates(t *testing.T) {
	w, err := workload.ByName("codegen")
	require.NoError(t, err)
	for _, p := range []string{LLMDStatic, LLMDSoftReflective} {
		plain := short(w, 16, p)
		with := plain
		with.Projection, with.PromptTokens, with.MaxOverReplicas, with.QueueThreshold = saturation.ProjectCompletion, 512, true, 1
		a, err := Run(plain)
		require.NoError(t, err)
		b, err := Run(with)
		require.NoError(t, err)
		require.Equal(t, a, b, p)
	}
	plain := short(w, 16, SoftReflective)
	with := plain
	with.PromptTokens = 512
	a, err := Run(plain)
	require.NoError(t, err)
	b, err := Run(with)
	require.NoError(t, err)
	require.NotEqual(t, a.Critical, b.Critical, "the option reaches flowgate's gateway")
}
