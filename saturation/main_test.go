package saturation

import (
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// scale multiplies property check counts and stress sizes when
// FLOWGATE_LONG is set to a positive integer (default 1: CI stays fast).
func scale() int {
	if n, err := strconv.Atoi(os.Getenv("FLOWGATE_LONG")); err == nil && n > 0 {
		return n
	}
	return 1
}

// fakeClock is a settable clock for staleness and smoothing tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
