package flowhttp_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// Bodies being read or waiting share MaxBodyMemory; requests outside band 0
// stop at what the critical reserve leaves, critical ones may use it, and
// every byte is given back when its request leaves the queue.
func TestBodyMemoryBudgetAndCriticalReserve(t *testing.T) {
	const kib = 1 << 10
	e := start(t, critShed(16, 0, 0), ok, flowhttp.Options{TrustObjectiveHeader: true, MaxBodyMemory: 1024 * kib, CriticalReserve: 256 * kib})
	e.saturate(t, 1) // the sheddable band is blocked: its bodies wait
	body := strings.Repeat("x", 200*kib)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for range 3 { // 3 × (200 KiB + 1) fit under 768 KiB
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := post(t, ctx, e.srv.URL+"/v1/completions", "sheddable", body)
			if err == nil {
				codes <- resp.StatusCode
			}
		}()
	}
	waitFor(t, "three bodies queued", func() bool { return e.queued(1) == 3 })
	resp, msg, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "sheddable", body)
	require.NoError(t, err)
	require.Equal(t, 429, resp.StatusCode, msg)
	require.Equal(t, flowhttp.ReasonMemoryFull, decodeError(t, msg).Error.Code)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	r := e.result(t)
	require.ErrorIs(t, r.Err, flowhttp.ErrMemoryFull)
	// An unlabelled request counts as the default (last) band: no reserve.
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "", body)
	require.NoError(t, err)
	require.Equal(t, 429, resp.StatusCode)
	e.result(t)
	// The reserve is there for a critical request.
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "critical", body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	e.result(t)
	// Released, the three give their memory back: a body that needs all
	// the shared part but one request's worth fits again.
	e.saturate(t, 0)
	wg.Wait()
	for range 3 {
		require.Equal(t, 200, <-codes)
		e.result(t)
	}
	resp, _, err = post(t, context.Background(), e.srv.URL+"/v1/completions", "sheddable", strings.Repeat("y", 700*kib))
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
}

// A body of which nothing more arrives is cut on its own idle deadline,
// however fast it came before (the rate rule alone would allow it hours).
func TestBodyIdleTimeoutCuts408(t *testing.T) {
	called := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called <- struct{}{} })
	e := start(t, nil, h, flowhttp.Options{BodyIdleTimeout: 100 * time.Millisecond})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	// 64 KiB at once, then silence: under the rate rule (1 KiB/s after a
	// 5 s grace) it would have until 69 s.
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat("a", 64<<10))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer: the idle body was not cut")
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, 408, resp.StatusCode, string(b))
	require.Equal(t, flowhttp.ReasonBodyTimeout, decodeError(t, string(b)).Error.Code)
	r := e.result(t)
	require.ErrorIs(t, r.Err, flowhttp.ErrBodyTimeout)
	select {
	case <-called:
		t.Fatal("a cut body reached the handler")
	default:
	}
}

// zeros is an endless body.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// 40 concurrent 8 MiB uploads to a saturated sheddable band, at the
// defaults: the live heap grows by at most 160 MiB (at b5562a5, before the
// budget, all 40 queued: +323 MiB), and a critical request sent meanwhile is
// served.
func TestConcurrentLargeUploadsBoundedHeap(t *testing.T) {
	e := start(t, critShed(64, 0, 0), ok, flowhttp.Options{TrustObjectiveHeader: true})
	e.saturate(t, 1)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	const uploads, size = 40, 8 << 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &http.Transport{MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	refused := make(chan int, uploads)
	for range uploads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/completions", io.LimitReader(zeros{}, size))
			req.ContentLength = size
			req.Header.Set(flowhttp.ObjectiveHeader, "sheddable")
			resp, err := client.Do(req)
			if err != nil {
				return // refused mid-upload: the connection was closed under the client
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			refused <- resp.StatusCode
		}()
	}
	// Every upload ends queued or refused (body-memory-full).
	var finished int
	// 320 MiB sent over loopback: generous on a busy machine under -race.
	waitWithin(t, 2*time.Minute, "every upload queued or refused", func() bool {
		for {
			select {
			case r := <-e.finished:
				require.ErrorIs(t, r.Err, flowhttp.ErrMemoryFull, "%+v", r)
				finished++
				continue
			default:
			}
			return e.queued(1)+finished == uploads
		}
	})
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	growth := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d uploads of 8 MiB: %d queued, %d refused body-memory-full; live heap +%.1f MiB", uploads, e.queued(1), finished, float64(growth)/(1<<20))
	require.LessOrEqual(t, growth, int64(160<<20))
	require.GreaterOrEqual(t, e.queued(1), 1)

	resp, _, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "critical", strings.Repeat("c", 1<<20))
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, "a critical request beside the uploads")
	e.result(t)
	cancel()
	wg.Wait()
}

// A released body stays charged until the wrapped handler returns: eleven
// critical 4 MiB bodies held by a handler that keeps a copy (as a proxy that
// may retry does) grow the live heap by at most twice MaxBodyMemory. Before,
// a released body left the budget and all eleven were taken (88 MiB live
// against a 16 MiB budget).
func TestReleasedBodiesStayCharged(t *testing.T) {
	const mib = 1 << 20
	const budget = 16 * mib
	hold := make(chan struct{})
	in := make(chan []byte, 11)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, r.ContentLength)
		_, _ = io.ReadFull(r.Body, b)
		in <- b
		<-hold
	})
	e := start(t, nil, h, flowhttp.Options{MaxBodyBytes: 4 * mib, MaxBodyMemory: budget})
	body := strings.Repeat("x", 4*mib)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	refused := make(chan int, 11)
	var kept [][]byte
	for i := range 11 { // one after the other: each finds the budget as the last left it
		wg.Go(func() {
			resp, _, err := post(t, context.Background(), e.srv.URL+"/v1/completions", "critical", body)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests {
				refused <- 1
			}
		})
		waitFor(t, "the request served or refused", func() bool {
			for len(in) > 0 {
				kept = append(kept, <-in)
			}
			return len(kept)+len(refused) == i+1
		})
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d served, %d refused; live heap growth %d MiB (budget %d MiB)", len(kept), len(refused), growth/mib, budget/mib)
	close(hold)
	wg.Wait()
	require.LessOrEqual(t, growth, int64(2*budget))
	runtime.KeepAlive(kept)
}
