package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The CLI runs experiments on worker goroutines; none may outlive a run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
