package kvxfer

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// The side channel's connection budgets. Two, kept apart:
//
//   - pending: connections between accept and a checked AUTH. Anybody who
//     can reach the port can open one, so they are bounded (MaxPending, and
//     MaxPendingPerHost per source address), short-lived (HelloTimeout to
//     the first frame, AuthTimeout to the end of the handshake), rejected
//     at their first byte that cannot open a frame, and, when the budget is
//     full, displaced rather than allowed to lock newcomers out: the least
//     advanced first (silent, then a valid first TLS record, then a HELLO
//     read), oldest first among equals. A consumer sends its first bytes
//     (HELLO, or under TLS its ClientHello) as soon as it is connected, so
//     idle connections, however fast they are redialed, are always
//     displaced before it — even when a slow TLS handshake makes it the
//     oldest.
//   - authenticated: connections whose consumer proved the secret
//     (MaxConns), and per consumer engine (MaxConnsPerPeer), keyed by the
//     engine id it sent with that proof, not by its address, which every
//     decode on one host shares.
//
// Without a secret the handshake's key is well known: the engine id is
// then only a claim, and the address allowlist (--kv-peers) is what keeps
// strangers out.

// DefaultHelloTimeout is the default ProducerConfig.HelloTimeout.
const DefaultHelloTimeout = time.Second

// pendingConn is a connection in its handshake.
type pendingConn struct {
	host     string
	seq      uint64 // accept order
	progress int    // how far its handshake got: see the progress constants
}

// How far a pending connection's handshake got, in the order displacement
// spares them.
const (
	progressSilent   = iota // nothing valid read yet
	progressTLSStart        // under TLS: its first byte opened a handshake record
	progressHello           // its HELLO was read
)

// admit decides on an accepted connection, without reading from it. It is
// refused (code and message) when its address is not allowed or the
// producer is closing. Otherwise it takes a pending slot, displacing older
// pending connections when the budget is full; the displaced ones are
// returned for the caller to refuse as busy (their goroutines see the
// close and end).
func (p *Producer) admit(c net.Conn) (ErrorCode, string, []net.Conn) {
	if p.cfg.Peers != nil && !p.cfg.Peers.AllowsConn(c.RemoteAddr()) {
		p.unauthLog.warn(p.log, "kv-peers "+remoteIP(c), "kv side channel refused a connection: its address is not in --kv-peers", "remote_addr", c.RemoteAddr().String(), "kv_peers", p.cfg.Peers.String())
		return CodeUnauthenticated, "this address may not connect to the KV side channel", nil
	}
	host := remoteIP(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.quiescing {
		return CodeShuttingDown, "prefill engine is shutting down", nil
	}
	var displaced []net.Conn
	for p.pendingBy[host] >= p.cfg.MaxPendingPerHost || len(p.pending) >= p.cfg.MaxPending {
		only := ""
		if p.pendingBy[host] >= p.cfg.MaxPendingPerHost {
			only = host // an address displaces only its own connections
		}
		victim := p.oldestPendingLocked(only)
		if victim == nil {
			return CodeBusy, "too many side-channel connections in their handshake: retry later", displaced
		}
		p.unpendLocked(victim)
		displaced = append(displaced, victim)
	}
	if len(displaced) > 0 {
		p.unauthLog.warn(p.log, "displaced "+host, "side-channel handshake slots full: displaced the oldest pending connections (a flood of unauthenticated connections?)", "remote_addr", c.RemoteAddr().String(), "displaced", len(displaced), "max_pending", p.cfg.MaxPending, "max_pending_per_host", p.cfg.MaxPendingPerHost)
	}
	p.pendingSeq++
	p.pending[c] = &pendingConn{host: host, seq: p.pendingSeq}
	p.pendingBy[host]++
	p.conns[c] = true // idle until its handshake ends: nothing to answer yet
	p.wg.Add(1)
	return 0, "", displaced
}

// oldestPendingLocked returns the pending connection to displace: from
// host (any, if empty), the oldest of the least advanced.
func (p *Producer) oldestPendingLocked(host string) net.Conn {
	var best net.Conn
	var bestState *pendingConn
	for c, st := range p.pending {
		if host != "" && st.host != host {
			continue
		}
		if bestState == nil || st.progress < bestState.progress || (st.progress == bestState.progress && st.seq < bestState.seq) {
			best, bestState = c, st
		}
	}
	return best
}

// unpendLocked gives c's pending slot back, if it still holds one.
func (p *Producer) unpendLocked(c net.Conn) {
	st, ok := p.pending[c]
	if !ok {
		return
	}
	delete(p.pending, c)
	if p.pendingBy[st.host]--; p.pendingBy[st.host] <= 0 {
		delete(p.pendingBy, st.host)
	}
}

// helloRead marks c as having sent a well-formed HELLO: it is displaced
// only after every pending connection that has not.
func (p *Producer) helloRead(c net.Conn) { p.advance(c, progressHello) }

// advance records that pending connection c's handshake got to progress.
func (p *Producer) advance(c net.Conn, progress int) {
	p.mu.Lock()
	if st, ok := p.pending[c]; ok {
		st.progress = max(st.progress, progress)
	}
	p.mu.Unlock()
}

// admitAuthed moves c, whose consumer engine id proved the secret, from
// the pending budget to the authenticated one. It returns why not (the
// busy message for the consumer), or "" when c took a slot. A connection
// displaced meanwhile is refused too: its slot went to another.
func (p *Producer) admitAuthed(c net.Conn, id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[c]; !ok {
		return "displaced by a newer connection while its handshake was pending: retry"
	}
	p.unpendLocked(c)
	switch {
	case p.authed >= p.cfg.MaxConns:
		return fmt.Sprintf("prefill engine %s has %d side-channel connections, its limit: retry later or raise its connection limit", p.info.EngineID, p.cfg.MaxConns)
	case p.authedBy[id] >= p.cfg.MaxConnsPerPeer:
		return fmt.Sprintf("prefill engine %s has %d side-channel connections from decode engine %s, its limit per engine: retry later", p.info.EngineID, p.cfg.MaxConnsPerPeer, id)
	}
	p.authed++
	p.authedBy[id]++
	return ""
}

// releaseAuthedLocked gives back an authenticated slot of consumer id.
func (p *Producer) releaseAuthedLocked(id string) {
	p.authed--
	if p.authedBy[id]--; p.authedBy[id] <= 0 {
		delete(p.authedBy, id)
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// tlsRecordHandshake is the content type of the first TLS record a client
// sends (its ClientHello).
const tlsRecordHandshake = 0x16

// errNotTLS rejects a connection whose first byte cannot open a TLS
// handshake.
var errNotTLS = errors.New("not a TLS client: its first byte is not a TLS handshake record")

// tlsFirstByte rejects, at its first byte, a connection that does not open
// with a TLS handshake record, so garbage sent slowly to a TLS side channel
// is dropped at once rather than at the hello deadline; a valid first byte
// calls started (the connection is then displaced after silent ones).
type tlsFirstByte struct {
	net.Conn
	checked bool
	started func()
}

func (c *tlsFirstByte) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.checked && n > 0 {
		c.checked = true
		if b[0] != tlsRecordHandshake {
			return 0, fmt.Errorf("%w: %w", errBadFrame, errNotTLS)
		}
		if c.started != nil {
			c.started()
		}
	}
	return n, err
}
