package redisshare

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
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

// redisServer is a real redis-server on a loopback port, private to a test.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

const installHint = "redis-server not found: these tests need a real Redis; install it with `apt-get update && apt-get install -y redis-server` (.ci/run does this)"

// startRedis starts redis-server on a free loopback port with no
// persistence, waits until it answers PING (bounded), and stops it in
// t.Cleanup. It fails, never skips, when redis-server is missing.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal(installHint)
	}
	s := &redisServer{t: t, dir: t.TempDir()}
	var err error
	for range 5 { // the port is free when picked; another process may take it first
		s.port = freePort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v", err)
	return nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Pid is the server's process id.
func (s *redisServer) Pid() int { return s.cmd.Process.Pid }

func (s *redisServer) start() error {
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--loglevel", "warning")
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on port %d exited", s.port)
		default:
		}
		if ping(s.Addr()) == nil {
			return nil
		}
		time.Sleep(2 * time.Millisecond) // pacing a poll with a deadline, not waiting blind
	}
	s.kill()
	return fmt.Errorf("redis-server on port %d: no PONG within 5s", s.port)
}

// ping sends a raw PING (no client library, so no goroutines to leak).
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Stop terminates the server and waits for it (SIGKILL after 3 s).
func (s *redisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stopped server cannot handle SIGTERM
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(3 * time.Second):
		s.kill()
	}
	s.cmd = nil
}

func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Restart stops the server and starts a new, empty one on the same port.
func (s *redisServer) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatalf("redis-server restart on port %d: %v", s.port, err)
}
