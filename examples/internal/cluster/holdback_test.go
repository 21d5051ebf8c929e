package cluster

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
)

// The holdback policies run with their default ceilings and with the config's,
// reject a bad one naming Holdback, and hold the sheddable band back exactly as
// configured: at minCeiling 0 no sheddable request is ever dispatched (s >= 0 is
// always true), whatever the discipline.
func TestHoldbackPolicies(t *testing.T) {
	for _, pol := range []string{PriorityHoldback, LLMDPriorityHoldback} {
		cfg := short(workload.Codegen, 16, pol)
		s, err := run(cfg)
		require.NoError(t, err, pol)
		checkInvariants(t, s)
		res := s.result()
		require.Positive(t, res.Sheddable.Throughput, "%s: sheddable goes at the default minCeiling 0.5", pol)

		cfg.Holdback = flowcontrol.HoldbackConfig{Domain: flowcontrol.HoldbackRank, MinCeiling: 0, MaxCeiling: 1}
		s, err = run(cfg)
		require.NoError(t, err, pol)
		res = s.result()
		require.Zero(t, res.Sheddable.Throughput, "%s: minCeiling 0 holds sheddable back for good", pol)
		require.Positive(t, res.Critical.Throughput, pol)

		cfg.Holdback = flowcontrol.HoldbackConfig{MinCeiling: 0.9, MaxCeiling: 0.8}
		_, err = Run(cfg)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%s: %v", pol, err)
		require.Contains(t, err.Error(), "Holdback")
	}
}
