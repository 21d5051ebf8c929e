package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol"
)

// newPolicy builds each usage-limit policy the file can select: the holdback
// policy from the ceilings the bands got, the others by name.
func TestNewPolicy(t *testing.T) {
	p, err := newPolicy(PolicyRef{Type: policyHoldback, Ceilings: []float64{0.9, 0.4}})
	require.NoError(t, err)
	h, ok := p.(*flowcontrol.PriorityHoldback)
	require.True(t, ok)
	require.Equal(t, 0.9, h.Ceiling(0, 2))
	require.Equal(t, 0.4, h.Ceiling(1, 2))
	require.Equal(t, 0, p.Gate(1, 2, 0.4).Every, "the sheddable band is held back at its ceiling")
	require.Equal(t, 1, p.Gate(0, 2, 0.4).Every, "the critical band is open far below its own")

	p, err = newPolicy(PolicyRef{Type: policyStatic, Threshold: 0.8})
	require.NoError(t, err)
	require.Equal(t, 0.8, p.(*flowcontrol.Static).Threshold())
	p, err = newPolicy(PolicyRef{Type: policySoftReflective})
	require.NoError(t, err)
	require.IsType(t, &flowcontrol.SoftReflective{}, p)
	_, err = newPolicy(PolicyRef{Type: policyHoldback})
	require.ErrorIs(t, err, flowcontrol.ErrInvalidConfig, "a holdback reference without ceilings")
}
