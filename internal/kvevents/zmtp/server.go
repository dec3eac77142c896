package zmtp

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// conns tracks a socket's live connections so that closing the socket
// closes them, and bounds how many there are.
type conns struct {
	mu     sync.Mutex
	set    map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the goroutines serving them
}

// add tracks c unless the socket is closed or already holds max
// connections (max <= 0: no bound).
func (cs *conns) add(c net.Conn, max int) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed || max > 0 && len(cs.set) >= max {
		return false
	}
	if cs.set == nil {
		cs.set = make(map[net.Conn]struct{})
	}
	cs.set[c] = struct{}{}
	cs.wg.Add(1)
	return true
}

// done closes c and stops tracking it.
func (cs *conns) done(c net.Conn) {
	c.Close()
	cs.mu.Lock()
	delete(cs.set, c)
	cs.mu.Unlock()
	cs.wg.Done()
}

// closeAll closes every connection and waits for their goroutines.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	cs.closed = true
	for c := range cs.set {
		c.Close()
	}
	cs.mu.Unlock()
	cs.wg.Wait()
}

// server is the accept loop of a listening socket: each connection runs
// serve on its own goroutine, up to maxPeers at once.
type server struct {
	ln       net.Listener
	maxPeers int
	serve    func(net.Conn) // runs one connection until it ends
	conns    conns
	accepted sync.WaitGroup
	rejected atomic.Uint64
}

func newServer(ln net.Listener, maxPeers int, serve func(net.Conn)) *server {
	s := &server{ln: ln, maxPeers: maxPeers, serve: serve}
	s.accepted.Add(1)
	go s.acceptLoop()
	return s
}

func (s *server) acceptLoop() {
	defer s.accepted.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of file descriptors and the like
			continue
		}
		if !s.conns.add(c, s.maxPeers) {
			s.rejected.Add(1)
			c.Close()
			continue
		}
		go func() {
			defer s.conns.done(c)
			s.serve(c)
		}()
	}
}

// close stops accepting, closes every connection and waits for their
// goroutines.
func (s *server) close() {
	s.ln.Close()
	s.accepted.Wait()
	s.conns.closeAll()
}
