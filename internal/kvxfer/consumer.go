package kvxfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
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
	if m := c.cfg.Metrics; m != nil {
		m.KVPullsInFlight.Inc()
		defer m.KVPullsInFlight.Dec()
	}
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
