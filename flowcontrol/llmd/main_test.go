package llmd

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind (Run's, above all), as
// flowcontrol's tests do.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
