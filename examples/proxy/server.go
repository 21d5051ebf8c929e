package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// serverFlags are the proxy's HTTP server hardening settings. Defaults:
// idle keep-alive connections closed after 10 s, request headers within
// 10 s, a gated request body no slower than 1 KiB/s after a 5 s grace (408),
// 64 KiB of headers, client connections capped at half the file-descriptor
// limit with an eighth of that kept free (idle connections evicted first),
// and a shutdown drain of at most 25 s whatever the clients do.
type serverFlags struct {
	idleTimeout       time.Duration
	headerTimeout     time.Duration
	bodyGrace         time.Duration
	minBodyRate       int64
	maxHeaderBytes    int
	maxConns          int
	reservedConns     int
	drainTimeout      time.Duration
	backendRespHeader time.Duration
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 10*time.Second, "close a keep-alive connection idle this long")
	fs.DurationVar(&f.headerTimeout, "header-timeout", 10*time.Second, "a request's headers must arrive within this")
	fs.DurationVar(&f.bodyGrace, "body-grace", 5*time.Second, "time a gated request body may take before -min-body-rate applies")
	fs.Int64Var(&f.minBodyRate, "min-body-rate", 1024, "bytes/s a gated request body must keep after -body-grace (408 otherwise); -1: no limit")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block (431 over it)")
	fs.IntVar(&f.maxConns, "max-conns", 0, "client connections held at most; 0: half the open-file limit")
	fs.IntVar(&f.reservedConns, "reserved-conns", -1, "connections kept free for new clients by evicting idle ones first; -1: max-conns/8")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 25*time.Second, "on SIGTERM, wait at most this long for requests in flight, then cut them")
	fs.DurationVar(&f.backendRespHeader, "backend-response-header-timeout", 10*time.Minute,
		"a backend must start its answer within this (a non-streamed completion answers only when done)")
}

// validate fills the derived defaults and checks the values.
func (f *serverFlags) validate() error {
	for name, d := range map[string]time.Duration{"idle-timeout": f.idleTimeout, "header-timeout": f.headerTimeout,
		"body-grace": f.bodyGrace, "drain-timeout": f.drainTimeout, "backend-response-header-timeout": f.backendRespHeader} {
		if d <= 0 {
			return fmt.Errorf("proxy: -%s must be > 0, got %v", name, d)
		}
	}
	if f.minBodyRate == 0 || f.minBodyRate < -1 {
		return fmt.Errorf("proxy: -min-body-rate must be > 0 or -1, got %d", f.minBodyRate)
	}
	if f.maxHeaderBytes < 4<<10 {
		return fmt.Errorf("proxy: -max-header-bytes must be ≥ 4096, got %d", f.maxHeaderBytes)
	}
	if f.maxConns == 0 {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur > 0 && lim.Cur < 1<<30 {
			f.maxConns = int(lim.Cur / 2) // the other half: backends, scrapes, files
		} else {
			f.maxConns = 4096
		}
	}
	if f.maxConns < 2 {
		return fmt.Errorf("proxy: -max-conns must be ≥ 2, got %d", f.maxConns)
	}
	if f.reservedConns == -1 {
		f.reservedConns = max(1, f.maxConns/8)
	}
	if f.reservedConns < 0 || f.reservedConns >= f.maxConns {
		return fmt.Errorf("proxy: -reserved-conns must be in [0, max-conns), got %d", f.reservedConns)
	}
	return nil
}

// connLimiter caps the client connections the server holds. Above
// max−reserved it evicts the longest-idle keep-alive connection for every
// new one, so a client hoarding idle connections cannot take the room new
// (critical) requests need. When nothing idle can be evicted, a connection
// accepted above max−reserved is a reserved one: only critical requests
// (and GETs) are served on it (reserveForCritical); at max, a new
// connection is closed at once.
type connLimiter struct {
	net.Listener
	max, soft int

	mu    sync.Mutex
	open  int
	idle  map[net.Conn]time.Time // idle keep-alive connections, since when
	known map[net.Conn]bool      // accepted and not closed
}

func newConnLimiter(ln net.Listener, maxConns, reserved int) *connLimiter {
	return &connLimiter{Listener: ln, max: maxConns, soft: maxConns - reserved,
		idle: map[net.Conn]time.Time{}, known: map[net.Conn]bool{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if l.open >= l.soft {
			l.evictLocked()
		}
		if l.open >= l.max {
			l.mu.Unlock()
			_ = c.Close() // full, nothing idle to evict
			continue
		}
		if l.open >= l.soft {
			c = &reservedConn{c}
		}
		l.open++
		l.known[c] = true
		l.mu.Unlock()
		return c, nil
	}
}

// evictLocked closes the longest-idle connection, if any.
func (l *connLimiter) evictLocked() {
	var oldest net.Conn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	if oldest != nil {
		delete(l.idle, oldest)
		// Its room is free now: StateClosed, which follows, finds it
		// gone from known and does not count it twice.
		delete(l.known, oldest)
		l.open--
		_ = oldest.Close()
	}
}

// reservedConn is a connection accepted in the reserved headroom.
type reservedConn struct{ net.Conn }

type reservedKey struct{}

// connContext marks the requests of a reserved connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if _, ok := c.(*reservedConn); ok {
		return context.WithValue(ctx, reservedKey{}, true)
	}
	return ctx
}

// reserveForCritical serves, on a reserved connection, only GETs (health,
// models, metrics) and requests whose objective is critical (band 0);
// anything else is answered 503 overloaded and the connection closed, so
// the headroom stays for critical traffic.
func reserveForCritical(critical func(http.Header) bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(reservedKey{}) != nil && r.Method != http.MethodGet && r.Method != http.MethodHead && !critical(r.Header) {
			w.Header().Set("Connection", "close")
			flowhttp.WriteError(w, http.StatusServiceUnavailable, reasonOverloaded,
				"the proxy's free connections are kept for critical requests", true)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// reasonOverloaded answers a non-critical request on a reserved connection.
const reasonOverloaded = "overloaded"

// connState is the server's ConnState hook.
func (l *connLimiter) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateIdle:
		l.idle[c] = time.Now()
	case http.StateActive:
		delete(l.idle, c)
	case http.StateClosed, http.StateHijacked:
		delete(l.idle, c)
		if l.known[c] {
			delete(l.known, c)
			l.open--
		}
	}
}

// newServer is the proxy's hardened http.Server.
func newServer(h http.Handler, f *serverFlags) *http.Server {
	return &http.Server{
		Handler:           h,
		ConnContext:       connContext,
		ReadHeaderTimeout: f.headerTimeout,
		IdleTimeout:       f.idleTimeout,
		MaxHeaderBytes:    f.maxHeaderBytes,
	}
}

// drain shuts srv down within bound: it stops accepting, lets requests in
// flight finish, and cuts whatever is left when the bound passes.
func drain(srv *http.Server, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		_ = srv.Close()
		return fmt.Errorf("drain bound %v reached: connections still open were closed", bound)
	}
	return err
}
