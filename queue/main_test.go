package queue_test

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// long scales the stress tests up: go test -race ./queue -args -long
var long = flag.Bool("long", false, "run the stress tests with 20x more items")

func TestMain(m *testing.M) {
	// The stress tests start producer and consumer goroutines; none may
	// outlive its test.
	goleak.VerifyTestMain(m)
}
