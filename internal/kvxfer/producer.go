package kvxfer

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/clock"
	"github.com/tandem-serve/tandem/internal/metrics"
)

// Defaults for ProducerConfig and ConsumerConfig.
const (
	DefaultMaxConns          = 256
	DefaultMaxConnsPerPeer   = 128
	DefaultMaxPending        = 128
	DefaultMaxPendingPerHost = 32
	DefaultIOTimeout         = 10 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
)

// BlockMemory is the producer's view of the KV pool. Block returns the
// block's bytes in pool memory (not a copy) and Generation its reuse
// counter. The pool must not reuse a held block before the step loop frees
// it after a Release, and must bump a block's generation (atomically)
// before writing new content into a reallocated block.
type BlockMemory interface {
	NumBlocks() int
	BlockBytes() int
	Block(id int) []byte
	Generation(id int) uint64
}

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	// Local identifies this engine and its model and KV geometry. BlockBytes,
	// NumBlocks, Host and Lease are filled in by NewProducer.
	Local Info
	// Memory is the KV pool the blocks are served from.
	Memory BlockMemory
	// Shm, if set, offers the pool file to same-host consumers. Dev and
	// Inode are filled in from the file.
	Shm *ShmLayout
	// Lease is how long blocks are held without a heartbeat (DefaultLease).
	Lease time.Duration
	// Secret authenticates consumers (and this producer to them); the zero
	// Secret runs the same handshake with a well-known key, which
	// authenticates nothing: then Peers must restrict who may connect.
	Secret Secret
	// Peers, if set, is the allowlist of consumer addresses; others are
	// refused on accept, before anything is read.
	Peers *PeerPolicy
	// TLS, if set, wraps every accepted connection (see TLSConfigs); its
	// handshake counts against HelloTimeout and AuthTimeout.
	TLS *tls.Config
	// HelloTimeout bounds the time from accept to the consumer's first
	// frame, HELLO (DefaultHelloTimeout): a consumer sends it at once, so a
	// connection that stays silent or dribbles bytes gives its handshake
	// slot back early.
	HelloTimeout time.Duration
	// AuthTimeout bounds a connection's whole handshake
	// (DefaultAuthTimeout).
	AuthTimeout time.Duration
	// MaxConns bounds concurrent authenticated side-channel connections
	// (DefaultMaxConns), and MaxConnsPerPeer those of one consumer
	// engine (DefaultMaxConnsPerPeer), identified by the engine id it
	// announced with its proof of the secret, not by its address: decode
	// engines on one host share an address but not a budget.
	MaxConns        int
	MaxConnsPerPeer int
	// MaxPending bounds connections still in their handshake
	// (DefaultMaxPending), and MaxPendingPerHost those from one IP
	// address (DefaultMaxPendingPerHost). These are a budget of their own:
	// unauthenticated connections never take an authenticated one's slot.
	// When they are full a new connection is not refused: it displaces
	// the oldest pending connection (of its address when that address is
	// full) that has not sent its HELLO yet, else the oldest one. A real
	// consumer sends HELLO at once and answers the challenge within a
	// round trip, so a flood of idle or slow connections, even from the
	// decodes' own address, cannot keep it out; the displaced one is told
	// busy and, if it was real, retries.
	MaxPending        int
	MaxPendingPerHost int
	// IOTimeout bounds each read or write on a connection once a request is
	// in progress (DefaultIOTimeout).
	IOTimeout time.Duration
	// IdleTimeout closes connections that send no request for this long
	// (DefaultIdleTimeout).
	IdleTimeout time.Duration
	// Clock is used for network-driven lease events (default: system clock).
	Clock clock.Clock
	// OnRelease, if set, is called (without locks held, from a side-channel
	// goroutine) after a network event queued a release — a DONE, or a read
	// that ended a deferred release or found the lease expired — so the
	// step loop can drain TakeReleased without waiting for its next step.
	OnRelease func()
	Metrics   *metrics.Engine // may be nil
	Logger    *slog.Logger    // default slog.Default()
}

// Producer is the prefill side of the connector: it holds finished
// requests' blocks under leases and serves them on the side channel.
//
// The engine's step loop owns block accounting. It calls Hold when a
// request meant for remote decode finishes, and each step calls Sweep and
// TakeReleased and frees what TakeReleased returns. The producer never
// frees a block itself. Methods are safe for concurrent use.
type Producer struct {
	cfg  ProducerConfig
	info Info
	log  *slog.Logger
	mem  BlockMemory

	mu     sync.Mutex
	leases *leaseTable
	ln     []net.Listener
	// conns are the open connections (raw, before TLS), each marked idle
	// while it waits for its next request (or is still in its handshake):
	// Shutdown closes those at once and lets the others answer first.
	conns    map[net.Conn]bool
	connGone chan struct{} // a connection ended (for Shutdown)
	// quiescing: Shutdown began; no connection is accepted and none
	// starts another request.
	quiescing bool
	// authed counts connections past the handshake, in total and per
	// consumer engine id (authedBy); pending holds those still in it, and
	// pendingBy counts them per remote IP.
	authed    int
	authedBy  map[string]int
	pending   map[net.Conn]*pendingConn
	pendingBy map[string]int
	// pendingSeq orders pending connections by accept, for displacement.
	pendingSeq uint64
	// unauthLog rate-limits the lines about connections that never
	// authenticated, so none of their peers can flood the log.
	unauthLog *logLimiter
	closed    bool
	wg        sync.WaitGroup
}

// NewProducer validates cfg and returns a Producer. Call Serve to accept
// side-channel connections.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if cfg.Memory == nil {
		return nil, errors.New("kvxfer: producer needs the KV pool memory")
	}
	if cfg.Local.EngineID == "" {
		return nil, errors.New("kvxfer: producer needs an engine id")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerPeer <= 0 {
		cfg.MaxConnsPerPeer = min(DefaultMaxConnsPerPeer, cfg.MaxConns)
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxPendingPerHost <= 0 {
		cfg.MaxPendingPerHost = DefaultMaxPendingPerHost
	}
	if cfg.AuthTimeout <= 0 {
		cfg.AuthTimeout = DefaultAuthTimeout
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = DefaultHelloTimeout
	}
	cfg.HelloTimeout = min(cfg.HelloTimeout, cfg.AuthTimeout)
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.System{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	info := cfg.Local
	info.BlockBytes = cfg.Memory.BlockBytes()
	info.NumBlocks = cfg.Memory.NumBlocks()
	info.Host = LocalHost()
	info.Lease = cfg.Lease
	info.Pid = os.Getpid()
	info.Generation = registrationGeneration()
	info.Shm = ShmLayout{}
	if info.BlockBytes <= 0 || info.BlockBytes > 1<<31 {
		return nil, fmt.Errorf("kvxfer: block size of %d bytes is out of range", info.BlockBytes)
	}
	if cfg.Shm != nil {
		l, err := statShm(*cfg.Shm, info.BlockBytes, info.NumBlocks)
		if err != nil {
			return nil, fmt.Errorf("kvxfer: cannot offer the KV pool to same-host decode engines: %w", err)
		}
		info.Shm = l
	}
	p := &Producer{
		cfg:       cfg,
		info:      info,
		log:       cfg.Logger.With("component", "kvxfer.producer", "engine_id", info.EngineID),
		mem:       cfg.Memory,
		leases:    newLeaseTable(info.EngineID, cfg.Lease),
		conns:     make(map[net.Conn]bool),
		connGone:  make(chan struct{}, 1),
		authedBy:  make(map[string]int),
		pending:   make(map[net.Conn]*pendingConn),
		pendingBy: make(map[string]int),
		unauthLog: newLogLimiter(refusalLogInterval, refusalLogAddrs, cfg.Clock),
	}
	p.exportHoldAges()
	return p, nil
}

// Info returns what this producer announces in handshakes.
func (p *Producer) Info() Info { return p.info }

// Hold puts a finished request's blocks under a lease, starting now. The
// step loop calls it when a request with do_remote_decode finishes; the
// blocks stay allocated until a Release for reqID comes out of TakeReleased.
func (p *Producer) Hold(reqID string, blocks []int, now time.Time) error {
	return p.HoldFor(reqID, blocks, now, p.cfg.Lease, false)
}

// HoldFor is Hold with a lease of d; with fixed, heartbeats do not extend
// it and Evict may end it early (a decode engine's conversation hold).
func (p *Producer) HoldFor(reqID string, blocks []int, now time.Time, d time.Duration, fixed bool) error {
	gens := make([]uint64, len(blocks))
	n := p.mem.NumBlocks()
	for i, b := range blocks {
		if b < 0 || b >= n {
			return fmt.Errorf("hold request %q: block id %d out of range [0,%d)", reqID, b, n)
		}
		gens[i] = p.mem.Generation(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.leases.holdFor(reqID, blocks, gens, now, d, fixed); err != nil {
		return err
	}
	p.gaugeLocked()
	return nil
}

// Evict gives up the oldest fixed holds until at least want blocks are
// queued for release, for an engine whose new requests lack blocks, and
// returns how many blocks it freed that way. Leases for a waiting decode
// leg (not fixed) are never evicted.
func (p *Producer) Evict(want int, now time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.leases.evict(want, now)
	if n > 0 {
		p.log.Info("gave up conversation KV holds to make room for new requests", "blocks", n)
	}
	p.gaugeLocked()
	return n
}

// FixedHolds returns how many fixed holds (conversations) are held.
func (p *Producer) FixedHolds() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.leases.held {
		if l.fixed {
			n++
		}
	}
	return n
}

// Sweep expires every lease that ran out by now (a full sweep; leases with
// a READ in flight wait for it to end) and returns how many expired. Their
// releases are queued for TakeReleased.
func (p *Producer) Sweep(now time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.leases.sweep(now)
	if n > 0 {
		if m := p.cfg.Metrics; m != nil {
			m.KVLeasesExpired.Add(float64(n))
		}
		p.log.Warn("kv leases expired before the decode engine read them", "count", n)
	}
	p.gaugeLocked()
	return n
}

// TakeReleased returns the requests whose blocks the step loop may now
// free (DONE received or lease expired) and forgets them.
func (p *Producer) TakeReleased() []Release {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leases.takeReleased()
}

// HeldRequests returns how many requests' blocks are held (a lease, or a
// release waiting for a read in flight to end).
func (p *Producer) HeldRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.leases.held)
}

// HeldBlocks returns how many blocks are under a live lease.
func (p *Producer) HeldBlocks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leases.nblocks
}

func (p *Producer) gaugeLocked() {
	if m := p.cfg.Metrics; m != nil {
		m.KVBlocksHeld.Set(float64(p.leases.nblocks))
	}
}

// Release ends a held request's lease as a DONE would, for a release that
// reached the engine another way (a proxy whose decode leg never started).
// It wraps ErrNotHeld when nothing is held for reqID.
func (p *Producer) Release(reqID string) error {
	p.mu.Lock()
	err := p.leases.done(reqID, p.cfg.Clock.Now())
	p.gaugeLocked()
	p.mu.Unlock()
	p.released()
	return err
}

// released calls OnRelease if releases are waiting for TakeReleased.
func (p *Producer) released() {
	if p.cfg.OnRelease == nil {
		return
	}
	p.mu.Lock()
	n := len(p.leases.released)
	p.mu.Unlock()
	if n > 0 {
		p.cfg.OnRelease()
	}
}

// registrationGeneration is a fresh random value per producer: the KV
// memory a process registers is new each time it starts.
func registrationGeneration() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}
