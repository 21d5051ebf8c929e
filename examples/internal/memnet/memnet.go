// Package memnet is an in-memory network for HTTP servers and clients in one
// process: a listener's connections are net.Pipe pairs, made by dialling its
// address. A goroutine blocked on such a connection is blocked on a channel,
// so servers and clients on it run inside a testing/synctest bubble, on its
// virtual clock; on loopback sockets they could not.
package memnet

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Network is a set of listeners, each with an address of its own. The zero
// value is ready to use.
type Network struct {
	mu        sync.Mutex
	listeners map[string]*Listener
}

// Listen returns a new listener and the base URL ("http://" and its address)
// to reach it with a client using DialContext.
func (n *Network) Listen() (*Listener, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listeners == nil {
		n.listeners = map[string]*Listener{}
	}
	addr := fmt.Sprintf("mem%d:80", len(n.listeners)+1)
	l := &Listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[addr] = l
	return l, "http://" + addr
}

// DialContext connects to the listener at addr (host:port, as an
// http.Transport passes it). It fails if there is none or it is closed, and
// waits for Accept otherwise, until ctx is done.
func (n *Network) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("memnet: no listener at %s", addr)}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.ErrClosed}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Listener is a net.Listener on a Network.
type Listener struct {
	addr  string
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

// Accept waits for a dial and returns the server's end of its connection;
// after Close it returns net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and refuses later dials. Connections already accepted
// stay open. Idempotent.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return addr(l.addr) }

type addr string

func (addr) Network() string  { return "memnet" }
func (a addr) String() string { return string(a) }
