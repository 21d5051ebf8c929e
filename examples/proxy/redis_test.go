package main

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// This is saturation/redisshare's test helper (main_test.go), copied: test
// files are not imported across packages.

// redisServer is a real redis-server on a loopback port, private to a test.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

const redisInstallHint = "redis-server not found: this test needs a real Redis; install it with `apt-get update && apt-get install -y redis-server` (.ci/run does this)"

// startRedis starts redis-server on a free loopback port with no
// persistence, waits until it answers PING (bounded), and stops it in
// t.Cleanup. It fails, never skips, when redis-server is missing.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal(redisInstallHint)
	}
	s := &redisServer{t: t, dir: t.TempDir()}
	var err error
	for range 5 { // the port is free when picked; another process may take it first
		s.port = freeLoopbackPort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v", err)
	return nil
}

func freeLoopbackPort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Signal sends sig to the server process (SIGSTOP, SIGCONT).
func (s *redisServer) Signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

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
		if redisPing(s.Addr()) == nil {
			return nil
		}
		time.Sleep(2 * time.Millisecond) // pacing a poll with a deadline, not waiting blind
	}
	s.kill()
	return fmt.Errorf("redis-server on port %d: no PONG within 5s", s.port)
}

// redisPing sends a raw PING (no client library, so no goroutines to leak).
func redisPing(addr string) error {
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

// Start starts a new, empty server on the same port after Stop.
func (s *redisServer) Start() {
	s.t.Helper()
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatalf("redis-server restart on port %d: %v", s.port, err)
}
