package flowhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// serveWithStall serves h (GETs pass ungated) behind Gateway.Serve with
// the given write-stall timeout; it returns the address.
func serveWithStall(t *testing.T, stall time.Duration, h http.HandlerFunc) string {
	t.Helper()
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- gw.Serve(ctx, ln, h, flowhttp.ServerConfig{WriteStallTimeout: stall, DrainTimeout: time.Second})
	}()
	t.Cleanup(func() { cancel(); <-served })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A client that reads nothing has its answer's write fail within the
// timeout once its sockets are full: the handler's write returns an
// error, its request's context is cancelled, the connection is closed.
func TestWriteStallCutsAClientThatDoesNotRead(t *testing.T) {
	const stall = 200 * time.Millisecond
	type outcome struct {
		written   int64
		err       error
		cancelled bool
		at        time.Time
	}
	out := make(chan outcome, 1)
	addr := serveWithStall(t, stall, func(w http.ResponseWriter, r *http.Request) {
		var o outcome
		chunk := make([]byte, 256<<10)
		for o.written < 1<<30 && o.err == nil {
			var n int
			n, o.err = w.Write(chunk)
			o.written += int64(n)
		}
		o.at = time.Now()
		select {
		case <-r.Context().Done():
			o.cancelled = true
		case <-time.After(5 * time.Second):
		}
		out <- o
	})
	c := dial(t, addr)
	_, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	var o outcome
	select {
	case o = <-out:
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled write was not cut")
	}
	require.Error(t, o.err)
	require.True(t, o.cancelled, "the request's context outlived the cut")
	require.Less(t, o.written, int64(1<<30))
	// The connection is closed: what the sockets held, then EOF.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open")
}

// A client that reads slowly but keeps reading is never cut, however long
// the whole answer takes; a handler that waits longer than the timeout
// before it writes is not cut either, nor is the next request on the
// same connection after an idle pause longer than the timeout.
func TestWriteStallSparesSlowReadersAndSlowAnswers(t *testing.T) {
	const stall = 300 * time.Millisecond
	const total = 1 << 20
	addr := serveWithStall(t, stall, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/late" {
			select {
			case <-time.After(2 * stall): // a backend thinking
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "late")
			return
		}
		chunk := make([]byte, 64<<10)
		for written := 0; written < total; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	c := dial(t, addr)
	br := bufio.NewReaderSize(c, 4<<10)
	_, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	// 1 MiB read 32 KiB per stall/6: about 1.6 s, far beyond the timeout.
	buf := make([]byte, 32<<10)
	got := 0
	start := time.Now()
	for {
		n, err := io.ReadFull(resp.Body, buf)
		got += n
		if err != nil {
			break
		}
		<-time.After(stall / 6) // the client's pace, not a wait for a condition
	}
	resp.Body.Close()
	require.Equal(t, total, got, "a slow reader was cut (after %v)", time.Since(start))
	// Idle past the timeout, then a request whose answer comes late.
	<-time.After(2 * stall)
	_, err = io.WriteString(c, "GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "late", string(body))
}
