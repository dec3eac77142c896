package zmtp

import (
	"fmt"
	"net"
)

// A Handler answers one request on a RouterSocket: reply writes one
// message back to the requester (buffered; the socket flushes when the
// handler returns). An error closes the connection.
type Handler func(msg [][]byte, reply func(frames ...[]byte) error) error

// RouterSocket is a ZMQ ROUTER socket that answers requests: each
// connection's messages go, in order, to its Handler, whose replies go back
// on the same connection (libzmq's ROUTER routes them by the identity frame
// it adds; here the connection is the identity, so the handler sees the
// request as the peer sent it).
type RouterSocket struct {
	opts    Options
	handler Handler
	srv     *server
}

// ListenRouter binds a ROUTER socket to addr (host:port) serving requests
// with h, up to opts.MaxPeers connections at once.
func ListenRouter(addr string, h Handler, opts Options) (*RouterSocket, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", addr, err)
	}
	s := &RouterSocket{opts: opts.withDefaults(), handler: h}
	s.srv = newServer(ln, s.opts.MaxPeers, s.serve)
	return s, nil
}

// Addr is the bound address.
func (s *RouterSocket) Addr() net.Addr { return s.srv.ln.Addr() }

// Rejected counts the connections closed on accept because the socket
// held opts.MaxPeers already.
func (s *RouterSocket) Rejected() uint64 { return s.srv.rejected.Load() }

// Close closes the socket and its connections.
func (s *RouterSocket) Close() { s.srv.close() }

// serve runs one connection; the server closes c.
func (s *RouterSocket) serve(c net.Conn) {
	z, err := Handshake(c, ROUTER, true, s.opts)
	if err != nil {
		s.opts.Logger.Debug("zmtp: router handshake", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	for {
		msg, err := z.ReadMsg(nil)
		if err != nil {
			return
		}
		if err := s.handler(msg, z.Write); err != nil {
			s.opts.Logger.Debug("zmtp: router handler", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		if err := z.Flush(); err != nil {
			return
		}
	}
}
