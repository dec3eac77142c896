package e2e

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// holdWhat says which half of a leg a relay holds when it is armed.
type holdWhat int

const (
	holdRequest  holdWhat = iota + 1 // the leg's request, before the engine reads a byte of it
	holdResponse                     // the engine's answer, before the proxy reads a byte of it
)

// legMarker starts the request line of a leg (a completion or a chat
// completion); the proxy's probes (GET /health, /metrics) and releases
// (/tandem/...) are no legs and are never held.
var legMarker = []byte("POST /v1/")

// relay is a TCP relay the test owns between the proxy and one engine's
// HTTP port: it forwards bytes both ways, and once armed it holds the next
// leg (its request or its answer) until the test lets it go on or drops it.
// That is the contract test's hook point for "a leg is in this phase now":
// no sleep decides where a fault lands.
type relay struct {
	ln     net.Listener
	target string // host:port of the engine

	mu      sync.Mutex
	armed   holdWhat // 0: forward everything
	held    chan struct{}
	decide  chan bool // true: forward the held bytes; false: drop the connection
	closing chan struct{}
}

// startRelay listens on a free loopback port and relays to target
// (host:port) until the test ends.
func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, held: make(chan struct{}, 1), decide: make(chan bool), closing: make(chan struct{})}
	go r.serve()
	t.Cleanup(func() {
		close(r.closing)
		ln.Close()
	})
	return r
}

// url is the relay's address as an engine URL for the proxy.
func (r *relay) url() string { return "http://" + r.ln.Addr().String() }

// arm makes the relay hold the next leg's request or answer.
func (r *relay) arm(what holdWhat) {
	r.mu.Lock()
	r.armed = what
	r.mu.Unlock()
	select { // a stale signal from an earlier arc
	case <-r.held:
	default:
	}
}

// disarm forgets an arm that no leg took.
func (r *relay) disarm() { r.arm(0) }

// take reports whether a hold of kind what is armed, and disarms it.
func (r *relay) take(what holdWhat) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed != what {
		return false
	}
	r.armed = 0
	return true
}

// waitHeld waits until the armed leg is held, at most limit.
func (r *relay) waitHeld(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-r.held:
	case <-time.After(limit):
		t.Fatalf("no leg reached the relay to %s within %v", r.target, limit)
	}
}

// let decides the held leg: forward it (true) or drop its connection
// (false). Only a held leg waits for it; it gives up after 10s.
func (r *relay) let(forward bool) {
	select {
	case r.decide <- forward:
	case <-r.closing:
	case <-time.After(10 * time.Second):
	}
}

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.pipe(c)
	}
}

// pipe relays one proxy connection. Either side closing closes both: an
// engine killed mid-answer is a cut connection to the proxy, a proxy gone
// is a closed connection to the engine.
func (r *relay) pipe(c net.Conn) {
	s, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		c.Close() // the engine is down: the proxy sees its connection closed
		return
	}
	var once sync.Once
	closeBoth := func() { once.Do(func() { c.Close(); s.Close() }) }
	defer closeBoth()
	var legPending sync.Mutex // guards leg
	leg := false
	setLeg := func(v bool) { legPending.Lock(); leg = v; legPending.Unlock() }
	isLeg := func() bool { legPending.Lock(); defer legPending.Unlock(); return leg }

	// hold signals the test and waits for its decision; false drops.
	hold := func() bool {
		select {
		case r.held <- struct{}{}:
		default:
		}
		select {
		case fwd := <-r.decide:
			return fwd
		case <-r.closing:
			return false
		}
	}
	go func() { // proxy to engine
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if bytes.Contains(buf[:n], legMarker) {
					setLeg(true)
					if r.take(holdRequest) && !hold() {
						return
					}
				}
				if _, werr := s.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for { // engine to proxy
		n, err := s.Read(buf)
		if n > 0 {
			if isLeg() {
				setLeg(false)
				if r.take(holdResponse) && !hold() {
					return
				}
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
