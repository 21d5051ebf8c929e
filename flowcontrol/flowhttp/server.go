package flowhttp

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ServerConfig hardens the HTTP server Gateway.Serve runs. Every zero field
// takes the default given; the defaults are the example proxy's.
type ServerConfig struct {
	// ReadHeaderTimeout: a request's headers must arrive within it. 0:
	// 10 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. 0: 10 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes is the largest request header block (431 over it).
	// 0: 64 KiB.
	MaxHeaderBytes int
	// MaxConns caps the client connections held at once; a connection
	// accepted beyond it is closed at once. 0: half the process's
	// open-file limit (the other half: backends, scrapes, files), or
	// 4096 if it cannot be read.
	MaxConns int
	// ReservedConns is the headroom kept for critical requests: above
	// MaxConns − ReservedConns connections, every new connection first
	// evicts the longest-idle keep-alive one, and when none is idle it is
	// served only for critical requests (whose headers place them in band
	// 0) and GETs; anything else on it is answered 503 overloaded and the
	// connection closed. So a client hoarding connections cannot take the
	// room a critical request needs. 0: MaxConns/8 (at least 1); negative:
	// none.
	ReservedConns int
	// DrainTimeout bounds a graceful shutdown: queued requests are
	// answered 503 shutting-down at once, requests in flight get this
	// long to finish, then their connections are cut. 0: 25 s (under
	// Kubernetes' default 30 s grace period).
	DrainTimeout time.Duration
	// WriteStallTimeout bounds how long a client may leave the answer
	// unread: every write to a client connection must complete within it
	// (a write of more than 64 KiB, per 64 KiB), or the connection is
	// closed and the request's context cancelled, so its handler returns
	// and releases what it holds (its endpoint's charge, its controller
	// slot). A client that reads, however slowly, renews it with each
	// write; a response that is slow to come (a backend thinking) is not
	// bounded by it, nor does it carry over to the next request on the
	// connection. A deadline a handler sets with
	// http.ResponseController.SetWriteDeadline applies when it is the
	// earlier. 0: DefaultWriteStallTimeout; negative: none (a client may
	// hold a request for as long as it stays connected).
	WriteStallTimeout time.Duration
	// ErrorLog receives the server's connection errors. Nil: discarded.
	ErrorLog *log.Logger
}

// DefaultWriteStallTimeout is ServerConfig.WriteStallTimeout's default:
// far above a pause a reading client's network causes, and short enough
// that a client which stops reading cannot hold a backend's charge for long.
const DefaultWriteStallTimeout = 30 * time.Second

// ReasonOverloaded is the reason of a non-critical request refused on a
// connection of the reserve (ServerConfig.ReservedConns): 503.
const ReasonOverloaded = "overloaded"

// withDefaults fills the zero fields and checks the rest.
func (c ServerConfig) withDefaults() (ServerConfig, error) {
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": c.ReadHeaderTimeout, "IdleTimeout": c.IdleTimeout, "DrainTimeout": c.DrainTimeout} {
		if d < 0 {
			return c, fmt.Errorf("%w: ServerConfig.%s must be ≥ 0, got %v", ErrInvalidConfig, name, d)
		}
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 25 * time.Second
	}
	switch {
	case c.WriteStallTimeout == 0:
		c.WriteStallTimeout = DefaultWriteStallTimeout
	case c.WriteStallTimeout < 0:
		c.WriteStallTimeout = 0 // none
	}
	switch {
	case c.MaxHeaderBytes == 0:
		c.MaxHeaderBytes = 64 << 10
	case c.MaxHeaderBytes < 4<<10:
		return c, fmt.Errorf("%w: ServerConfig.MaxHeaderBytes must be ≥ 4096, got %d", ErrInvalidConfig, c.MaxHeaderBytes)
	}
	if c.MaxConns == 0 {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur > 0 && lim.Cur < 1<<30 {
			c.MaxConns = int(lim.Cur / 2)
		} else {
			c.MaxConns = 4096
		}
	}
	if c.MaxConns < 2 {
		return c, fmt.Errorf("%w: ServerConfig.MaxConns must be ≥ 2, got %d", ErrInvalidConfig, c.MaxConns)
	}
	switch {
	case c.ReservedConns == 0:
		c.ReservedConns = max(1, c.MaxConns/8)
	case c.ReservedConns < 0:
		c.ReservedConns = 0
	case c.ReservedConns >= c.MaxConns:
		return c, fmt.Errorf("%w: ServerConfig.ReservedConns must be below MaxConns (%d), got %d", ErrInvalidConfig, c.MaxConns, c.ReservedConns)
	}
	if c.ErrorLog == nil {
		c.ErrorLog = log.New(discard{}, "", 0)
	}
	return c, nil
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// ListenAndServe listens on addr (TCP) and runs Serve.
func (g *Gateway) ListenAndServe(ctx context.Context, addr string, next http.Handler, cfg ServerConfig) error {
	if _, err := cfg.withDefaults(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("flowhttp: %w", err)
	}
	return g.Serve(ctx, ln, next, cfg)
}

// Serve runs the gateway (Start, unless it is running already) and a
// hardened HTTP server on ln whose handler is Handler(next), until ctx is
// done; then it shuts down gracefully (Drain, then http.Server.Shutdown within
// cfg.DrainTimeout, then the rest cut) and closes the gateway. It returns
// nil after a clean shutdown, the server's error if it failed, or an error
// saying the drain bound cut connections. ln is closed on return.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener, next http.Handler, cfg ServerConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		_ = ln.Close()
		return err
	}
	// The gateway outlives ctx by the drain: its controller must keep
	// answering what is queued (503 shutting-down) while the server
	// shuts down, so it runs on a context ctx's end does not cancel.
	if err := g.Start(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, ErrStarted) {
		_ = ln.Close()
		return err
	}
	lim := newConnLimiter(ln, cfg.MaxConns, cfg.ReservedConns)
	lim.stall = cfg.WriteStallTimeout
	srv := &http.Server{
		Handler:           reserveForCritical(g.critical, lim.release, g.Handler(next)),
		ConnContext:       connContext,
		ConnState:         lim.connState,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          cfg.ErrorLog,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim) }()
	select {
	case err := <-served:
		g.Close()
		return fmt.Errorf("flowhttp: serve: %w", err)
	case <-ctx.Done():
	}
	g.Drain()
	err = drain(srv, cfg.DrainTimeout)
	<-served // http.ErrServerClosed
	g.Close()
	return err
}

// drain shuts srv down within bound: it stops accepting, lets requests in
// flight finish, and cuts whatever is left when the bound passes.
func drain(srv *http.Server, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		_ = srv.Close()
		return fmt.Errorf("flowhttp: drain bound %v reached: connections still open were closed", bound)
	}
	return err
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
	stall     time.Duration // ServerConfig.WriteStallTimeout; 0: none

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
		if l.stall > 0 {
			c = &stallConn{Conn: c, timeout: l.stall}
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

// release frees c's room now, ahead of its close: StateClosed, which
// follows, finds it gone from known and does not count it twice.
func (l *connLimiter) release(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.known[c] {
		delete(l.known, c)
		delete(l.idle, c)
		l.open--
	}
}

// stallChunk is the most a stallConn writes under one deadline, so that a
// large write is bounded by the client's progress, not by its size.
const stallChunk = 64 << 10

// stallConn is a client connection whose every write must complete within
// timeout (ServerConfig.WriteStallTimeout): each write, 64 KiB at most,
// first moves the write deadline to now + timeout, or to the deadline the
// server or a handler set (SetWriteDeadline, SetDeadline) when that is
// earlier. A deadline passed fails the write; net/http then cancels the
// request's context and closes the connection.
type stallConn struct {
	net.Conn
	timeout time.Duration
	// set is the write deadline last set through the connection, in Unix
	// nanoseconds; 0: none.
	set atomic.Int64
}

func (c *stallConn) Write(b []byte) (int, error) {
	written := 0
	for {
		d := time.Now().Add(c.timeout)
		if s := c.set.Load(); s != 0 && s < d.UnixNano() {
			d = time.Unix(0, s)
		}
		if err := c.Conn.SetWriteDeadline(d); err != nil {
			return written, err
		}
		p := b[written:]
		if len(p) > stallChunk {
			p = p[:stallChunk]
		}
		n, err := c.Conn.Write(p)
		written += n
		if err != nil || written == len(b) {
			return written, err
		}
	}
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) remember(t time.Time) {
	if t.IsZero() {
		c.set.Store(0)
	} else {
		c.set.Store(t.UnixNano())
	}
}

// reservedConn is a connection accepted in the reserved headroom.
type reservedConn struct{ net.Conn }

type reservedKey struct{}

// connContext marks the requests of a reserved connection with it.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if rc, ok := c.(*reservedConn); ok {
		return context.WithValue(ctx, reservedKey{}, rc)
	}
	return ctx
}

// reserveForCritical serves, on a reserved connection, only GETs (health,
// models, metrics) and critical requests; anything else is answered 503
// overloaded and the connection closed, so the headroom stays for critical
// traffic. The refused connection's room is freed (release) before the
// answer leaves: the client reads "Connection: close" and may dial again
// (its next request critical) before the server has closed the old one,
// and that new connection must not find the room still taken and be
// closed at accept. For that instant the process may hold one connection
// beyond MaxConns, the one being closed.
func reserveForCritical(critical func(*http.Request) bool, release func(net.Conn), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc, ok := r.Context().Value(reservedKey{}).(*reservedConn); ok && r.Method != http.MethodGet && r.Method != http.MethodHead && !critical(r) {
			release(rc)
			w.Header().Set("Connection", "close")
			WriteError(w, http.StatusServiceUnavailable, ReasonOverloaded,
				"the gateway's free connections are kept for critical requests", true)
			return
		}
		next.ServeHTTP(w, r)
	})
}

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
