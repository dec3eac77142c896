package e2e

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// holdWhat says which half of a leg a gate holds when it is armed.
type holdWhat int

const (
	holdRequest  holdWhat = iota + 1 // the leg's request, before the engine reads a byte of it
	holdResponse                     // the engine's answer, before the proxy reads a byte of it
)

// legMarker starts the request line of a leg (a completion or a chat
// completion); the proxy's probes (GET /health, /metrics) and releases
// (/tandem/...) are no legs and are never held.
var legMarker = []byte("POST /v1/")

// gate is the contract test's hook point for "a leg is in this phase
// now": armed, it makes the first relay that sees a leg of the armed kind
// hold it until the test lets it go on or drops it. One gate serves the
// relays of several engines (the decodes), and says which one holds.
type gate struct {
	mu     sync.Mutex
	armed  holdWhat // 0: hold nothing
	held   chan *relay
	gone   chan struct{} // the proxy closed the held leg's connection
	decide chan bool     // true: forward the held bytes; false: drop the connection
	done   chan struct{}
}

func newGate(t *testing.T) *gate {
	g := &gate{held: make(chan *relay, 1), gone: make(chan struct{}, 1), decide: make(chan bool), done: make(chan struct{})}
	t.Cleanup(func() { close(g.done) })
	return g
}

// arm makes the gate hold the next leg's request or answer.
func (g *gate) arm(what holdWhat) {
	g.mu.Lock()
	g.armed = what
	g.mu.Unlock()
	drain(g.held) // signals from an earlier arc
	drain(g.gone)
}

// drain empties a buffered channel.
func drain[T any](ch chan T) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// take reports whether a hold of kind what is armed, and disarms it.
func (g *gate) take(what holdWhat) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed != what {
		return false
	}
	g.armed = 0
	return true
}

// waitHeld waits until the armed leg is held, at most limit, and returns
// the relay that holds it.
func (g *gate) waitHeld(t *testing.T, limit time.Duration) *relay {
	t.Helper()
	select {
	case r := <-g.held:
		return r
	case <-time.After(limit):
		t.Fatalf("no leg reached the gate within %v", limit)
		return nil
	}
}

// waitGone waits until the proxy has closed the connection of the held
// leg (it gave up on the leg), at most limit.
func (g *gate) waitGone(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-g.gone:
	case <-time.After(limit):
		t.Fatalf("the proxy did not give up on the held leg within %v", limit)
	}
}

// let decides the held leg: forward it (true) or drop its connection
// (false). Only a held leg waits for it; it gives up after 10s.
func (g *gate) let(forward bool) {
	select {
	case g.decide <- forward:
	case <-g.done:
	case <-time.After(10 * time.Second):
	}
}

// hold signals that r holds a leg and waits for the test's decision, or
// for the proxy's side of the connection to close (peerGone), which drops
// the leg whatever the test decides: an engine never gets a leg whose
// proxy went away before sending it.
func (g *gate) hold(r *relay, peerGone <-chan struct{}) bool {
	select {
	case g.held <- r:
	default:
	}
	for {
		select {
		case fwd := <-g.decide:
			select {
			case <-peerGone:
				return false
			default:
				return fwd
			}
		case <-peerGone:
			peerGone = nil // said once
			select {
			case g.gone <- struct{}{}:
			default:
			}
		case <-g.done:
			return false
		}
	}
}

// relay is a TCP relay the test owns between the proxy and one engine's
// HTTP port: it forwards bytes both ways and lets its gate hold a leg.
// No sleep decides where a fault lands.
type relay struct {
	ln     net.Listener
	target string // host:port of the engine
	gate   *gate
}

// startRelay listens on a free loopback port and relays to target
// (host:port) until the test ends.
func startRelay(t *testing.T, target string, g *gate) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, gate: g}
	go r.serve()
	t.Cleanup(func() { ln.Close() })
	return r
}

// url is the relay's address as an engine URL for the proxy.
func (r *relay) url() string { return "http://" + r.ln.Addr().String() }

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.pipe(c)
	}
}

// chunk is one read from a connection.
type chunk struct {
	b   []byte
	err error
}

// reads reads c into a channel until an error, which is its last chunk;
// gone closes then. It stops early when quit closes.
func reads(c net.Conn, gone chan struct{}, quit <-chan struct{}) <-chan chunk {
	ch := make(chan chunk, 64)
	go func() {
		defer close(gone)
		for {
			buf := make([]byte, 64<<10)
			n, err := c.Read(buf)
			select {
			case ch <- chunk{buf[:n], err}:
			case <-quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
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
	quit := make(chan struct{})
	closeBoth := func() { once.Do(func() { close(quit); c.Close(); s.Close() }) }
	defer closeBoth()
	var mu sync.Mutex
	leg := false // a leg's request went to the engine, its answer has not come back yet
	setLeg := func(v bool) { mu.Lock(); leg = v; mu.Unlock() }
	isLeg := func() bool { mu.Lock(); defer mu.Unlock(); return leg }

	proxyGone, engineGone := make(chan struct{}), make(chan struct{})
	fromProxy, fromEngine := reads(c, proxyGone, quit), reads(s, engineGone, quit)
	go func() { // proxy to engine
		defer closeBoth()
		for ch := range fromProxy {
			if len(ch.b) > 0 {
				if bytes.Contains(ch.b, legMarker) {
					setLeg(true)
					if r.gate.take(holdRequest) && !r.gate.hold(r, proxyGone) {
						return
					}
				}
				if _, err := s.Write(ch.b); err != nil {
					return
				}
			}
			if ch.err != nil {
				return
			}
		}
	}()
	for ch := range fromEngine { // engine to proxy
		if len(ch.b) > 0 {
			if isLeg() {
				setLeg(false)
				if r.gate.take(holdResponse) && !r.gate.hold(r, proxyGone) {
					return
				}
			}
			if _, err := c.Write(ch.b); err != nil {
				return
			}
		}
		if ch.err != nil {
			return
		}
	}
}
