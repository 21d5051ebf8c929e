package cluster

import (
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/workload"
	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/stretchr/testify/require"
)

// TestPolicyFuncIsAsSafeAsStatic: safety is the dispatcher's, so a user's
// PolicyFunc that opens every band below 1.0 and closes it at 1.0 gets
// exactly the protection of the shipped Static at threshold 1.0 (the same
// run, event for event), at a point past the knee.
func TestPolicyFuncIsAsSafeAsStatic(t *testing.T) {
	user := flowcontrol.PolicyFunc(func(_, _ int, s float64) flowcontrol.Gate {
		if s < 1 {
			return flowcontrol.Gate{Ceiling: 1, Every: 1}
		}
		return flowcontrol.Gate{Ceiling: 1, Every: 0}
	})
	for _, qps := range []float64{16, 24} {
		c := short(workload.Codegen, qps, Static)
		c.Duration = 60 * time.Second
		shipped, err := Run(c)
		require.NoError(t, err)
		c.policy = user
		got, err := Run(c)
		require.NoError(t, err)
		require.Equal(t, shipped, got, "codegen@%g: a PolicyFunc restating Static", qps)
		require.Positive(t, shipped.Critical.TTFTp99)
		require.Positive(t, shipped.ShareHardBlock, "the ceiling was reached: the run exercised reopening")
	}
}
