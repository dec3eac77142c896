package testutil

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// MemNet is an in-memory network: each Listen gets a port of its own on
// 127.0.0.1, and Dial connects to it through a net.Pipe whose ends have
// loopback addresses. Inside a testing/synctest bubble its connections
// block durably, so fake time advances while the two ends wait on each
// other (a real socket never lets it).
type MemNet struct {
	mu    sync.Mutex
	next  int
	ports map[string]*memListener
}

// NewMemNet returns an empty in-memory network.
func NewMemNet() *MemNet { return &MemNet{next: 5600, ports: make(map[string]*memListener)} }

// Listen returns a listener on the next free port.
func (n *MemNet) Listen() net.Listener {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := &memListener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: n.next}, conns: make(chan net.Conn), done: make(chan struct{})}
	n.ports[l.addr.String()] = l
	n.next++
	return l
}

// Dial connects to the listener at addr; it has the signature of
// net.Dialer.DialContext, for transports' and side channels' dial hooks.
func (n *MemNet) Dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.ports[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	a, b := net.Pipe()
	n.mu.Lock()
	client := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000 + n.next}
	n.next++
	n.mu.Unlock()
	select {
	case l.conns <- memConn{b, l.addr, client}:
		return memConn{a, client, l.addr}, nil
	case <-l.done:
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// memConn is one end of a net.Pipe with loopback addresses (which, for
// one, the KV side channel's --kv-peers check accepts).
type memConn struct {
	net.Conn
	local, remote net.Addr
}

func (c memConn) LocalAddr() net.Addr  { return c.local }
func (c memConn) RemoteAddr() net.Addr { return c.remote }

type memListener struct {
	addr  *net.TCPAddr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *memListener) Addr() net.Addr { return l.addr }
