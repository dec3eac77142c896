package kvxfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"
)

// DefaultPort is the default side-channel port (vLLM's
// VLLM_NIXL_SIDE_CHANNEL_PORT).
const DefaultPort = 5600

// dataBatchBytes bounds the bytes written by one writev call; the write
// deadline is refreshed per batch, so IOTimeout bounds a stall, not a
// transfer.
const dataBatchBytes = 16 << 20

// Listen opens the side-channel listener on host:port, with an error that
// says what to change when the port is taken.
func Listen(host string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("kv side channel cannot listen on %s: the port is in use (another engine on this host?): pass a free --kv-port: %w", addr, err)
	}
	if err != nil {
		return nil, fmt.Errorf("kv side channel cannot listen on %s: check --kv-host: %w", addr, err)
	}
	return ln, nil
}

// Serve accepts side-channel connections on ln until Close. It returns nil
// after Close, or the accept error that stopped it.
func (p *Producer) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return nil
	}
	p.ln = append(p.ln, ln)
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed || p.quiescing
			p.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors or a transient failure: back off
				// rather than spin, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log.Error("side-channel accept failed; retrying", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("kv side channel accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		code, why, displaced := p.admit(c)
		for _, d := range displaced {
			p.refuse(d, CodeBusy, "displaced by a newer connection while its handshake was pending: retry")
		}
		if code != 0 {
			p.refuse(c, code, why)
			continue
		}
		go p.serveConn(c)
	}
}

// refuse answers a connection with one ERROR and closes it, on the
// accepting goroutine: a fresh socket's send buffer takes the few bytes
// without blocking, and the short deadline bounds the rare case it does
// not, so a flood of refusals costs no goroutine each.
func (p *Producer) refuse(c net.Conn, code ErrorCode, msg string) {
	if p.cfg.TLS == nil {
		// Under TLS a plaintext frame is unreadable: the refusal is the
		// close itself.
		c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		c.Write(frame(msgError, 0, func(b []byte) []byte { return appendError(b, code, msg) }))
	}
	c.Close()
}

// Shutdown closes the side channel gracefully: it stops accepting
// connections, closes those waiting for a request (or still in their
// handshake), lets each request in progress (a READ on the wire, a DONE or
// heartbeat being answered) finish and be answered before its connection
// closes, and then, or once ctx is done, Closes. Call it when no lease
// needs serving any more (the engine's drain waits for that first), so
// that a consumer's last DONE gets its ACK rather than a closed
// connection.
func (p *Producer) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.quiescing = true
	for _, ln := range p.ln {
		ln.Close()
	}
	for c, idle := range p.conns {
		if idle {
			c.Close()
		}
	}
	p.mu.Unlock()
	for {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-p.connGone:
			continue
		case <-ctx.Done():
		}
		break
	}
	return p.Close()
}

// setIdle marks c as waiting for its next request (idle) or serving one,
// and reports false when c must close instead: Shutdown began.
func (p *Producer) setIdle(c net.Conn, idle bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if idle && (p.quiescing || p.closed) {
		return false
	}
	if _, ok := p.conns[c]; ok {
		p.conns[c] = idle
	}
	return true
}

// Close stops accepting, closes every connection and waits for all
// goroutines to end. Leases are kept: the step loop still drains them.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for _, ln := range p.ln {
		ln.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// errQuiesced ends a connection between two requests once Shutdown began.
var errQuiesced = errors.New("kvxfer: side channel shutting down")

// srvConn is one producer-side connection: strictly one request at a time.
type srvConn struct {
	p      *Producer
	c      net.Conn
	raw    net.Conn // c before TLS: the key in Producer.conns
	hb     [headerSize]byte
	hello  bool
	remote string    // consumer engine id, for logs
	start  time.Time // accepted: the handshake's deadlines count from here
}

func (p *Producer) serveConn(c net.Conn) {
	defer p.wg.Done()
	host := remoteIP(c)
	peer := "" // the consumer engine id once it holds an authenticated slot
	defer func() {
		c.Close() // before it leaves conns: a connection not counted is closed
		p.mu.Lock()
		delete(p.conns, c)
		if peer != "" {
			p.releaseAuthedLocked(peer)
		} else {
			p.unpendLocked(c) // a no-op when it was displaced
		}
		p.mu.Unlock()
		select {
		case p.connGone <- struct{}{}:
		default:
		}
	}()
	var conn net.Conn = c
	if p.cfg.TLS != nil {
		conn = tls.Server(&tlsFirstByte{Conn: c, started: func() { p.advance(c, progressTLSStart) }}, p.cfg.TLS)
	}
	s := &srvConn{p: p, c: conn, raw: c, start: time.Now()}
	err := s.authenticate(func(id string) string {
		why := p.admitAuthed(c, id)
		if why == "" {
			peer = id
		}
		return why
	})
	authed := peer != ""
	if errors.Is(err, errNoSlot) {
		return
	}
	for err == nil {
		err = s.serveOne()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, errQuiesced) {
		return
	}
	var ve *versionError
	switch {
	case errors.As(err, &ve):
		s.sendError(0, CodeVersion, err.Error())
	case errors.Is(err, errBadFrame) && authed:
		s.sendError(0, CodeBadFrame, fmt.Sprintf("prefill engine %s: %v; closing the connection", p.info.EngineID, err))
	case errors.Is(err, errBadFrame):
		s.sendError(0, CodeBadFrame, "malformed handshake; closing the connection")
	}
	if authed {
		p.log.Debug("side-channel connection closed", "remote_addr", c.RemoteAddr().String(), "consumer", s.remote, "err", err)
	} else {
		p.unauthLog.warn(p.log, "handshake "+host, "side-channel connection failed its handshake", "remote_addr", c.RemoteAddr().String(), "err", err)
	}
}

// serveOne reads and answers one request. A non-nil error closes the
// connection.
func (s *srvConn) serveOne() error {
	p := s.p
	if !p.setIdle(s.raw, true) {
		return errQuiesced
	}
	s.c.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
	h, err := readHeader(s.c, &s.hb)
	p.setIdle(s.raw, false)
	if err != nil {
		return err
	}
	if h.Type == msgData {
		return fmt.Errorf("%w: a consumer must not send DATA", errBadFrame)
	}
	s.c.SetReadDeadline(time.Now().Add(p.cfg.IOTimeout))
	payload := make([]byte, h.Len)
	if _, err := io.ReadFull(s.c, payload); err != nil {
		return err
	}
	switch h.Type {
	case msgRead:
		r, err := decodeBlockRequest(payload)
		if err != nil {
			return err
		}
		return s.serveRead(h.Corr, r)
	case msgShmRead:
		r, err := decodeBlockRequest(payload)
		if err != nil {
			return err
		}
		return s.serveShmRead(h.Corr, r)
	case msgDone:
		id, err := decodeDone(payload)
		if err != nil {
			return err
		}
		p.mu.Lock()
		err = p.leases.done(id, p.cfg.Clock.Now())
		p.gaugeLocked()
		p.mu.Unlock()
		p.released()
		if err != nil {
			return s.sendError(h.Corr, CodeNotHeld, err.Error())
		}
		return s.send(frame(msgAck, h.Corr, func(b []byte) []byte { return appendIDs(b, nil) }))
	case msgHeartbeat:
		ids, err := decodeIDs(payload)
		if err != nil {
			return err
		}
		p.mu.Lock()
		notHeld := p.leases.heartbeat(ids, p.cfg.Clock.Now())
		p.mu.Unlock()
		return s.send(frame(msgAck, h.Corr, func(b []byte) []byte { return appendIDs(b, notHeld) }))
	}
	return fmt.Errorf("%w: a consumer must not send %s", errBadFrame, h.Type)
}

func (s *srvConn) send(b []byte) error {
	s.c.SetWriteDeadline(time.Now().Add(s.p.cfg.IOTimeout))
	_, err := s.c.Write(b)
	return err
}

func (s *srvConn) sendError(corr uint64, code ErrorCode, msg string) error {
	return s.send(frame(msgError, corr, func(b []byte) []byte { return appendError(b, code, msg) }))
}

// beginRead validates a read under the producer lock and, for TCP reads,
// pins the lease until endRead.
func (s *srvConn) beginRead(r blockRequest, pin bool) ([]uint64, ErrorCode, error) {
	p := s.p
	p.mu.Lock()
	gens, expired, err := p.leases.beginRead(r.RequestID, r.Blocks, pin, p.cfg.Clock.Now())
	if expired {
		if m := p.cfg.Metrics; m != nil {
			m.KVLeasesExpired.Inc()
		}
		p.gaugeLocked()
	}
	if err == nil && !pin {
		p.leases.extend(r.RequestID, p.cfg.Clock.Now())
	}
	p.mu.Unlock()
	if expired {
		p.released()
	}
	switch {
	case errors.Is(err, ErrBadBlock):
		return nil, CodeBadBlock, err
	case err != nil:
		return nil, CodeNotHeld, err
	}
	return gens, 0, nil
}

func (s *srvConn) endRead(id string) {
	p := s.p
	p.mu.Lock()
	p.leases.endRead(id, p.cfg.Clock.Now())
	p.gaugeLocked()
	p.mu.Unlock()
	p.released()
}

// changedBlock returns the index of the first block whose generation is no
// longer want, or -1.
func (s *srvConn) changedBlock(blocks []int, want []uint64) int {
	for i, b := range blocks {
		if s.p.mem.Generation(b) != want[i] {
			return i
		}
	}
	return -1
}

func (s *srvConn) genChanged(r blockRequest, i int) string {
	return fmt.Sprintf("generation changed during read: block %d of request %q on prefill engine %s was reused while it was held (engine bug: a held block must not be reallocated); the data sent is invalid", r.Blocks[i], r.RequestID, s.p.info.EngineID)
}

// serveRead streams the blocks of a held request: one DATA frame per block,
// written with writev straight from pool memory, then READ_DONE. The lease
// is pinned for the duration, so it can neither expire nor be released
// while its bytes are on the wire; write deadlines bound how long that can
// be.
func (s *srvConn) serveRead(corr uint64, r blockRequest) error {
	gens, code, err := s.beginRead(r, true)
	if err != nil {
		return s.sendError(corr, code, err.Error())
	}
	pinned := true
	unpin := func() {
		if pinned {
			pinned = false
			s.endRead(r.RequestID)
		}
	}
	// Unpin before the final answer: the consumer may send DONE on another
	// connection as soon as it has READ_DONE, and that DONE must find the
	// lease releasable.
	defer unpin()
	if i := s.changedBlock(r.Blocks, gens); i >= 0 {
		unpin()
		return s.sendError(corr, CodeGenerationChanged, s.genChanged(r, i))
	}
	bb := s.p.info.BlockBytes
	hdrs := make([]byte, headerSize*len(r.Blocks))
	bufs := make(net.Buffers, 0, 2*min(len(r.Blocks), dataBatchBytes/bb+1))
	batch := 0
	for i, b := range r.Blocks {
		h := hdrs[i*headerSize : (i+1)*headerSize]
		putHeader(h, msgData, corr, bb)
		bufs = append(bufs, h, s.p.mem.Block(b)[:bb])
		batch += bb
		if batch >= dataBatchBytes || i == len(r.Blocks)-1 {
			s.c.SetWriteDeadline(time.Now().Add(s.p.cfg.IOTimeout))
			if _, err := bufs.WriteTo(s.c); err != nil {
				return err
			}
			bufs, batch = bufs[:0], 0
		}
	}
	i := s.changedBlock(r.Blocks, gens)
	unpin()
	if i >= 0 {
		return s.sendError(corr, CodeGenerationChanged, s.genChanged(r, i))
	}
	return s.send(frame(msgReadDone, corr, nil))
}

// serveShmRead validates the lease, extends it, and returns the blocks'
// generations; the consumer copies from its mapping of the pool and checks
// the generations again afterwards.
func (s *srvConn) serveShmRead(corr uint64, r blockRequest) error {
	if s.p.info.Shm.Path == "" {
		return s.sendError(corr, CodeNoShm, fmt.Sprintf("prefill engine %s does not offer its KV pool through shared memory: use --kv-transport=tcp", s.p.info.EngineID))
	}
	gens, code, err := s.beginRead(r, false)
	if err != nil {
		return s.sendError(corr, code, err.Error())
	}
	if i := s.changedBlock(r.Blocks, gens); i >= 0 {
		return s.sendError(corr, CodeGenerationChanged, s.genChanged(r, i))
	}
	return s.send(frame(msgShmGens, corr, func(b []byte) []byte { return appendGens(b, gens) }))
}
