package zmtp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// redialInterval is how soon DialPub dials again after a failed dial or a
// lost connection: libzmq's ZMQ_RECONNECT_IVL default, with its
// ZMQ_RECONNECT_IVL_MAX default (0: no backoff), which is what vLLM's
// pyzmq publisher runs with. A subscriber that binds late thus gets the
// batches from at most 100 ms after it starts, however long the engine
// has been dialing; a refused dial costs a round trip.
const redialInterval = 100 * time.Millisecond

// PubSocket is a ZMQ PUB socket: it sends each message to every peer
// subscribed to a prefix of the message's first frame, through a queue of
// opts.HWM messages per peer, written by that peer's own goroutine; a full
// queue drops the message for that peer only. Its methods are safe for
// concurrent use.
type PubSocket struct {
	opts Options
	srv  *server // ListenPub

	// DialPub.
	dialConns  conns
	cancelDial context.CancelFunc
	dialDone   chan struct{}

	mu    sync.Mutex
	peers map[*pubPeer]struct{} // nil once closed

	closing sync.Once
}

// ListenPub binds a PUB socket to addr (host:port) and accepts up to
// opts.MaxPeers subscribers at once.
func ListenPub(addr string, opts Options) (*PubSocket, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", addr, err)
	}
	s := &PubSocket{opts: opts.withDefaults(), peers: make(map[*pubPeer]struct{})}
	s.srv = newServer(ln, s.opts.MaxPeers, func(c net.Conn) { s.servePeer(c, true) })
	return s, nil
}

// DialPub connects a PUB socket to a subscriber that binds addr, and keeps
// one connection to it, redialing every 100 ms (as libzmq does by default)
// until Close.
func DialPub(addr string, opts Options) *PubSocket {
	ctx, cancel := context.WithCancel(context.Background())
	s := &PubSocket{opts: opts.withDefaults(), peers: make(map[*pubPeer]struct{}), cancelDial: cancel, dialDone: make(chan struct{})}
	go s.dialLoop(ctx, addr)
	return s
}

// Addr is the bound address (nil for DialPub).
func (s *PubSocket) Addr() net.Addr {
	if s.srv == nil {
		return nil
	}
	return s.srv.ln.Addr()
}

func (s *PubSocket) dialLoop(ctx context.Context, addr string) {
	defer close(s.dialDone)
	for {
		c, err := s.opts.Dial(ctx, "tcp", addr)
		if err == nil {
			if !s.dialConns.add(c, 0) { // closed
				c.Close()
				return
			}
			s.servePeer(c, false)
			s.dialConns.done(c)
		} else {
			s.opts.Logger.Debug("zmtp: dial subscriber", "addr", addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(redialInterval):
		}
	}
}

// servePeer runs one subscriber connection until it fails or the socket
// closes; the caller closes c.
func (s *PubSocket) servePeer(c net.Conn, asServer bool) {
	z, err := Handshake(c, PUB, asServer, s.opts)
	if err != nil {
		s.opts.Logger.Debug("zmtp: subscriber handshake", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	pp := &pubPeer{z: z, q: make(chan [][]byte, s.opts.HWM), done: make(chan struct{}), written: make(chan struct{})}
	s.mu.Lock()
	if s.peers == nil { // closing
		s.mu.Unlock()
		return
	}
	s.peers[pp] = struct{}{}
	s.mu.Unlock()
	go pp.writeLoop()
	pp.readLoop() // until the connection ends
	s.mu.Lock()
	delete(s.peers, pp)
	s.mu.Unlock()
	pp.close()
	<-pp.written
}

// Publish queues msg for every peer subscribed to a prefix of msg[0] and
// returns how many peers it was dropped for, their queues full. It never
// blocks on a peer. msg's frames must not change afterwards.
func (s *PubSocket) Publish(msg [][]byte) (dropped int) {
	if len(msg) == 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for pp := range s.peers {
		if !pp.subscribed(msg[0]) {
			continue
		}
		pp.unsent.Add(1)
		select {
		case pp.q <- msg:
		default:
			pp.unsent.Add(-1)
			dropped++
		}
	}
	return dropped
}

// Subscribers is the number of connected peers with a subscription.
func (s *PubSocket) Subscribers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for pp := range s.peers {
		pp.smu.Lock()
		if len(pp.topics) > 0 {
			n++
		}
		pp.smu.Unlock()
	}
	return n
}

// Unsent is the number of messages queued for peers and not yet written.
func (s *PubSocket) Unsent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for pp := range s.peers {
		n += int(pp.unsent.Load())
	}
	return n
}

// Rejected counts the connections closed on accept because the socket
// held opts.MaxPeers already.
func (s *PubSocket) Rejected() uint64 {
	if s.srv == nil {
		return 0
	}
	return s.srv.rejected.Load()
}

// Close closes the socket and its connections; what is queued is dropped.
func (s *PubSocket) Close() {
	s.closing.Do(func() {
		s.mu.Lock()
		peers := s.peers
		s.peers = nil
		s.mu.Unlock()
		for pp := range peers {
			pp.close()
		}
		if s.srv != nil {
			s.srv.close()
		} else {
			s.cancelDial()
			s.dialConns.closeAll()
			<-s.dialDone
		}
	})
}

// pubPeer is one subscriber of a PubSocket: its subscriptions and its
// queue (the high-water mark).
type pubPeer struct {
	z       *Conn
	q       chan [][]byte
	unsent  atomic.Int64 // messages queued and not yet written and flushed
	once    sync.Once
	done    chan struct{}
	written chan struct{} // closed when writeLoop returns

	smu    sync.Mutex
	topics []string
}

func (pp *pubPeer) close() {
	pp.once.Do(func() {
		close(pp.done)
		pp.z.nc.Close()
	})
}

func (pp *pubPeer) subscribed(topic []byte) bool {
	pp.smu.Lock()
	defer pp.smu.Unlock()
	for _, t := range pp.topics {
		if strings.HasPrefix(string(topic), t) {
			return true
		}
	}
	return false
}

// maxTopics bounds one peer's subscriptions.
const maxTopics = 1024

func (pp *pubPeer) subscribe(topic []byte, on bool) {
	pp.smu.Lock()
	defer pp.smu.Unlock()
	t := string(topic)
	for i, s := range pp.topics {
		if s == t {
			if !on {
				pp.topics = append(pp.topics[:i], pp.topics[i+1:]...)
			}
			return
		}
	}
	if on && len(pp.topics) < maxTopics {
		pp.topics = append(pp.topics, t)
	}
}

// readLoop reads subscriptions: ZMTP 3.0 messages starting with 1
// (subscribe) or 0 (cancel), ZMTP 3.1 SUBSCRIBE and CANCEL commands.
func (pp *pubPeer) readLoop() {
	onCommand := func(name string, data []byte) error {
		switch name {
		case "SUBSCRIBE":
			pp.subscribe(data, true)
		case "CANCEL":
			pp.subscribe(data, false)
		}
		return nil
	}
	for {
		parts, err := pp.z.ReadMsg(onCommand)
		if err != nil {
			return
		}
		if len(parts) == 1 && len(parts[0]) > 0 && parts[0][0] <= 1 {
			pp.subscribe(parts[0][1:], parts[0][0] == 1)
		}
	}
}

// writeLoop writes the peer's queue, flushing when it runs empty.
func (pp *pubPeer) writeLoop() {
	defer close(pp.written)
	for {
		select {
		case <-pp.done:
			return
		case msg := <-pp.q:
			err := pp.z.Write(msg...)
			if err == nil && len(pp.q) == 0 {
				err = pp.z.Flush()
			}
			pp.unsent.Add(-1)
			if err != nil {
				pp.close()
				return
			}
		}
	}
}
