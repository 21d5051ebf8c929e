package redisshare

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// newDefaultReplica is a replica at the package defaults (Period, TTL,
// Timeout): the windows below are the defaults' windows.
func newDefaultReplica(t *testing.T, addr, id string) *replica {
	t.Helper()
	return startReplica(t, Options{Addr: addr, ReplicaID: id})
}

// windowRounds is how many kills (or stalls) a window test measures: 5 with
// FLOWGATE_FULL=1, 2 otherwise.
func windowRounds(t *testing.T) int {
	n := 2
	if os.Getenv("FLOWGATE_FULL") == "1" {
		n = 5
	}
	t.Logf("size: %d rounds (FLOWGATE_FULL=1: 5)", n)
	return n
}

// TestPhantomLoadWindow measures, at the defaults (TTL 1 s), how long a
// SIGKILLed replica's 100 in-flight requests stay in a survivor's view:
// nothing deletes its hash, so they count until Redis expires it (TTL −
// Period after its last publish) and the survivor's next sync. Meanwhile
// the survivor's view reads 100 more than it should, so its gate errs
// closed. The survivor stays up throughout. The figures are logged for the
// package doc; what is asserted is that the phantom is there at the kill,
// leaves by itself, and never drops the survivor's own count.
//
// In parallel with the package's other slow tests (its own redis-server):
// it asserts no bound on the window.
func TestPhantomLoadWindow(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	a := newDefaultReplica(t, srv.Addr(), "survivor")
	a.Add("x", 3)
	a.run(t)
	var windows []time.Duration
	for i := range windowRounds(t) {
		child := startChildReplica(t, srv.Addr(), "doomed", DefaultTTL, "x=100")
		// Bounded, hang-only: the child's first publish is on its way.
		require.Eventually(t, func() bool { return a.InFlight("x") == 103 }, 30*time.Second, time.Millisecond)
		require.NoError(t, child.Process.Signal(syscall.SIGKILL))
		killed := time.Now()
		require.Equal(t, int64(103), a.InFlight("x"), "round %d: the dead replica's requests still count at the kill", i)
		require.Eventually(t, func() bool { return a.InFlight("x") == 3 }, 30*time.Second, time.Millisecond)
		w := time.Since(killed)
		windows = append(windows, w)
		_ = child.Wait()
		require.Equal(t, Up, a.State())
		t.Logf("round %d: phantom load of 100 left the survivor's view %v after SIGKILL (TTL %v, period %v)",
			i, w.Round(time.Millisecond), DefaultTTL, DefaultPeriod)
	}
	t.Logf("phantom-load windows: %v", windows)
}

// TestFrozenViewWindow measures, at the defaults, what a stalled Redis
// (SIGSTOP) does to a replica's view: syncs time out, so the others'
// counts stay as last fetched (frozen: a peer's change during the stall is
// not seen) until they are TTL old; then the replica falls back to its own
// counts (Down), which errs open: it sees less load than there is. After
// SIGCONT the view is shared again. The figures are logged for the package
// doc.
//
// In parallel with the package's other slow tests (its own redis-server):
// it asserts no bound on the windows.
func TestFrozenViewWindow(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	a, b := newDefaultReplica(t, srv.Addr(), "a"), newDefaultReplica(t, srv.Addr(), "b")
	a.Add("x", 1)
	b.Add("x", 7)
	a.run(t)
	b.run(t)
	for i := range windowRounds(t) {
		require.Eventually(t, func() bool { return a.State() == Up && a.InFlight("x") == 8 }, 30*time.Second, time.Millisecond)
		require.NoError(t, srv.Signal(syscall.SIGSTOP))
		stalled := time.Now()
		b.Add("x", 5) // b's change during the stall: a cannot see it
		require.Equal(t, int64(8), a.InFlight("x"), "round %d: the view is frozen at b's last published count", i)
		require.Eventually(t, func() bool { return a.State() == Down }, 30*time.Second, time.Millisecond)
		frozen := time.Since(stalled)
		require.Equal(t, int64(1), a.InFlight("x"), "round %d: down: own counts only", i)
		require.Equal(t, 0.0, a.gauge(t, "flowgate_shared_inflight_up"))
		// Hold the stall a moment past the fallback, as a long one would.
		<-time.After(200 * time.Millisecond) // the stall's length, not a wait for a condition
		require.NoError(t, srv.Signal(syscall.SIGCONT))
		resumed := time.Now()
		require.Eventually(t, func() bool { return a.State() == Up && a.InFlight("x") == 13 }, 30*time.Second, time.Millisecond)
		back := time.Since(resumed)
		b.Add("x", -5)
		t.Logf("round %d: view frozen %v after SIGSTOP, then own counts (TTL %v); shared again %v after SIGCONT",
			i, frozen.Round(time.Millisecond), DefaultTTL, back.Round(time.Millisecond))
	}
}
