// Package redistest runs a real redis-server for tests, like net/http/httptest
// runs a real HTTP server: on a free loopback port, with no persistence, in a
// temporary directory, stopped when the test ends. Tests of the shared
// in-flight view (and of hosts that use it) need the real server — its key
// expiry, transactions and failure modes — not a mock.
//
// When redis-server is not installed it skips the test with the install
// command (InstallHint), so `go test ./...` passes on a machine with only Go;
// when the variable RequireEnv is set (the repository's .ci/run sets it
// after installing Debian's redis-server) it fails the test instead, so CI
// cannot pass by skipping.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// InstallHint is the message a test skips (or, under RequireEnv, fails)
// with when redis-server is missing.
const InstallHint = "redistest: redis-server not found: this test needs a real Redis; install it (Debian/Ubuntu: `apt-get install -y redis-server`, macOS: `brew install redis`) and run the tests again"

// RequireEnv is the environment variable that turns a missing redis-server
// from a skip into a failure: .ci/run sets it to 1.
const RequireEnv = "FLOWGATE_REQUIRE_REDIS"

// Available reports whether redis-server is on PATH.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Require skips t (or fails it, when RequireEnv is set) if redis-server is
// not on PATH. Start calls it; call it first in a test that needs Redis
// before it starts one.
func Require(t testing.TB) {
	t.Helper()
	if Available() {
		return
	}
	if os.Getenv(RequireEnv) != "" {
		t.Fatal(InstallHint + " (" + RequireEnv + " is set: required)")
	}
	t.Skip(InstallHint)
}

// Server is a redis-server process private to one test.
type Server struct {
	t    testing.TB
	args []string // extra redis-server arguments (StartWith)
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts redis-server on a free loopback port, waits (bounded) until it
// answers PING, and stops it in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with extra redis-server arguments, such as
// "--requirepass", "secret". Restart keeps them.
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, dir: t.TempDir(), args: args}
	var err error
	for range 5 { // the port is free when picked; another process may take it first
		s.port = freePort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: redis-server did not start: %v", err)
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
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Signal sends sig to the server process (SIGSTOP and SIGCONT to stall it).
func (s *Server) Signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

// startTimeout bounds how long start waits for the server's first PONG.
const startTimeout = 20 * time.Second

func (s *Server) start() error {
	s.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--loglevel", "warning"}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	// Generous: on a loaded 2-core machine under -race a start has taken
	// over 5 s; a healthy one answers in milliseconds.
	deadline := time.Now().Add(startTimeout)
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
	return fmt.Errorf("redis-server on port %d: no PONG within %v", s.port, startTimeout)
}

// ping sends a raw PING (no client library, so no goroutines to leak).
//
// A server started with --requirepass answers -NOAUTH, which also says it
// is up.
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
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Stop terminates the server and waits for it (SIGKILL after 3 s). It is
// idempotent; Start's cleanup calls it.
func (s *Server) Stop() {
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

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Restart stops the server and starts a new, empty one on the same port, as a
// Redis restart in production would.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	// Generous: on a loaded 2-core machine under -race a start has taken
	// over 5 s; a healthy one answers in milliseconds.
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatalf("redistest: redis-server restart on port %d: %v", s.port, err)
}
