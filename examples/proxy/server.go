package main

import (
	"flag"
	"fmt"
	"syscall"
	"time"

	"github.com/flowgate/flowgate/flowcontrol/flowhttp"
)

// serverFlags are the proxy's HTTP server hardening settings, passed to
// flowhttp's Gateway.Serve and Options. Defaults: idle keep-alive
// connections closed after 10 s, request headers within 10 s, a gated
// request body no slower than 1 KiB/s after a 5 s grace and with no pause
// over 10 s (408), 64 MiB of bodies held at once,
// 64 KiB of headers, client connections capped at half the file-descriptor
// limit with an eighth of that kept free (idle connections evicted first),
// a client that leaves its answer unread cut after 30 s, and a shutdown
// drain of at most 25 s whatever the clients do.
type serverFlags struct {
	idleTimeout       time.Duration
	headerTimeout     time.Duration
	bodyGrace         time.Duration
	minBodyRate       int64
	maxHeaderBytes    int
	maxConns          int
	reservedConns     int
	drainTimeout      time.Duration
	writeStall        time.Duration
	backendRespHeader time.Duration
	bodyIdle          time.Duration
	maxBodyMemory     int64
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 10*time.Second, "close a keep-alive connection idle this long")
	fs.DurationVar(&f.headerTimeout, "header-timeout", 10*time.Second, "a request's headers must arrive within this")
	fs.DurationVar(&f.bodyGrace, "body-grace", 5*time.Second, "time a gated request body may take before -min-body-rate applies")
	fs.Int64Var(&f.minBodyRate, "min-body-rate", 1024, "bytes/s a gated request body must keep after -body-grace (408 otherwise); -1: no limit")
	fs.DurationVar(&f.bodyIdle, "body-idle-timeout", flowhttp.DefaultBodyIdleTimeout, "cut a gated request body of which nothing arrived for this long (408)")
	fs.Int64Var(&f.maxBodyMemory, "max-body-memory", flowhttp.DefaultMaxBodyMemory,
		"bytes of gated request bodies held at once, being read or queued, all bands (429 body-memory-full over it; a quarter kept for critical)")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block (431 over it)")
	fs.IntVar(&f.maxConns, "max-conns", 0, "client connections held at most; 0: half the open-file limit")
	fs.IntVar(&f.reservedConns, "reserved-conns", -1, "connections kept free for new clients by evicting idle ones first; -1: max-conns/8")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 25*time.Second, "on SIGTERM, wait at most this long for requests in flight, then cut them")
	fs.DurationVar(&f.writeStall, "write-stall-timeout", flowhttp.DefaultWriteStallTimeout,
		"cut a client that accepts none of its answer for this long (each write of 64 KiB at most must complete within it)")
	fs.DurationVar(&f.backendRespHeader, "backend-response-header-timeout", 10*time.Minute,
		"a backend must start its answer within this (a non-streamed completion answers only when done)")
}

// config is the flags as flowhttp's ServerConfig (which fills the derived
// defaults: max-conns from the open-file limit, reserved-conns from it).
func (f *serverFlags) config() flowhttp.ServerConfig {
	reserved := f.reservedConns // validated: max-conns/8 already filled in
	if reserved == 0 {
		reserved = -1 // flowhttp's "none" (its 0 is the default)
	}
	return flowhttp.ServerConfig{ReadHeaderTimeout: f.headerTimeout, IdleTimeout: f.idleTimeout, MaxHeaderBytes: f.maxHeaderBytes,
		MaxConns: f.maxConns, ReservedConns: reserved, DrainTimeout: f.drainTimeout, WriteStallTimeout: f.writeStall}
}

// validate fills the derived defaults and checks the values.
func (f *serverFlags) validate() error {
	for name, d := range map[string]time.Duration{"idle-timeout": f.idleTimeout, "header-timeout": f.headerTimeout,
		"body-grace": f.bodyGrace, "body-idle-timeout": f.bodyIdle, "drain-timeout": f.drainTimeout, "write-stall-timeout": f.writeStall, "backend-response-header-timeout": f.backendRespHeader} {
		if d <= 0 {
			return fmt.Errorf("proxy: -%s must be > 0, got %v", name, d)
		}
	}
	if f.minBodyRate == 0 || f.minBodyRate < -1 {
		return fmt.Errorf("proxy: -min-body-rate must be > 0 or -1, got %d", f.minBodyRate)
	}
	if f.maxBodyMemory < 1<<20 {
		return fmt.Errorf("proxy: -max-body-memory must be ≥ 1 MiB, got %d", f.maxBodyMemory)
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
