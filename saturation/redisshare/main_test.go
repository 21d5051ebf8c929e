package redisshare

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowgate/flowgate/saturation/redisshare/redistest"
)

// childEnv, when set, makes the test binary run as a replica in a child
// process (see startChildReplica) instead of running tests: the kill -9 test
// needs a replica that dies without running any cleanup.
const childEnv = "REDISSHARE_TEST_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChildReplica(spec))
	}
	goleak.VerifyTestMain(m)
}

// runChildReplica runs spec = "addr id ttl endpoint=count..." until killed,
// printing "ready" once its first sync succeeded.
func runChildReplica(spec string) int {
	f := strings.Fields(spec)
	ttl, err := time.ParseDuration(f[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	v, err := New(Options{Addr: f[0], ReplicaID: f[1], Period: 5 * time.Millisecond, TTL: ttl})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, kv := range f[3:] {
		ep, n, _ := strings.Cut(kv, "=")
		c, _ := strconv.ParseInt(n, 10, 64)
		v.Add(ep, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for v.Sync(context.Background()) != nil {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "child: no sync")
			return 2
		}
	}
	fmt.Println("ready")
	_ = v.Run(context.Background()) // until SIGKILL
	return 0
}

// startChildReplica starts a replica in a child process publishing counts,
// waits (bounded) until it has published, and returns it; the test kills it.
func startChildReplica(t *testing.T, addr, id string, ttl time.Duration, counts ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(append([]string{addr, id, ttl.String()}, counts...), " "))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("child said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("child replica: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child replica not ready within 10s")
	}
	return cmd
}

// startRedis starts a real redis-server for the test (see redistest).
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }
