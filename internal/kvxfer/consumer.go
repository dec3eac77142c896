package kvxfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/tandem-serve/tandem/internal/logid"
	"github.com/tandem-serve/tandem/internal/metrics"
)

// Transport selects how a consumer moves block bytes.
type Transport string

// Transports.
const (
	// TransportAuto uses shared memory for peers on the same host whose
	// pool file is readable and identical, TCP otherwise.
	TransportAuto Transport = "auto"
	// TransportTCP always streams blocks over the side channel.
	TransportTCP Transport = "tcp"
	// TransportShm requires shared memory; a peer on another host is an
	// error.
	TransportShm Transport = "shm"
)

// More defaults for ConsumerConfig.
const (
	DefaultDialTimeout  = 5 * time.Second
	DefaultMaxIdleConns = 4
	// DefaultIdleConnTimeout is well below the producer's
	// DefaultIdleTimeout, so that the consumer drops a pooled connection
	// before the producer closes it.
	DefaultIdleConnTimeout = time.Minute
	DefaultEngineTTL       = time.Hour
)

// doneTimeout bounds the best-effort DONE sent after a failed pull.
const doneTimeout = 2 * time.Second

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Local identifies this engine and its model and KV geometry
	// (EngineID, ModelFingerprint, KVDType, Layers, KVHeads, HeadDim,
	// BlockSize and BlockBytes are compared with each producer's).
	Local Info
	// Transport is TransportAuto when empty.
	Transport Transport
	// Secret authenticates producers (and this consumer to them); see
	// ProducerConfig.Secret.
	Secret Secret
	// Peers, if set, is the allowlist of producer addresses this consumer
	// dials; anything else fails before a connection is attempted. Without
	// a Secret it is what stands between kv_transfer_params a client
	// wrote and an arbitrary dial.
	Peers *PeerPolicy
	// TLS, if set, wraps every connection (see TLSConfig).
	TLS *tls.Config
	// DialTimeout bounds connecting plus the handshake (DefaultDialTimeout).
	DialTimeout time.Duration
	// IOTimeout bounds each read or write of a transfer (DefaultIOTimeout):
	// a peer that stalls longer fails the pull.
	IOTimeout time.Duration
	// HeartbeatInterval overrides the heartbeat period, which is otherwise
	// the producer's lease / 6.
	HeartbeatInterval time.Duration
	// MaxIdleConns bounds pooled connections per producer
	// (DefaultMaxIdleConns).
	MaxIdleConns int
	// IdleConnTimeout closes pooled connections idle this long instead of
	// reusing them (DefaultIdleConnTimeout); keep it below the producers'
	// IdleTimeout.
	IdleConnTimeout time.Duration
	// EngineTTL forgets producers unused this long (DefaultEngineTTL);
	// negative disables eviction.
	EngineTTL time.Duration
	// Dial opens side-channel connections (default: a net.Dialer); tests
	// use it for in-memory pipes.
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Metrics *metrics.Engine // may be nil
	Logger  *slog.Logger    // default slog.Default()
}

// Peer names a producer's side channel, as kv_transfer_params do.
type Peer struct {
	EngineID string
	Host     string
	Port     int
}

func (p Peer) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

func (p Peer) Validate() error {
	if p.EngineID == "" || p.Host == "" || p.Port <= 0 || p.Port > 65535 {
		return fmt.Errorf("invalid remote engine (engine id %q, host %q, port %d): kv_transfer_params must carry remote_engine_id, remote_host and remote_port", p.EngineID, p.Host, p.Port)
	}
	return nil
}

// RemoteParams says where a request's prefilled KV is: the producer and its
// request id and block ids (kv_transfer_params' remote_* fields). For a
// partial local prefix hit, pass only the trailing blocks to pull.
type RemoteParams struct {
	EngineID  string
	RequestID string
	Host      string
	Port      int
	BlockIDs  []int
	// Generation, if non-zero, is the producer's registration generation
	// the params were issued under (Info.Generation): another generation
	// means the memory they name is gone.
	Generation uint64
	// Deadline, if set, is when the producer stops holding the blocks, in
	// the producer's clock (a decode's conversation hold). A pull that
	// would land within ExpiryMargin of it is declined with ErrExpired.
	Deadline time.Time
}

// ExpiryMargin is how close to a producer's stated deadline a pull is still
// attempted (vLLM's _KV_BLOCKS_EXPIRY_SAFETY_MARGIN).
const ExpiryMargin = 5 * time.Second

// Peer returns the producer part of r.
func (r RemoteParams) Peer() Peer { return Peer{EngineID: r.EngineID, Host: r.Host, Port: r.Port} }

// Consumer is the decode side of the connector: it handshakes with
// producers (once per engine, shared by concurrent requests), pulls blocks
// into local block memory over TCP or shared memory, tells producers when
// it is done with a request, and heartbeats the leases of requests still
// queued. Methods are safe for concurrent use.
type Consumer struct {
	cfg  ConsumerConfig
	log  *slog.Logger
	corr atomic.Uint64
	// firstHandshakes counts first handshakes with a producer (tests
	// check that concurrent requests share one).
	firstHandshakes atomic.Int64
	handshakes      singleflight.Group // by engine id

	mu     sync.Mutex
	peers  map[string]*peerState // by engine id
	byAddr map[string]string     // host:port → engine id that answered there
	conns  map[*pconn]struct{}
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
	// base is canceled by Close; the consumer's own operations
	// (handshakes, heartbeats) derive their contexts from it.
	base       context.Context
	cancelBase context.CancelFunc
}

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

// NewConsumer validates cfg and starts the heartbeat loop; Close stops it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if cfg.Local.EngineID == "" || cfg.Local.BlockBytes <= 0 {
		return nil, errors.New("kvxfer: consumer needs its engine id and block geometry (Local.EngineID, Local.BlockBytes)")
	}
	switch cfg.Transport {
	case "":
		cfg.Transport = TransportAuto
	case TransportAuto, TransportTCP, TransportShm:
	default:
		return nil, fmt.Errorf("kvxfer: unknown kv transport %q: use auto, tcp or shm", cfg.Transport)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	if cfg.MaxIdleConns <= 0 {
		cfg.MaxIdleConns = DefaultMaxIdleConns
	}
	if cfg.IdleConnTimeout <= 0 {
		cfg.IdleConnTimeout = DefaultIdleConnTimeout
	}
	if cfg.EngineTTL == 0 {
		cfg.EngineTTL = DefaultEngineTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	cfg.Local.Host = LocalHost()
	c := &Consumer{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "kvxfer.consumer", "engine_id", cfg.Local.EngineID),
		peers:  make(map[string]*peerState),
		byAddr: make(map[string]string),
		conns:  make(map[*pconn]struct{}),
		stop:   make(chan struct{}),
	}
	c.base, c.cancelBase = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.heartbeatLoop()
	return c, nil
}

// Close stops heartbeats, fails pulls in flight, closes all connections
// and unmaps every pool mapping (once no copy uses it). It waits for the
// consumer's own goroutines to end.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.stop)
	c.cancelBase()
	peers := slices.Collect(maps.Values(c.peers))
	conns := slices.Collect(maps.Keys(c.conns))
	c.mu.Unlock()
	for _, cn := range conns {
		cn.cancel()
	}
	for _, p := range peers {
		c.dropPeer(p, "consumer closed")
	}
	c.wg.Wait()
	return nil
}

// Pull copies the blocks r.BlockIDs of the producer's request r.RequestID
// into dst (dst[i] receives block r.BlockIDs[i]; each slice is one local
// block of BlockBytes bytes) and then tells the producer it is done so it
// frees them. Bytes are read straight into dst (TCP) or copied once from
// the producer's pool mapping (same host). When Pull returns, nothing
// writes into dst any more, whatever the outcome.
//
// On error the contents of dst are undefined; errors wrap ErrNotHeld,
// ErrGenerationChanged, ErrIncompatible, ErrPeerRestarted, ErrProtocol or
// the context's error, and FailureReason classifies them.
func (c *Consumer) Pull(ctx context.Context, r RemoteParams, dst [][]byte) error {
	start := time.Now()
	err := c.pull(ctx, r, dst)
	if m := c.cfg.Metrics; m != nil {
		if err == nil {
			m.KVTransferBytes.Add(float64(len(dst) * c.cfg.Local.BlockBytes))
			m.KVTransferSeconds.Observe(time.Since(start).Seconds())
		} else {
			m.KVTransferFailures.WithLabelValues(FailureReason(err)).Inc()
		}
	}
	if err != nil {
		// The remote id may still be held (logid: a tag at info level).
		attrs := append([]any{"remote_engine_id", r.EngineID}, logid.Attrs(c.log, "remote_request_id", r.RequestID)...)
		c.log.Warn("kv pull failed", append(attrs, "remote_addr", r.Peer().Addr(), "blocks", len(r.BlockIDs),
			"reason", FailureReason(err), "err", logid.Redact(err.Error(), r.RequestID))...)
	}
	return err
}

func (c *Consumer) pull(ctx context.Context, r RemoteParams, dst [][]byte) error {
	if err := r.Peer().Validate(); err != nil {
		return err
	}
	if r.RequestID == "" {
		return errors.New("kv pull: kv_transfer_params lack remote_request_id")
	}
	if len(dst) != len(r.BlockIDs) {
		return fmt.Errorf("kv pull of request %q: %d destination blocks for %d remote blocks", r.RequestID, len(dst), len(r.BlockIDs))
	}
	for i, d := range dst {
		if len(d) != c.cfg.Local.BlockBytes {
			return fmt.Errorf("kv pull of request %q: destination block %d is %d bytes, want %d", r.RequestID, i, len(d), c.cfg.Local.BlockBytes)
		}
	}
	if len(dst) == 0 {
		return c.Notify(ctx, r.Peer(), r.RequestID)
	}
	err := c.withConn(ctx, r.Peer(), func(p *peerState, cn *pconn) error {
		p.mu.Lock()
		m := p.shm
		gen, offset := p.info.Generation, p.clockOffset
		p.mu.Unlock()
		if r.Generation != 0 && gen != r.Generation {
			c.dropPeer(p, "params name another registration generation")
			return fmt.Errorf("%w: prefill engine %s at %s registered its KV memory anew (generation %d, params issued under %d): the KV they name is gone", ErrPeerRestarted, r.EngineID, r.Peer().Addr(), gen, r.Generation)
		}
		if !r.Deadline.IsZero() {
			// The deadline is in the producer's clock: offset = theirs - ours.
			local := r.Deadline.Add(-offset)
			if left := time.Until(local); left < ExpiryMargin {
				return fmt.Errorf("%w: the KV of request %q on engine %s is held for %v more (its clock is %v ahead), under the %v safety margin", ErrExpired, r.RequestID, r.EngineID, left.Round(time.Millisecond), offset.Round(time.Millisecond), ExpiryMargin)
			}
		}
		if m != nil {
			return c.pullShm(ctx, m, cn, r, dst)
		}
		return c.pullTCP(ctx, cn, r, dst)
	})
	switch {
	case err == nil:
		if derr := c.done(ctx, r.Peer(), r.RequestID); derr != nil && !errors.Is(derr, ErrNotHeld) {
			// The KV is in dst and valid; the producer frees at lease
			// expiry instead.
			attrs := append([]any{"remote_engine_id", r.EngineID}, logid.Attrs(c.log, "remote_request_id", r.RequestID)...)
			c.log.Warn("kv pulled but DONE failed; the prefill frees the blocks when the lease expires",
				append(attrs, "err", logid.Redact(derr.Error(), r.RequestID))...)
		}
		return nil
	case errors.Is(err, ErrNotHeld), errors.Is(err, ErrIncompatible), errors.Is(err, ErrPeerRestarted), errors.Is(err, ErrClosed), errors.Is(err, ErrExpired):
		// Nothing to free, or nobody to tell.
	default:
		// The request will not be pulled again: let the producer free its
		// blocks now rather than at lease expiry.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(doneTimeout, c.cfg.DialTimeout))
		c.done(dctx, r.Peer(), r.RequestID)
		cancel()
	}
	return err
}

// Notify tells the producer the decode engine is done with reqID without
// pulling anything (full local prefix hit, abort before scheduling,
// rejection before admission), so it frees the blocks now. An error
// wrapping ErrNotHeld means they were already freed.
func (c *Consumer) Notify(ctx context.Context, peer Peer, reqID string) error {
	if err := peer.Validate(); err != nil {
		return err
	}
	return c.done(ctx, peer, reqID)
}

func (c *Consumer) done(ctx context.Context, peer Peer, reqID string) error {
	return c.withConn(ctx, peer, func(_ *peerState, cn *pconn) error {
		_, _, err := cn.roundTrip(ctx, c, msgDone, msgAck, func(b []byte) []byte { return appendString(b, reqID) })
		return err
	})
}

// Watch starts heartbeating reqID's lease on the producer; call it when
// the request arrives, because queueing on the decode engine is unbounded.
func (c *Consumer) Watch(peer Peer, reqID string) {
	p, err := c.peerFor(peer)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watched == nil {
		p.watched = make(map[string]struct{})
	}
	if len(p.watched) == 0 && !p.hbBusy {
		p.nextHB = time.Now().Add(c.heartbeatInterval(p))
	}
	p.watched[reqID] = struct{}{}
}

// Unwatch stops heartbeating reqID (the request finished, failed, or its
// KV arrived).
func (c *Consumer) Unwatch(peer Peer, reqID string) {
	c.mu.Lock()
	p := c.peers[peer.EngineID]
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.watched, reqID)
	p.mu.Unlock()
}

// Watched returns how many requests are being heartbeated for engineID.
func (c *Consumer) Watched(engineID string) int {
	c.mu.Lock()
	p := c.peers[engineID]
	c.mu.Unlock()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.watched)
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
	c.firstHandshakes.Add(1)
	p.mu.Lock()
	p.handshaking = true
	p.mu.Unlock()
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
		if err != nil && busy != nil && ctx.Err() != nil {
			// The deadline cut a retry short: the producer's refusal, not
			// the timeout it caused, is what the caller must hear.
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

// refusedBusy reports a connection the producer refused for lack of
// handshake slots: an ERROR busy on accept, or, under TLS (where the
// refusal is a bare close), a connection closed during the TLS handshake.
func refusedBusy(err error) bool {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Code == CodeBusy
	}
	return errors.Is(err, errTLSClosed)
}

var errTLSClosed = errors.New("connection closed during the TLS handshake")

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
