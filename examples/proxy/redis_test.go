package main

import (
	"net"
	"testing"

	"github.com/flowgate/flowgate/saturation/redisshare/redistest"
)

// startRedis starts a real redis-server for the test (see redistest).
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

// freeLoopbackPort returns a loopback port that was free a moment ago.
func freeLoopbackPort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
