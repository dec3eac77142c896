package kvxfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// peerState is everything known about one producer engine.
type peerState struct {
	id   string
	addr string

	mu   sync.Mutex
	info *Info // nil until a handshake succeeded
	// clockOffset is the producer's clock minus ours, measured over the
	// handshake with the lowest round trip so far (clockRTT).
	clockOffset time.Duration
	clockRTT    time.Duration
	handshaking bool
	idle        []*pconn
	checkedOut  int
	shm         *shmMapping // non-nil when pulls use shared memory
	dropped     bool
	lastUsed    time.Time
	watched     map[string]struct{}
	hbBusy      bool
	nextHB      time.Time
}

// peerFor returns the state for peer's engine id, creating it.
func (c *Consumer) peerFor(peer Peer) (*peerState, error) {
	if err := c.CheckPeer(peer); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	p := c.peers[peer.EngineID]
	var moved *peerState
	if p == nil || p.addr != peer.Addr() {
		// Same engine id at a new address: a moved (restarted) producer
		// whose old connections and mapping are useless.
		moved = p
		p = &peerState{id: peer.EngineID, addr: peer.Addr(), lastUsed: time.Now()}
		c.peers[peer.EngineID] = p
	}
	c.mu.Unlock()
	if moved != nil {
		c.dropPeer(moved, "engine now advertises "+peer.Addr())
	}
	return p, nil
}

// CheckPeer reports whether this consumer may dial peer: a valid address
// allowed by the Peers allowlist, if any. Every dial checks it; callers
// check it earlier to refuse a request before allocating anything.
func (c *Consumer) CheckPeer(peer Peer) error {
	if err := peer.Validate(); err != nil {
		return err
	}
	if c.cfg.Peers != nil && !c.cfg.Peers.AllowsDial(peer.Host, peer.Port) {
		return fmt.Errorf("%w: %s is not in this engine's KV peer allowlist (--kv-peers %s)", ErrUnauthenticated, peer.Addr(), c.cfg.Peers)
	}
	return nil
}

// dropPeer forgets a producer: pooled connections are closed, connections
// in use are closed when returned, and its pool mapping is unmapped once
// no copy uses it.
func (c *Consumer) dropPeer(p *peerState, why string) {
	c.mu.Lock()
	if c.peers[p.id] == p {
		delete(c.peers, p.id)
	}
	if c.byAddr[p.addr] == p.id {
		delete(c.byAddr, p.addr)
	}
	c.mu.Unlock()
	p.mu.Lock()
	if p.dropped {
		p.mu.Unlock()
		return
	}
	p.dropped = true
	idle, m := p.idle, p.shm
	p.idle, p.shm = nil, nil
	p.mu.Unlock()
	for _, cn := range idle {
		c.closeConn(cn)
	}
	if m != nil {
		m.drop()
	}
	c.log.Info("forgot prefill engine", "remote_engine_id", p.id, "remote_addr", p.addr, "why", why)
}

// withConn runs fn on a handshaken connection to peer. A pooled connection
// the producer closed while idle fails before any response byte; fn is then
// retried once on a newly dialed connection (not another pooled one: those
// idle as long were closed too, and are dropped).
func (c *Consumer) withConn(ctx context.Context, peer Peer, fn func(*peerState, *pconn) error) error {
	for attempt := 0; ; attempt++ {
		p, cn, reused, err := c.acquire(ctx, peer, attempt > 0)
		if err != nil {
			return err
		}
		err = fn(p, cn)
		c.putConn(p, cn, err)
		if err != nil && reused && !cn.progress && attempt == 0 && ctx.Err() == nil && isStale(err) {
			c.dropIdleSince(p, cn.idleSince)
			continue
		}
		return err
	}
}

// dropIdleSince closes p's pooled connections that went idle at or before
// since.
func (c *Consumer) dropIdleSince(p *peerState, since time.Time) {
	p.mu.Lock()
	var drop []*pconn
	keep := p.idle[:0]
	for _, cn := range p.idle {
		if cn.idleSince.After(since) {
			keep = append(keep, cn)
		} else {
			drop = append(drop, cn)
		}
	}
	clear(p.idle[len(keep):])
	p.idle = keep
	p.mu.Unlock()
	for _, cn := range drop {
		c.closeConn(cn)
	}
}

// isStale reports errors a connection closed by the peer while idle gives.
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// acquire returns a connection to peer, handshaking first if needed: a
// pooled one idle less than IdleConnTimeout unless fresh, else a new one.
// All callers waiting for a producer's first handshake share it.
func (c *Consumer) acquire(ctx context.Context, peer Peer, fresh bool) (*peerState, *pconn, bool, error) {
	for {
		p, err := c.peerFor(peer)
		if err != nil {
			return nil, nil, false, err
		}
		p.mu.Lock()
		if p.dropped {
			p.mu.Unlock()
			continue
		}
		now := time.Now()
		p.lastUsed = now
		if n := len(p.idle); n > 0 && !fresh {
			cn := p.idle[n-1]
			if now.Sub(cn.idleSince) < c.cfg.IdleConnTimeout {
				p.idle[n-1] = nil
				p.idle = p.idle[:n-1]
				p.checkedOut++
				p.mu.Unlock()
				return p, cn, true, nil
			}
			// The newest has been idle too long: so have the others (the
			// pool is newest last).
			expired := slices.Clone(p.idle)
			clear(p.idle)
			p.idle = p.idle[:0]
			p.mu.Unlock()
			for _, cn := range expired {
				c.closeConn(cn)
			}
			continue
		}
		if p.info != nil {
			want := *p.info
			p.checkedOut++
			p.mu.Unlock()
			cn, err := c.dialPeer(ctx, p, &want)
			if err != nil {
				p.mu.Lock()
				p.checkedOut--
				p.mu.Unlock()
				return nil, nil, false, err
			}
			return p, cn, false, nil
		}
		p.mu.Unlock()
		// One handshake per producer however many requests wait for it,
		// run on a context of its own: a waiter that gives up does not
		// fail it for the others.
		ch := c.handshakes.DoChan(p.id, func() (any, error) { return nil, c.handshake(p) })
		select {
		case res := <-ch:
			if res.Err != nil {
				return nil, nil, false, res.Err
			}
		case <-ctx.Done():
			return nil, nil, false, fmt.Errorf("waiting for the handshake with prefill engine %s at %s: %w", p.id, p.addr, ctx.Err())
		}
	}
}

// handshake connects to a producer for the first time, checks it and
// decides the transport. Concurrent requests wait for its result; a failure
// is not cached, so the next request tries again.
func (c *Consumer) handshake(p *peerState) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	defer c.wg.Done()
	p.mu.Lock()
	if p.info != nil && !p.dropped {
		// A request that saw no handshake done, then joined after the
		// one in flight had finished: nothing left to do.
		p.mu.Unlock()
		return nil
	}
	p.handshaking = true
	p.mu.Unlock()
	c.firstHandshakes.Add(1)
	ctx, cancel := context.WithTimeout(c.base, c.cfg.DialTimeout)
	defer cancel()
	cn, info, err := c.dialHello(ctx, p)
	if err == nil {
		err = c.admit(p, info)
	}
	p.mu.Lock()
	p.handshaking = false
	if err == nil && !p.dropped {
		p.info = &info
		p.idle = append(p.idle, cn)
		cn = nil
	} else if err == nil {
		err = fmt.Errorf("%w: prefill engine %s was forgotten during the handshake", ErrPeerRestarted, p.id)
	}
	p.mu.Unlock()
	if cn != nil {
		c.closeConn(cn)
	}
	if err != nil {
		c.log.Warn("kv handshake failed", "remote_engine_id", p.id, "remote_addr", p.addr, "reason", FailureReason(err), "err", err)
	}
	return err
}

// admit checks a handshake answer: the expected engine, compatible, and
// which transport to use.
func (c *Consumer) admit(p *peerState, info Info) error {
	if info.EngineID != p.id {
		c.dropPeer(p, "engine "+info.EngineID+" answers at its address")
		return fmt.Errorf("%w: prefill engine %s at %s is gone and engine %s answers there now (the prefill restarted; the request's KV was lost with it): retry the request", ErrPeerRestarted, p.id, p.addr, info.EngineID)
	}
	if err := checkCompat(c.cfg.Local, info); err != nil {
		return err
	}
	if lk := c.cfg.Local.Kernels; lk != "" && info.Kernels != "" && lk != info.Kernels {
		c.log.Warn("the prefill engine computes with another CPU kernel set: its KV is valid but differs in rounding, so outputs are not bit-identical to a colocated run; set TANDEM_KERNELS to one set both CPUs run, on both engines, where that matters",
			"remote_engine_id", p.id, "remote_kernels", info.Kernels, "kernels", lk)
	}
	c.mu.Lock()
	var stale *peerState
	if old, ok := c.byAddr[p.addr]; ok && old != p.id {
		stale = c.peers[old]
	}
	c.byAddr[p.addr] = p.id
	c.mu.Unlock()
	if stale != nil {
		c.dropPeer(stale, "engine "+p.id+" now answers at "+p.addr)
	}
	m, why, err := c.chooseShm(info)
	if err != nil {
		return err
	}
	if m != nil {
		p.mu.Lock()
		if p.shm != nil {
			p.shm.drop()
		}
		p.shm = m
		p.mu.Unlock()
		c.log.Info("kv transfer via shared memory", "remote_engine_id", p.id, "pool", info.Shm.Path)
	} else {
		c.log.Info("kv transfer via tcp", "remote_engine_id", p.id, "remote_addr", p.addr, "why", why)
	}
	return nil
}

// chooseShm maps the producer's pool when shared memory is usable and
// wanted. It returns nil and the reason when TCP is used instead.
func (c *Consumer) chooseShm(info Info) (*shmMapping, string, error) {
	if c.cfg.Transport == TransportTCP {
		return nil, "--kv-transport=tcp", nil
	}
	forced := c.cfg.Transport == TransportShm
	local := c.cfg.Local.Host
	if !sameHost(local, info.Host) {
		if forced {
			return nil, "", fmt.Errorf("--kv-transport=shm, but prefill engine %s runs on another host (boot id %q, hostname %q) than this decode engine (boot id %q, hostname %q): use --kv-transport=auto or tcp", info.EngineID, info.Host.BootID, info.Host.Hostname, local.BootID, local.Hostname)
		}
		return nil, "different host", nil
	}
	if info.Shm.Path == "" {
		if forced {
			return nil, "", fmt.Errorf("--kv-transport=shm, but prefill engine %s does not offer its KV pool through shared memory: use --kv-transport=auto or tcp", info.EngineID)
		}
		return nil, "prefill offers no shared memory", nil
	}
	m, err := openShm(info)
	if err != nil {
		if forced {
			return nil, "", fmt.Errorf("--kv-transport=shm, but the KV pool of prefill engine %s cannot be mapped: %w (use --kv-transport=auto or tcp)", info.EngineID, err)
		}
		return nil, err.Error(), nil
	}
	return m, "", nil
}

// dialPeer opens one more connection to a known producer and checks that
// the same engine, with the same configuration, still answers.
func (c *Consumer) dialPeer(ctx context.Context, p *peerState, want *Info) (*pconn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	cn, info, err := c.dialHello(dctx, p)
	if err != nil {
		return nil, err
	}
	if info != *want {
		c.closeConn(cn)
		c.dropPeer(p, "a different engine or configuration answers at its address")
		if info.EngineID != p.id {
			return nil, fmt.Errorf("%w: prefill engine %s at %s is gone and engine %s answers there now (the prefill restarted; the request's KV was lost with it): retry the request", ErrPeerRestarted, p.id, p.addr, info.EngineID)
		}
		return nil, fmt.Errorf("%w: prefill engine %s at %s came back with a different configuration (restarted with the same engine id?): retry the request", ErrPeerRestarted, p.id, p.addr)
	}
	return cn, nil
}

// dialHello connects and exchanges HELLO / HELLO_ACK.
func (c *Consumer) dialHello(ctx context.Context, p *peerState) (*pconn, Info, error) {
	// A producer refuses new connections while its handshake slots are
	// full (a burst of pulls from this decode, or a flood from elsewhere):
	// retry with a short, jittered backoff until ctx ends.
	backoff := 5 * time.Millisecond
	var busy error // the last refusal: the real reason if time runs out
	for {
		cn, info, err := c.dialHelloOnce(ctx, p)
		if err != nil && busy != nil && (ctx.Err() != nil || deadlineHit(err)) {
			// The deadline cut a retry short: the producer's refusal, not
			// the timeout it caused, is what the caller must hear. (The
			// connection's deadline is ctx's, and its read can return
			// before ctx's own timer has marked ctx done.)
			return nil, Info{}, busy
		}
		if err == nil || !refusedBusy(err) || ctx.Err() != nil {
			return cn, info, err
		}
		busy = err
		t := time.NewTimer(backoff/2 + rand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, Info{}, err
		case <-t.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// deadlineHit reports an error of an I/O deadline or a context's
// deadline.
func deadlineHit(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// refusedBusy reports a connection the producer refused for lack of
// handshake slots: an ERROR busy (on accept, or when a newer connection
// displaced it), or a bare close before the handshake ended (under TLS a
// refusal is one; a displaced connection may see one too).
func refusedBusy(err error) bool {
	if re, ok := errors.AsType[*RemoteError](err); ok {
		return re.Code == CodeBusy
	}
	return errors.Is(err, errTLSClosed) || errors.Is(err, errHandshakeClosed)
}

var (
	errTLSClosed       = errors.New("connection closed during the TLS handshake")
	errHandshakeClosed = errors.New("connection closed during the side-channel handshake")
)

func (c *Consumer) dialHelloOnce(ctx context.Context, p *peerState) (*pconn, Info, error) {
	nc, err := c.cfg.Dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, Info{}, fmt.Errorf("connect to the side channel of prefill engine %s at %s (is it running? are its --kv-host/--kv-port reachable from here?): %w", p.id, p.addr, err)
	}
	if c.cfg.TLS != nil {
		cfg := c.cfg.TLS.Clone()
		cfg.ServerName, _ = splitAddr(p.addr)
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			if isStale(err) && ctx.Err() == nil {
				return nil, Info{}, fmt.Errorf("TLS handshake with prefill engine %s at %s: %w (%w)", p.id, p.addr, errTLSClosed, err)
			}
			return nil, Info{}, fmt.Errorf("%w: TLS handshake with prefill engine %s at %s: %w", ErrUnauthenticated, p.id, p.addr, err)
		}
		nc = tc
	}
	cn := &pconn{Conn: nc}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return nil, Info{}, ErrClosed
	}
	c.conns[cn] = struct{}{}
	c.mu.Unlock()
	info, err := c.clientHandshake(ctx, cn)
	if err != nil {
		c.closeConn(cn)
		if isStale(err) && ctx.Err() == nil {
			return nil, Info{}, fmt.Errorf("handshake with prefill engine %s at %s: %w (%w)", p.id, p.addr, errHandshakeClosed, err)
		}
		return nil, Info{}, fmt.Errorf("handshake with prefill engine %s at %s: %w", p.id, p.addr, err)
	}
	if cs := cn.clock; cs.ok {
		// Keep the estimate of the fastest round trip: its midpoint is
		// the tightest bound on when the producer read its clock.
		p.mu.Lock()
		if p.clockRTT == 0 || cs.rtt < p.clockRTT {
			p.clockOffset, p.clockRTT = cs.offset, max(cs.rtt, 1)
		}
		p.mu.Unlock()
	}
	return cn, info, nil
}

// putConn returns a connection to its peer's pool, or closes it when it is
// out of sync, its peer is gone, or the pool is full.
func (c *Consumer) putConn(p *peerState, cn *pconn, err error) {
	var re *RemoteError
	healthy := err == nil || errors.As(err, &re) && re.Code != CodeBadFrame && re.Code != CodeVersion
	p.mu.Lock()
	p.checkedOut--
	if healthy && !cn.broken && !cn.isCanceled() && !p.dropped && len(p.idle) < c.cfg.MaxIdleConns {
		cn.progress = false
		cn.idleSince = time.Now()
		p.idle = append(p.idle, cn)
		cn = nil
	}
	p.mu.Unlock()
	if cn != nil {
		c.closeConn(cn)
	}
}

func (c *Consumer) closeConn(cn *pconn) {
	c.mu.Lock()
	delete(c.conns, cn)
	c.mu.Unlock()
	cn.Close()
}
