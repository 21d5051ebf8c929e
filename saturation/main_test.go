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

// fullSize reports whether FLOWGATE_FULL=1 asks for the scale tests at full
// size (.ci/run sets it); otherwise they run smaller, and say so.
func fullSize() bool { return os.Getenv("FLOWGATE_FULL") == "1" }

// scalePods is the pool size of the scale tests: 1,000 pods at full size,
// 300 otherwise, still well above the connection bound of
// TestPoller1000PodsScrape (DefaultMaxConcurrency = 64) were the poller to
// keep a connection per pod.
func scalePods(t testing.TB) int {
	t.Helper()
	if fullSize() {
		t.Logf("full size (FLOWGATE_FULL=1): 1000 pods")
		return 1000
	}
	t.Logf("default size: 300 pods (FLOWGATE_FULL=1 runs 1000)")
	return 300
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
