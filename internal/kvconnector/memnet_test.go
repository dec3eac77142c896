package kvconnector

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// memNet is an in-memory network for side channels: each listen gets a
// port of its own on 127.0.0.1, and dial connects to it through a
// net.Pipe whose ends have loopback addresses. Inside a testing/synctest bubble its connections block
// durably, so fake time advances while engines wait on each other.
type memNet struct {
	mu    sync.Mutex
	next  int
	ports map[string]*memListener
}

func newMemNet() *memNet { return &memNet{next: 5600, ports: make(map[string]*memListener)} }

// listen returns a listener on the next free port.
func (n *memNet) listen() *memListener {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := &memListener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: n.next}, conns: make(chan net.Conn), done: make(chan struct{})}
	n.ports[l.addr.String()] = l
	n.next++
	return l
}

// dial connects to the listener at addr, as kvxfer.ConsumerConfig.Dial.
func (n *memNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
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

// memConn is one end of a net.Pipe with loopback addresses, which the
// side channel's --kv-peers check accepts.
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
