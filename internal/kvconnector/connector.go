package kvconnector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/clock"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/sched"
)

// ConnectorConfig configures a Connector.
type ConnectorConfig struct {
	// Role says which kv_transfer_params the engine accepts (default
	// RoleBoth).
	Role Role
	// EngineID identifies this engine process; a fresh UUID per process, so
	// a restarted prefill is a new engine to its decodes.
	EngineID string
	// ModelFingerprint identifies the model and weights (model.Model's
	// Fingerprint); engines with different fingerprints refuse each other.
	ModelFingerprint string
	// Kernels is the CPU kernel set the engine computes with (tensor.ISA),
	// told to peers in the handshake (kvxfer.Info.Kernels).
	Kernels string
	// Host and Port are where the side channel listens (prefill and both)
	// and what the prefill advertises in remote_host and remote_port. Port
	// 0 picks a free port. An unspecified host (0.0.0.0, ::) binds every
	// interface and advertises this machine's hostname.
	Host string
	Port int
	// Lease is how long a prefill holds KV no decode has read (kvxfer.DefaultLease).
	Lease time.Duration
	// Transport is how a decode pulls (TransportAuto).
	Transport kvxfer.Transport
	// Secret is the cluster's KV secret (kvxfer.LoadSecret). With it, a
	// prefill signs the kv_transfer_params it returns, a decode accepts
	// only params signed with it, and side-channel peers prove they know
	// it. Without it (the zero Secret) Peers is all that limits whom a
	// decode dials and who may connect to a prefill.
	Secret kvxfer.Secret
	// Peers is the side channel's address allowlist (kvxfer.ParsePeers).
	// Nil means loopback only without a Secret, and no address limit with
	// one.
	Peers *kvxfer.PeerPolicy
	// TLSServer and TLSClient, if set (kvxfer.TLSConfigs), wrap the side
	// channel in mutual TLS.
	TLSServer, TLSClient *tls.Config
	// Listener, if set, is the side channel's listener (a TCP listener on
	// Host:Port otherwise; the prefill advertises Host and the listener's
	// port), and Dial, if set, opens a decode's side-channel connections
	// (kvxfer.ConsumerConfig.Dial). Tests run engines in memory with them,
	// under testing/synctest.
	Listener net.Listener
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	// Bidirectional turns on multi-turn KV reuse (vLLM's
	// bidirectional_kv_xfer; must be on in prefill and decode engines): a
	// decode leg that finishes normally holds its conversation's KV for
	// DecodeHoldTTL and returns params naming it, and a prefill given such
	// params pulls the history instead of computing it. Every role then
	// runs both a side channel and a consumer.
	Bidirectional bool
	// DecodeHoldTTL is how long a decode holds a conversation for its next
	// turn (DefaultDecodeHoldTTL); heartbeats do not extend it.
	DecodeHoldTTL time.Duration
	// RecomputeThreshold: a turn-2 prefill computes a history shorter than
	// this many tokens (beyond its local prefix hit) instead of pulling it
	// (DefaultRecomputeThreshold; negative means always pull).
	RecomputeThreshold int
	// SweepInterval is how often idle leases are checked for expiry
	// (default Lease/30, between 10 ms and 1 s).
	SweepInterval time.Duration
	// HeartbeatInterval overrides the decode's heartbeat period (default
	// the prefill's lease / 6).
	HeartbeatInterval time.Duration
	// NotifyTimeout bounds telling a prefill to free KV it does not need to
	// send (default kvxfer.DefaultDialTimeout).
	NotifyTimeout time.Duration
	// PullTimeout is a pull's deadline, from its start (DefaultPullTimeout):
	// a pull that has not completed by then is cancelled and fails (reason
	// io), and the load-failure policy handles its request.
	PullTimeout time.Duration
	// Clock stamps and expires leases (default: the system clock).
	Clock   clock.Clock
	Metrics *metrics.Engine // may be nil
	Logger  *slog.Logger    // default slog.Default()
}

// Connector is Tandem's prefill/decode KV connector inside one engine: the
// scheduler half (sched.Connector) decides what to load and what to hold,
// the worker half (engine.KVWorker) moves bytes with a kvxfer.Producer (prefill
// side) and a kvxfer.Consumer (decode side).
//
// Threading. The engine's step loop calls the scheduler half and Step; they
// share the per-request state without locks. Pulls, notifications and the
// lease sweeper run on goroutines of their own: they touch only the block
// memory a pull was given, the thread-safe kvxfer.Producer and kvxfer.Consumer, and the
// in-flight table under mu, and report to the step loop through
// Engine.ReportKV. CheckKVTransfer and RejectedKVTransfer run on the
// submitting goroutine and read only configuration.
//
// Lifecycle: NewConnector, engine.New with the connector as both
// Config.Connector and Config.KVWorker, Start with the engine (before any
// Submit), and Engine.Shutdown, which closes the connector once the step
// loop stopped and before the pool is released.
type Connector struct {
	cfg ConnectorConfig
	log *slog.Logger

	// Set by Start, read-only afterwards.
	started    bool
	pool       *kvcache.Pool
	blockSize  int
	windows    []int // the pool's KV-cache groups (engine.Engine.KVGroupWindows)
	report     func(engine.KVCompletions)
	prod       *kvxfer.Producer
	cons       *kvxfer.Consumer
	advertHost string
	advertPort int
	signer     *kvxfer.Signer

	// Step-loop state.
	reqs   map[string]*connReq
	staged connMeta

	// Shared with the goroutines.
	mu       sync.Mutex
	closed   bool
	inflight map[string]context.CancelFunc // pulls by local request id
	pulled   []string                      // pulls that ended, for Step to mark consumed
	wg       sync.WaitGroup
	base     context.Context
	cancel   context.CancelFunc
	stop     chan struct{}
}

// phase is where a remote-prefill request is in its KV load.
type phase uint8

const (
	// waitingForAlloc: no blocks yet; the prefill holds the KV.
	waitingForAlloc phase = iota
	// loading: a pull into the request's blocks is in flight.
	loading
	// consumed: pulled, or nothing to pull (full local hit); the prefill
	// was told. A preempted request recomputes locally.
	consumed
)

// connReq is the connector's state for one request with kv params.
type connReq struct {
	remoteDecode bool
	remote       *kvxfer.RemoteParams // where KV to pull is
	phase        phase
	// history: remote is a decode's conversation hold (turn 2 on a
	// prefill), of which pullable tokens are this prompt's prefix;
	// recompute says why not all of it, if so.
	history   bool
	pullable  int
	recompute string
	// groups are the remote KV-cache groups' block lists for KV of
	// remoteTokens tokens (kvRequest.groups).
	groups       [][]int
	remoteTokens int
	// expired: the params are genuine but past their expiry (why, wrapping
	// kvxfer.ErrSignatureExpired). The issuer's hold has ended: nothing is
	// dialed (no heartbeat, pull or notification), and a load fails at
	// once for the load-failure policy.
	expired error
}

// pullJob is one pull the worker half starts.
type pullJob struct {
	id      string // local request id
	params  kvxfer.RemoteParams
	blocks  []int32      // local destination blocks, parallel to params.BlockIDs
	history *historyPull // a turn-2 prefill's pull of a conversation's history; nil for a decode leg
	expired error        // connReq.expired: fail without dialing
}

// historyPull is what the metrics need of a history pull once it ended.
type historyPull struct {
	tokens    int    // the history tokens it pulls
	recompute string // why not all of the prompt's history is pulled, if so (reasonMismatch)
}

// notifyJob tells a prefill that the decode does not need its KV for a
// request (or no longer does).
type notifyJob struct {
	peer  kvxfer.Peer
	reqID string
}

// connMeta is what the scheduler half hands the worker half each step
// (sched.ConnectorMeta).
type connMeta struct {
	c        *Connector // whose worker half runs it
	pulls    []pullJob
	notifies []notifyJob
	cancels  []string // local ids of requests whose pull must stop
}

func (m *connMeta) empty() bool { return len(m.pulls)+len(m.notifies)+len(m.cancels) == 0 }

// Defaults of ConnectorConfig's multi-turn settings (vLLM's
// decoder_kv_blocks_ttl and kv_recompute_threshold).
const (
	DefaultDecodeHoldTTL      = 480 * time.Second
	DefaultRecomputeThreshold = 64
)

// DefaultPullTimeout is ConnectorConfig.PullTimeout's default: far above any
// transfer's time, so that only a pull that is stuck reaches it.
const DefaultPullTimeout = 2 * time.Minute

// NewConnector validates cfg. Start attaches it to its engine.
func NewConnector(cfg ConnectorConfig) (*Connector, error) {
	if cfg.Role == "" {
		cfg.Role = RoleBoth
	}
	if _, err := ParseRole(string(cfg.Role)); err != nil {
		return nil, fmt.Errorf("kvxfer: %w", err)
	}
	if cfg.EngineID == "" {
		return nil, errors.New("kvxfer: the connector needs an engine id")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = kvxfer.DefaultLease
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = min(max(cfg.Lease/30, 10*time.Millisecond), time.Second)
	}
	if cfg.NotifyTimeout <= 0 {
		cfg.NotifyTimeout = kvxfer.DefaultDialTimeout
	}
	if cfg.PullTimeout <= 0 {
		cfg.PullTimeout = DefaultPullTimeout
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("kvxfer: --kv-port %d is not a TCP port", cfg.Port)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.System{}
	}
	if cfg.DecodeHoldTTL <= 0 {
		cfg.DecodeHoldTTL = DefaultDecodeHoldTTL
	}
	switch {
	case cfg.RecomputeThreshold == 0:
		cfg.RecomputeThreshold = DefaultRecomputeThreshold
	case cfg.RecomputeThreshold < 0:
		cfg.RecomputeThreshold = 0
	}
	if cfg.Peers == nil && !cfg.Secret.IsSet() {
		cfg.Peers, _ = kvxfer.ParsePeers(kvxfer.DefaultPeers)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Connector{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "kvconnector", "engine_id", cfg.EngineID, "role", string(cfg.Role)),
		reqs:     make(map[string]*connReq),
		inflight: make(map[string]context.CancelFunc),
		stop:     make(chan struct{}),
		signer:   kvxfer.NewSigner(cfg.Secret),
	}
	c.base, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Start attaches the connector to e, whose Config names it as Connector and
// KVWorker: a prefill (or both) opens the side channel on Host:Port and
// starts the lease sweeper, a decode (or both) starts its consumer. Call it
// before the first Submit. On error, shut the engine down (which closes the
// connector).
func (c *Connector) Start(e *engine.Engine) error {
	if c.started {
		return errors.New("kvxfer: connector already started")
	}
	c.pool = e.KVPool()
	l := c.pool.Layout()
	c.blockSize = l.BlockSize
	c.windows = e.KVGroupWindows()
	c.report = e.ReportKV
	local := kvxfer.Info{
		EngineID:         c.cfg.EngineID,
		ModelFingerprint: c.cfg.ModelFingerprint,
		Kernels:          c.cfg.Kernels,
		KVDType:          l.DType.String(),
		Layers:           l.Layers,
		KVHeads:          l.KVHeads,
		HeadDim:          l.HeadDim,
		BlockSize:        l.BlockSize,
		BlockBytes:       l.BlockBytes(),
		NumBlocks:        c.pool.NumBlocks(),
	}
	if c.cfg.Role.prefills() || c.cfg.Bidirectional {
		blocksOff, gensOff := c.pool.FileOffsets()
		var shm *kvxfer.ShmLayout
		if c.pool.Sealed() {
			shm = &kvxfer.ShmLayout{Path: c.pool.Path(), BlocksOffset: blocksOff, GenerationsOffset: gensOff}
		}
		prod, err := kvxfer.NewProducer(kvxfer.ProducerConfig{
			Local:     local,
			Memory:    poolMemory{c.pool},
			Shm:       shm,
			Lease:     c.cfg.Lease,
			Secret:    c.cfg.Secret,
			Peers:     c.cfg.Peers,
			TLS:       c.cfg.TLSServer,
			Clock:     c.cfg.Clock,
			OnRelease: c.drainReleases,
			Metrics:   c.cfg.Metrics,
			Logger:    c.cfg.Logger,
		})
		if err != nil {
			return err
		}
		ln := c.cfg.Listener
		if ln == nil {
			if ln, err = kvxfer.Listen(c.cfg.Host, c.cfg.Port); err != nil {
				return err
			}
		}
		c.prod = prod
		c.advertHost = advertisedHost(c.cfg.Host)
		c.advertPort = ln.Addr().(*net.TCPAddr).Port
		c.wg.Add(2)
		go func() {
			defer c.wg.Done()
			if err := prod.Serve(ln); err != nil {
				c.log.Error("kv side channel stopped: decode engines can no longer pull from this engine", "err", err)
			}
		}()
		go c.sweepLoop()
	}
	if c.cfg.Role.decodes() || c.cfg.Bidirectional {
		cons, err := kvxfer.NewConsumer(kvxfer.ConsumerConfig{
			Local:             local,
			Transport:         c.cfg.Transport,
			Secret:            c.cfg.Secret,
			Peers:             c.cfg.Peers,
			TLS:               c.cfg.TLSClient,
			Dial:              c.cfg.Dial,
			HeartbeatInterval: c.cfg.HeartbeatInterval,
			Metrics:           c.cfg.Metrics,
			Logger:            c.cfg.Logger,
		})
		if err != nil {
			return err
		}
		c.cons = cons
	}
	c.started = true
	peers := "any address (signed params)"
	if c.cfg.Peers != nil {
		peers = c.cfg.Peers.String()
	}
	c.log.Info("kv connector started", "side_channel", c.SideChannelAddr(), "lease", c.cfg.Lease, "transport", string(c.cfg.Transport),
		"kv_secret", c.cfg.Secret.IsSet(), "kv_peers", peers, "kv_tls", c.cfg.TLSServer != nil || c.cfg.TLSClient != nil)
	if !c.cfg.Secret.IsSet() {
		c.log.Warn("no KV secret (--kv-secret-file or " + kvxfer.SecretEnv + "): kv_transfer_params are not signed and the side channel authenticates nobody; only --kv-peers addresses are dialed and accepted")
	}
	return nil
}

// SideChannelAddr returns the advertised side-channel address of a prefill
// (host:port), or "" for a decode-only connector.
func (c *Connector) SideChannelAddr() string {
	if c.prod == nil {
		return ""
	}
	return net.JoinHostPort(c.advertHost, strconv.Itoa(c.advertPort))
}

// advertisedHost is what a prefill bound to host tells decodes to dial.
func advertisedHost(host string) string {
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			return h
		}
	}
	return host
}

// poolMemory is a kvcache.Pool as the producer reads it: only block bytes
// and generations, which are safe to read from other goroutines.
type poolMemory struct{ p *kvcache.Pool }

func (m poolMemory) NumBlocks() int           { return m.p.NumBlocks() }
func (m poolMemory) BlockBytes() int          { return m.p.Layout().BlockBytes() }
func (m poolMemory) Block(id int) []byte      { return m.p.BlockBytes(int32(id)) }
func (m poolMemory) Generation(id int) uint64 { return m.p.Generation(int32(id)) }

// HeldBlocks returns how many blocks the prefill side holds for remote
// decodes (0 for a decode-only connector).
func (c *Connector) HeldBlocks() int {
	if c.prod == nil {
		return 0
	}
	return c.prod.HeldBlocks()
}

// HeldRequests returns how many finished requests' KV the prefill side
// holds for remote decodes (or conversations, with Bidirectional); 0 for a
// decode-only connector.
func (c *Connector) HeldRequests() int {
	if c.prod == nil {
		return 0
	}
	return c.prod.HeldRequests()
}

// ServesKV reports whether this connector runs a side channel and so may
// hold KV for another engine (a prefill, both, or Bidirectional): a drain
// waits for its holds.
func (c *Connector) ServesKV() bool { return c.prod != nil }

// Lease is the prefill's KV lease (ConnectorConfig.Lease with its default).
func (c *Connector) Lease() time.Duration { return c.cfg.Lease }

// closeGrace bounds how long Close lets side-channel requests in progress
// (a READ on the wire, a DONE being acknowledged) finish before it cuts
// their connections.
const closeGrace = time.Second

// Close cancels pulls in flight and waits for them (so nothing writes into
// the pool afterwards), then shuts the side channel down gracefully
// (kvxfer.Producer.Shutdown, for at most a second: a decode's last DONE
// gets its ACK) and closes the consumer. Engine.Shutdown calls it after the
// step loop stopped, so after its drain: a prefill's side channel serves
// held KV until then.
func (c *Connector) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for _, cancel := range c.inflight {
		cancel()
	}
	c.mu.Unlock()
	close(c.stop)
	c.cancel()
	var err error
	if c.prod != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		err = c.prod.Shutdown(ctx)
		cancel()
	}
	c.wg.Wait()
	if c.cons != nil {
		err = errors.Join(err, c.cons.Close())
	}
	return err
}

var (
	_ sched.Connector         = (*Connector)(nil)
	_ engine.KVWorker         = (*Connector)(nil)
	_ engine.KVRequestChecker = (*Connector)(nil)
	_ engine.MemoryReliever   = (*Connector)(nil)
)
