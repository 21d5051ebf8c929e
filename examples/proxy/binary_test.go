package main

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

// The black-box tests build the proxy binary once and exec it.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func proxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "flowgate-proxy-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "proxy")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

func removeBinary() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

var listeningRe = regexp.MustCompile(`listening on http://(\S+)`)

// running is a proxy process.
type running struct {
	cmd    *exec.Cmd
	addr   string
	exited chan error    // the exit status, once
	done   chan struct{} // closed on exit
	log    *strings.Builder
	mu     *sync.Mutex
}

// runProxy execs the binary (through sh with a file-descriptor limit when
// nofile > 0) in front of backend, and waits for its listening line.
func runProxy(t *testing.T, nofile int, backend string, args ...string) *running {
	t.Helper()
	return runProxyAs(t, nofile, backend, append([]string{"-trust-objective-header"}, args...)...)
}

// runProxyAs is runProxy without -trust-objective-header: the proxy as it
// ships, where a client's objective header can only lower its band.
func runProxyAs(t *testing.T, nofile int, backend string, args ...string) *running {
	t.Helper()
	bin := proxyBinary(t)
	args = append([]string{"-addr", "127.0.0.1:0", "-backends", backend}, args...)
	var cmd *exec.Cmd
	if nofile > 0 {
		cmd = exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := &running{cmd: cmd, exited: make(chan error, 1), done: make(chan struct{}), log: &strings.Builder{}, mu: &sync.Mutex{}}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			r.mu.Lock()
			r.log.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
			if m := listeningRe.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		r.exited <- cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
		}
	})
	select {
	case r.addr = <-addr:
	case err := <-r.exited:
		t.Fatalf("the proxy exited before listening: %v\n%s", err, r.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy did not listen within 30 s\n%s", r.logs())
	}
	return r
}

func (r *running) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// roundTrip writes a raw request on a new connection and reads the answer.
func dialAndAsk(t *testing.T, addr, raw string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c, br, resp
}

// closedWithin reports whether the server closes c (EOF or reset) within d.
func closedWithin(c net.Conn, br *bufio.Reader, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := br.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

// Idle keep-alive connections are closed after -idle-timeout. In parallel
// with the package's other slow tests (see TestBinaryReplicasShareInFlight).
func TestBinaryIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	b := newStub(t, 50)
	r := runProxy(t, 0, b.srv.URL, "-idle-timeout", "300ms")
	type conn struct {
		c  net.Conn
		br *bufio.Reader
	}
	var conns []conn
	for range 20 {
		c, br, resp := dialAndAsk(t, r.addr, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
		defer c.Close()
		require.False(t, resp.Close, "a keep-alive answer")
		conns = append(conns, conn{c, br})
	}
	began := time.Now()
	for i, c := range conns {
		require.True(t, closedWithin(c.c, c.br, 5*time.Second), "idle connection %d still open after %v", i, time.Since(began))
	}
	require.Less(t, time.Since(began), 3*time.Second)
}

// A request's headers must arrive within -header-timeout; a header block
// over -max-header-bytes is refused 431.
func TestBinaryHeaderTimeoutAndMaxHeaderBytes(t *testing.T) {
	b := newStub(t, 50)
	r := runProxy(t, 0, b.srv.URL, "-header-timeout", "300ms", "-max-header-bytes", "8192")
	c, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n") // and never the end
	require.NoError(t, err)
	began := time.Now()
	require.True(t, closedWithin(c, bufio.NewReader(c), 5*time.Second), "half-sent headers held the connection")
	require.Less(t, time.Since(began), 3*time.Second)

	big := "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\n\r\n"
	c2, _, resp := dialAndAsk(t, r.addr, big)
	defer c2.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// dribble writes one byte every period until stop or an error.
func dribble(c net.Conn, period time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}
}

// A gated body dribbled slower than -min-body-rate is answered 408 once
// -body-grace has passed.
func TestBinaryDribbledBodyAnswered(t *testing.T) {
	b := newStub(t, 50)
	r := runProxy(t, 0, b.srv.URL, "-body-grace", "200ms", "-min-body-rate", "1024")
	c, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s: critical\r\nContent-Length: 100000\r\n\r\n", gateway.ObjectiveHeader)
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	go dribble(c, 50*time.Millisecond, stop) // 20 B/s
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "a dribbled body was never answered")
	resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Equal(t, gateway.ReasonBodyTimeout, resp.Header.Get(gateway.ReasonHeader))
	require.Less(t, time.Since(began), 3*time.Second)
}

// Under a file-descriptor limit, a client hoarding idle keep-alive
// connections does not keep critical requests out: idle connections are
// evicted to make room.
func TestBinaryFDHeadroomForCritical(t *testing.T) {
	b := newStub(t, 50)
	// max-conns 128, 16 kept free; idle connections do not time out
	// during the test.
	r := runProxy(t, 256, b.srv.URL, "-idle-timeout", "1m")
	var hoard []net.Conn
	defer func() {
		for _, c := range hoard {
			c.Close()
		}
	}()
	for range 300 {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			break
		}
		hoard = append(hoard, c)
		if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			break
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			break // the proxy takes no more connections
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	t.Logf("hoarding %d connections", len(hoard))
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	served := 0
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.addr+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":2}`))
		req.Header.Set(gateway.ObjectiveHeader, "critical")
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				served++
			}
		}
	}
	require.Equal(t, 3, served, "critical requests served beside %d hoarded connections\n%s", len(hoard), r.logs())
}

// SIGTERM with clients dribbling bodies (no body-rate limit, so only the
// drain bound can end them) exits within -drain-timeout.
func TestBinarySIGTERMDrainBounded(t *testing.T) {
	b := newStub(t, 50)
	r := runProxy(t, 0, b.srv.URL, "-drain-timeout", "500ms", "-min-body-rate", "-1")
	stop := make(chan struct{})
	defer close(stop)
	for range 2 {
		c, err := net.Dial("tcp", r.addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
		require.NoError(t, err)
		go dribble(c, 100*time.Millisecond, stop)
	}
	// Both are being read (active) before the signal.
	ask := func() {
		c, _, _ := dialAndAsk(t, r.addr, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		c.Close()
	}
	ask()
	began := time.Now()
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-r.exited:
		require.NoError(t, err, "%s", r.logs())
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10 s after SIGTERM\n%s", r.logs())
	}
	took := time.Since(began)
	require.Less(t, took, 2500*time.Millisecond, "drain took %v\n%s", took, r.logs())
	require.GreaterOrEqual(t, took, 400*time.Millisecond, "the dribblers should have held it to the bound")
	require.Contains(t, r.logs(), "drain bound")
}

// When the connections above max−reserved cannot be made by evicting idle
// ones (every connection is busy), the reserved headroom serves critical
// requests only: a sheddable request there is answered 503 overloaded.
func TestBinaryReservedConnsForCritical(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 64)
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get(gateway.ObjectiveHeader), "hold") {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			started <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	defer close(release)
	// Objectives: "hold" is a critical objective that the backend holds
	// open, so 15 connections stay busy.
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte("flowControl:\n  objectives: {hold: critical}\n"), 0o600))
	r := runProxy(t, 0, b.srv.URL, "-config", cfgPath, "-max-conns", "20", "-reserved-conns", "5",
		"-min-body-rate", "-1")
	var busy []net.Conn
	defer func() {
		for _, c := range busy {
			c.Close()
		}
	}()
	for range 15 {
		c, err := net.Dial("tcp", r.addr)
		require.NoError(t, err)
		busy = append(busy, c)
		_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s: hold\r\nContent-Length: 2\r\n\r\n{}", gateway.ObjectiveHeader)
		require.NoError(t, err)
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("held request %d did not reach the backend\n%s", len(busy), r.logs())
		}
	}
	ask := func(objective string) (int, string) {
		c, _, resp := dialAndAsk(t, r.addr, fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s: %s\r\nContent-Length: 2\r\n\r\n{}",
			gateway.ObjectiveHeader, objective))
		c.Close()
		return resp.StatusCode, resp.Header.Get(gateway.ReasonHeader)
	}
	code, reason := ask("sheddable")
	require.Equal(t, http.StatusServiceUnavailable, code, "a sheddable request took reserved room")
	require.Equal(t, "overloaded", reason)
	for range 3 {
		code, _ = ask("critical")
		require.Equal(t, http.StatusOK, code, "critical request on the reserved room\n%s", r.logs())
	}
}

// rssOf reads a process's resident set size from /proc.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// 48 uploads that send 8 MiB (of a declared 8 MiB, one byte short) and stall
// cannot grow the proxy's memory without bound: at the default body memory
// budget its RSS grows by at most 200 MiB (at b5562a5, before the budget: +590 MiB,
// all 48 held),
// the uploads beyond the budget are refused 429 body-memory-full, and a
// critical request sent meanwhile is served.
//
// In parallel with the package's other slow tests: its RSS is the proxy
// process's own, and its 3 s are mostly a wait.
func TestBinaryStalledUploadsBoundedRSS(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to read the proxy's RSS")
	}
	b := newStub(t, 50)
	r := runProxy(t, 0, b.srv.URL)
	pid := r.cmd.Process.Pid
	base := rssOf(t, pid)
	const uploads, size = 48, 8 << 20
	chunk := make([]byte, 64<<10)
	var wg sync.WaitGroup
	var stalled sync.WaitGroup
	var mu sync.Mutex
	outcome := map[string]int{}
	stop := make(chan struct{})
	for range uploads {
		wg.Add(1)
		stalled.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", r.addr)
			if err != nil {
				stalled.Done()
				return
			}
			defer c.Close()
			_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s: sheddable\r\nContent-Length: %d\r\n\r\n", gateway.ObjectiveHeader, size)
			sent := 0
			for err == nil && sent < size-1 {
				n := min(len(chunk), size-1-sent)
				n, err = c.Write(chunk[:n])
				sent += n
			}
			what := "stalled"
			if err != nil {
				what = "cut while sending"
			} else {
				// All but the last byte sent: the proxy holds it, or
				// has refused it already (an answer is waiting).
				_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if resp, rerr := http.ReadResponse(bufio.NewReader(c), nil); rerr == nil {
					what = fmt.Sprintf("answered %d %s", resp.StatusCode, resp.Header.Get(gateway.ReasonHeader))
				}
			}
			mu.Lock()
			outcome[what]++
			mu.Unlock()
			stalled.Done()
			<-stop
		}()
	}
	stalled.Wait()
	began := time.Now()
	// A critical request beside them.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.addr+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":2}`))
	req.Header.Set(gateway.ObjectiveHeader, "critical")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the critical request beside the stalled uploads")
	// RSS now and 3 s after every upload had sent what it would.
	peak := rssOf(t, pid)
	time.Sleep(time.Until(began.Add(3 * time.Second))) // a measurement instant, not a wait for a condition
	peak = max(peak, rssOf(t, pid))
	mu.Lock()
	t.Logf("48 uploads of 8 MiB − 1 byte, then stalled: %v; RSS %.0f → %.0f MiB (+%.0f MiB)", outcome,
		float64(base)/(1<<20), float64(peak)/(1<<20), float64(peak-base)/(1<<20))
	held := outcome["stalled"]
	mu.Unlock()
	require.LessOrEqual(t, peak-base, int64(200<<20))
	require.Less(t, held, uploads, "every upload held: the budget did not refuse any")
	close(stop)
	wg.Wait()
}

// TestBinaryClientCannotClaimCritical: against the built proxy as it ships
// (no -trust-objective-header), a client without a key that asks for the
// critical band, by header or by a body "priority" of 0, lands in the
// sheddable band and the server sees the granted band's priority; a client
// whose API key grants critical gets it. The attacks of issue 31 (a body
// "priority":0, vLLM's own default, placed a request in band 0) run against
// the binary, not only the library.
func TestBinaryClientCannotClaimCritical(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	b := newCustom(t, idleVLLM, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(body))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	keys := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(keys, []byte("k-trusted tenant-a critical\n"), 0o600))
	r := runProxyAs(t, 0, b.srv.URL, "-api-keys", keys)
	ask := func(header, auth, body string) string {
		raw := "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
		if header != "" {
			raw += gateway.ObjectiveHeader + ": " + header + "\r\n"
		}
		if auth != "" {
			raw += "Authorization: Bearer " + auth + "\r\n"
		}
		raw += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
		c, _, resp := dialAndAsk(t, r.addr, raw)
		c.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, r.logs())
		return resp.Header.Get(gateway.BandHeader)
	}
	for _, tc := range []struct{ what, header, body string }{
		{"body priority 0", "", `{"prompt":"x","priority":0}`},
		{"body priority -1", "", `{"prompt":"x","priority":-1}`},
		{"duplicate keys ending in 0", "", `{"prompt":"x","priority":5,"priority":0}`},
		{"escaped key", "", `{"prompt":"x","\u0070riority":0}`},
		{"critical header", "critical", `{"prompt":"x"}`},
		{"dotted capital I", "CR\u0130T\u0130CAL", `{"prompt":"x"}`},
	} {
		require.Equal(t, "sheddable", ask(tc.header, "", tc.body), tc.what)
	}
	require.Equal(t, "critical", ask("", "k-trusted", `{"prompt":"x"}`), "a key granted critical")
	require.Equal(t, "sheddable", ask("sheddable", "k-trusted", `{"prompt":"x"}`), "a client may lower itself")
	mu.Lock()
	defer mu.Unlock()
	for _, body := range bodies[:6] {
		require.NotContains(t, body, `"priority":0`, "a client's claim reached the server: %s", body)
	}
}

// binaryWriteStall, when set, is the -write-stall-timeout
// TestBinaryStalledReaders runs the proxy with in place of
// binaryStallTimeout, the bound it checks against: a large value (-args
// -binary-write-stall-timeout 1h) shows the test fails without the timeout.
var binaryWriteStall = flag.Duration("binary-write-stall-timeout", 0, "run TestBinaryStalledReaders' proxy with this -write-stall-timeout (0: binaryStallTimeout)")

const binaryStallTimeout = time.Second

// TestBinaryStalledReaders: the attack of issue 31 against the proxy as it
// ships, with a short -write-stall-timeout, in front of two backends that
// stream 64 MiB answers and report each request finished 20 ms after it
// arrives. Seven clients per backend send a streaming completion and never
// read. Sheddable probes sent once the backends are idle are served within
// the credit's grace and a scrape, and the stalled connections are closed
// (their backend streams cancelled) within binaryStallTimeout plus
// stallGrace of the last one sent.
func TestBinaryStalledReaders(t *testing.T) {
	run := cmp.Or(*binaryWriteStall, binaryStallTimeout)
	r := &stallRig{backends: []*stallBackend{newStallBackend(t), newStallBackend(t)}, client: &http.Client{Transport: &http.Transport{}}}
	proc := runProxyAs(t, 0, r.backends[0].srv.URL+","+r.backends[1].srv.URL, "-write-stall-timeout", run.String())
	r.addr = proc.addr
	t.Cleanup(r.client.CloseIdleConnections)
	base := r.idleProbes(t)
	start := time.Now()
	conns, forwarded := r.stall(t, stalledPerPod*len(r.backends))
	sent := time.Since(start)
	probed := r.probeAfterStall(t)
	bound := sent + binaryStallTimeout + stallGrace
	ended, last, closed := r.cut(conns, forwarded, start, start.Add(bound))
	t.Logf("-write-stall-timeout %v; stalled clients %d (forwarded %d, sent in %v); idle-pool probes p50 %v max %v; after the stall: %v; backend streams ended %d/%d, the last %v after the first stall was sent (bound %v); client connections closed %d/%d",
		run, len(conns), forwarded, sent, base[len(base)/2], base[len(base)-1], probed, ended, forwarded, last, bound, closed, len(conns))
	probed.check(t)
	require.EqualValues(t, forwarded, ended, "backend streams still held by stalled clients\n%s", proc.logs())
	require.Equal(t, len(conns), closed, "stalled connections still open")
}
