package flowhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// pipeListener hands out the server ends of net.Pipe pairs: unbuffered
// connections whose deadlines run on a testing/synctest bubble's clock, so
// a stalled or slow reader is the same on a busy machine as on a quiet one.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// serveWithStall serves h (GETs pass ungated) behind Gateway.Serve with
// the given write-stall timeout, on in-memory connections; it returns the
// dialler. Call it inside a synctest bubble.
func serveWithStall(t *testing.T, stall time.Duration, h http.HandlerFunc) func() net.Conn {
	t.Helper()
	gw, err := flowhttp.NewGateway(flowhttp.GatewayConfig{})
	require.NoError(t, err)
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- gw.Serve(ctx, ln, h, flowhttp.ServerConfig{WriteStallTimeout: stall, DrainTimeout: time.Second})
	}()
	t.Cleanup(func() { cancel(); <-served })
	return func() net.Conn {
		c, s := net.Pipe()
		ln.conns <- s
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
}

// A client that reads nothing has its answer's write fail within the
// timeout (the connection is unbuffered, on the bubble's clock): the
// handler's write returns an error, its request's context is cancelled,
// the connection is closed.
func TestWriteStallCutsAClientThatDoesNotRead(t *testing.T) {
	synctest.Test(t, testWriteStallCuts)
}

func testWriteStallCuts(t *testing.T) {
	const stall = 200 * time.Millisecond
	type outcome struct {
		written   int64
		err       error
		cancelled bool
		at        time.Time
	}
	out := make(chan outcome, 1)
	dial := serveWithStall(t, stall, func(w http.ResponseWriter, r *http.Request) {
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
	c := dial()
	start := time.Now()
	_, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	var o outcome
	select {
	case o = <-out:
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled write was not cut")
	}
	require.Error(t, o.err)
	require.Less(t, o.at.Sub(start), 2*stall, "cut after %v", o.at.Sub(start))
	require.True(t, o.cancelled, "the request's context outlived the cut")
	require.Less(t, o.written, int64(1<<30))
	// The connection is closed: EOF, not a read that times out.
	// (Setting a deadline on a pipe whose other end is closed fails too.)
	if err = c.SetReadDeadline(time.Now().Add(5 * time.Second)); err == nil {
		_, err = io.Copy(io.Discard, c)
	}
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open")
}

// A client that reads slowly but keeps reading is never cut, however long
// the whole answer takes; a handler that waits longer than the timeout
// before it writes is not cut either, nor is the next request on the
// same connection after an idle pause longer than the timeout.
func TestWriteStallSparesSlowReadersAndSlowAnswers(t *testing.T) {
	synctest.Test(t, testWriteStallSpares)
}

func testWriteStallSpares(t *testing.T) {
	const stall = 300 * time.Millisecond
	const total = 1 << 20
	dial := serveWithStall(t, stall, func(w http.ResponseWriter, r *http.Request) {
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
	c := dial()
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
