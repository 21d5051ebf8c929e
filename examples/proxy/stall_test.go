package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// stallBackend is a model server as vLLM is one to a client that does not
// read: its engine finishes a request after gen (and its /metrics stop
// counting it), while the answer is still being written out. A streaming
// request's answer is streamMiB of SSE, far more than the sockets between
// the client and the backend hold; any other answer is a few bytes.
type stallBackend struct {
	srv      *httptest.Server
	running  atomic.Int64 // in the engine
	received atomic.Int64 // completions received
	ended    atomic.Int64 // streamed answers whose handler returned
}

const (
	stallGen       = 20 * time.Millisecond
	stallStreamMiB = 64
)

func newStallBackend(t *testing.T) *stallBackend {
	b := &stallBackend{}
	chunk := bytes.Repeat([]byte("x"), 32<<10-8)
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running %d\nvllm:kv_cache_usage_perc 0\n", b.running.Load())
			return
		}
		body, _ := io.ReadAll(r.Body)
		b.received.Add(1)
		b.running.Add(1)
		gen := time.NewTimer(stallGen) // the model's time, not a wait for a condition
		select {
		case <-gen.C:
		case <-r.Context().Done():
		}
		b.running.Add(-1)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
			return
		}
		defer b.ended.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range stallStreamMiB * 32 {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// stalledClient sends a streaming completion and never reads the answer.
func stalledClient(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	body := `{"model":"m","prompt":"hi","max_tokens":100000,"stream":true}`
	_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	return c
}

// stallRig is the proxy, served by flowhttp's server over two stall
// backends (or the built binary: p nil).
type stallRig struct {
	p        *gateway.Proxy
	addr     string
	backends []*stallBackend
	client   *http.Client
}

func newStallRig(t *testing.T, sc flowhttp.ServerConfig) *stallRig {
	r := &stallRig{backends: []*stallBackend{newStallBackend(t), newStallBackend(t)}}
	var urls []string
	for _, b := range r.backends {
		urls = append(urls, b.srv.URL)
	}
	p, err := gateway.NewProxy(gateway.Options{Config: testConfig(), Backends: urls, Logf: func(string, ...any) {}})
	require.NoError(t, err)
	r.p = p
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	sc.DrainTimeout = time.Second // the stalled connections are cut then
	go func() { served <- p.Serve(ctx, ln, sc) }()
	tr := &http.Transport{}
	r.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		cancel()
		<-served
		tr.CloseIdleConnections()
	})
	eventually(t, "the pool reads idle", func() bool { return p.Poller().Saturation() < 0.5 })
	return r
}

// probe sends one sheddable completion; it reports how long it took, or
// an error (its timeout included).
func (r *stallRig) probe(timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.addr+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"probe","max_tokens":1}`))
	if err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		return time.Since(start), err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Since(start), fmt.Errorf("status %d", resp.StatusCode)
	}
	return time.Since(start), nil
}

// stall sends n stalled clients one after the other, each once the one
// before reached a backend (or was held in the queue for a second): the
// attack of issue 31, about seven per pod.
func (r *stallRig) stall(t *testing.T, n int) (conns []net.Conn, forwarded int) {
	received := func() (n int64) {
		for _, b := range r.backends {
			n += b.received.Load()
		}
		return n
	}
	for range n {
		before := received()
		conns = append(conns, stalledClient(t, r.addr))
		deadline := time.Now().Add(time.Second)
		for received() == before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // polled with a deadline
		}
		if received() > before {
			forwarded++
		}
	}
	return conns, forwarded
}

const stalledPerPod = 7

// idleProbes is 5 probes on the pool before the stall, sorted.
func (r *stallRig) idleProbes(t *testing.T) []time.Duration {
	var base []time.Duration
	for range 5 {
		d, err := r.probe(3 * time.Second)
		require.NoError(t, err, "probe on an idle pool")
		base = append(base, d)
	}
	slices.Sort(base)
	return base
}

// probeRun is what 10 sheddable probes sent one after the other saw.
type probeRun struct {
	lat    []time.Duration // of those served, sorted
	failed int             // timed out or refused
	first  time.Duration   // from the run's start to the first served; -1: none
}

const probes, probeTimeout = 10, 3 * time.Second

// probeAfterStall waits until the backends' engines are idle (they have
// finished every request) and sends the probes.
func (r *stallRig) probeAfterStall(t *testing.T) probeRun {
	eventually(t, "the backends' engines idle", func() bool {
		for _, b := range r.backends {
			if b.running.Load() != 0 {
				return false
			}
		}
		return true
	})
	t0 := time.Now()
	run := probeRun{first: -1}
	for range probes {
		d, err := r.probe(probeTimeout)
		if err != nil {
			run.failed++
			continue
		}
		if run.first < 0 {
			run.first = time.Since(t0)
		}
		run.lat = append(run.lat, d)
	}
	slices.Sort(run.lat)
	return run
}

// check requires every probe served, the first within the credit's grace
// and a scrape of the backends going idle, the ones after it as on an
// idle pool.
func (run probeRun) check(t *testing.T) {
	require.Zero(t, run.failed, "sheddable probes timed out behind stalled readers")
	require.Less(t, run.first, 2*time.Second)
	require.Less(t, run.lat[len(run.lat)-2], time.Second)
}

func (run probeRun) String() string {
	return fmt.Sprintf("%d/%d probes served, %d timed out (%v), first served %v after the backends went idle, served p50 %v max %v",
		len(run.lat), probes, run.failed, probeTimeout, run.first, pct(run.lat, 0.5), pct(run.lat, 1))
}

// Seven clients per pod that send a streaming request and never read its
// answer must not close the sheddable band: once the backends report them
// finished, the in-flight credit stops counting them (a second after each
// was forwarded, at the next scrape), whatever the clients do. Here the
// write-stall timeout is off, so the stalled connections stay open
// throughout: what frees the band is the credit alone.
func TestStalledReadersDoNotPinTheGate(t *testing.T) {
	r := newStallRig(t, flowhttp.ServerConfig{WriteStallTimeout: -1})
	base := r.idleProbes(t)
	conns, forwarded := r.stall(t, stalledPerPod*len(r.backends))
	require.Len(t, conns, stalledPerPod*len(r.backends))
	run := r.probeAfterStall(t)
	t.Logf("stalled clients %d (forwarded %d), pool saturation %.2f; idle-pool probes p50 %v max %v; after the stall: %v",
		len(conns), forwarded, r.p.Poller().Saturation(), base[len(base)/2], base[len(base)-1], run)
	run.check(t)
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return -1
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// cut waits until deadline for the backends to end the forwarded streams
// (the proxy cancels a cut client's backend request), then reads each
// client's connection: a closed one ends (EOF or reset) once what its
// sockets hold is drained; an open one would keep streaming or wait. It
// returns the streams ended, when the last ended (since start; at the
// deadline if some did not), and the connections closed.
func (r *stallRig) cut(conns []net.Conn, forwarded int, start, deadline time.Time) (ended int64, last time.Duration, closed int) {
	count := func() (n int64) {
		for _, b := range r.backends {
			n += b.ended.Load()
		}
		return n
	}
	for count() < int64(forwarded) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polled with a deadline
	}
	last = time.Since(start)
	drain := time.Now().Add(5 * time.Second) // one bound for all: an open connection waits it out
	for _, c := range conns {
		_ = c.SetReadDeadline(drain)
		_, err := io.Copy(io.Discard, io.LimitReader(c, 4*stallStreamMiB<<20))
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) {
			closed++
		}
	}
	return count(), last, closed
}

// stallGrace is the time a stalled connection's sockets take to fill
// before the proxy's writes block, with a margin for a loaded machine: a
// connection is cut within the write-stall timeout plus this.
const stallGrace = 4 * time.Second

// A client that accepts no byte of its answer for WriteStallTimeout has its
// connection cut: the stalled connections are closed within the timeout
// (plus the time their socket buffers took to fill), and the backends'
// requests are cancelled with them.
func TestStalledReadersCutAfterWriteStallTimeout(t *testing.T) {
	const stallTimeout = time.Second
	r := newStallRig(t, flowhttp.ServerConfig{WriteStallTimeout: stallTimeout})
	start := time.Now()
	conns, forwarded := r.stall(t, stalledPerPod*len(r.backends))
	sent := time.Since(start)
	ended, last, closed := r.cut(conns, forwarded, start, time.Now().Add(stallTimeout+stallGrace))
	t.Logf("stalled clients %d (forwarded %d, sent in %v); backend streams ended %d/%d, %v after the first was sent (bound %v); client connections closed %d/%d",
		len(conns), forwarded, sent, ended, forwarded, last, sent+stallTimeout+stallGrace, closed, len(conns))
	require.EqualValues(t, forwarded, ended, "backend streams still held by stalled clients")
	require.Equal(t, len(conns), closed, "stalled connections still open")
}

// A request the gateway retires (its backend reported it finished while its
// client still holds the answer unread) leaves the replicas' shared view at
// once, not when its connection is cut: another replica routing by that
// view stops seeing it. Here no write-stall timeout applies (httptest's
// server), so the stalled connections stay open throughout.
func TestRetiredRequestsLeaveTheSharedView(t *testing.T) {
	rds := startRedis(t)
	be := newStallBackend(t)
	shared := func(id string) gateway.Config {
		cfg := testConfig()
		cfg.Shared = gateway.SharedConfig{Address: rds.Addr(), ReplicaID: id}
		require.NoError(t, cfg.Shared.Validate(gateway.SharedFileFields))
		return cfg
	}
	a, asrv := runGateway(t, shared("a"), gateway.Options{}, true, be.srv.URL)
	b, _ := runGateway(t, shared("b"), gateway.Options{}, true, be.srv.URL)
	eventually(t, "the replicas see each other", func() bool { return a.Shared().Peers() == 1 && b.Shared().Peers() == 1 })
	const stalled = 4
	start := time.Now()
	for range stalled {
		stalledClient(t, asrv.Listener.Addr().String())
	}
	others := b.Shared().Endpoint(be.srv.URL)
	// b sees a's requests, then, once the backend reports them finished
	// and the credit's grace has passed, sees them leave.
	var seenAll, left time.Duration = -1, -1
	deadline := time.Now().Add(10 * time.Second)
	for left < 0 && time.Now().Before(deadline) {
		switch n := others.Others(); {
		case seenAll < 0 && n == stalled && be.received.Load() == stalled:
			seenAll = time.Since(start)
		case seenAll >= 0 && n == 0 && a.InFlight()[0] == 0:
			left = time.Since(start)
		}
		time.Sleep(time.Millisecond) // polled with a deadline
	}
	t.Logf("%d stalled clients on replica a: b saw them %v after the first was sent, saw them leave %v after; a's own count %d; backend streams ended %d",
		stalled, seenAll, left, a.InFlight()[0], be.ended.Load())
	require.GreaterOrEqual(t, seenAll, time.Duration(0), "replica b never saw a's %d requests (it sees %d)", stalled, others.Others())
	require.GreaterOrEqual(t, left, time.Duration(0), "replica b still sees %d of a's requests the backend finished (a's own count %d)",
		others.Others(), a.InFlight()[0])
	require.Zero(t, be.ended.Load(), "a stalled stream ended: the connections were cut, not retired")
}
