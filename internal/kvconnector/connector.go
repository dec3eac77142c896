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
}

// pullJob is one pull the worker half starts.
type pullJob struct {
	id     string // local request id
	params kvxfer.RemoteParams
	blocks []int32 // local destination blocks, parallel to params.BlockIDs
}

// notifyJob tells a prefill that the decode does not need its KV for a
// request (or no longer does).
type notifyJob struct {
	peer  kvxfer.Peer
	reqID string
}

// connMeta is what the scheduler half hands the worker half each step.
type connMeta struct {
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
	c.report = e.ReportKV
	local := kvxfer.Info{
		EngineID:         c.cfg.EngineID,
		ModelFingerprint: c.cfg.ModelFingerprint,
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
		ln, err := kvxfer.Listen(c.cfg.Host, c.cfg.Port)
		if err != nil {
			return err
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

// CheckKVTransfer implements engine.KVRequestChecker: it refuses
// malformed params, params inconsistent with the prompt, and a role this
// engine does not have, and limits a prefill for remote decode to one
// output token.
func (c *Connector) CheckKVTransfer(kv map[string]any, promptLen int) (int, error) {
	if !c.started {
		return 0, errors.New("kvxfer: connector not started: call Start before submitting requests")
	}
	k, err := parseKV(kv, promptLen, c.blockSize, c.cfg.Bidirectional)
	if err != nil {
		return 0, err
	}
	switch {
	case k.remoteDecode && !c.cfg.Role.prefills():
		return 0, invalid("do_remote_decode asks this engine to prefill for a remote decode, but it runs with --role %s: send the prefill leg to an engine started with --role prefill or --role both", c.cfg.Role)
	case k.remote != nil && !k.remoteDecode && !c.cfg.Role.decodes():
		return 0, invalid("do_remote_prefill asks this engine to decode with KV pulled from a prefill engine, but it runs with --role %s: send the decode leg to an engine started with --role decode or --role both", c.cfg.Role)
	}
	if k.remote != nil {
		if err := c.authorize(k); err != nil {
			c.log.Warn("refused kv_transfer_params before dialing or allocating anything", "remote_engine_id", k.remote.EngineID,
				"remote_addr", k.remote.Peer().Addr(), "err", err)
			return 0, &engine.InvalidRequestError{Param: kvParam,
				Message: "kv_transfer_params were not issued by an engine of this cluster (unsigned, altered, expired, or naming a peer this engine may not contact): pass the engine's kv_transfer_params verbatim; this engine's log says which check failed"}
		}
	}
	if k.remoteDecode {
		return 1, nil
	}
	return 0, nil
}

// authorize decides whether a remote prefill's params may make this engine
// dial: with a cluster secret they must carry a valid signature over every
// field the pull uses (and the prompt length); with or without one, the
// peer must pass the address allowlist, if any. Nothing is dialed or
// allocated before this passes.
func (c *Connector) authorize(k kvRequest) error {
	if c.cons == nil {
		return errors.New("this engine pulls no KV")
	}
	if c.cfg.Secret.IsSet() {
		if err := c.signer.Verify(k.grant(), k.signature, c.cfg.Clock.Now()); err != nil {
			return err
		}
	}
	return c.cons.CheckPeer(k.remote.Peer())
}

// RejectedKVTransfer implements engine.KVRequestChecker: when a decode leg
// is refused before admission, the prefill holding its KV is told to free
// it now rather than at lease expiry — only when the params pass the same
// checks a pull would (authorize), so a refused client cannot make this
// engine dial anything either.
func (c *Connector) RejectedKVTransfer(kv map[string]any) {
	if c.cons == nil {
		return
	}
	n, _ := asInt(kv["remote_num_tokens"])
	bs := max(c.blockSize, 1)
	k, err := parseKV(kv, int(n), bs, c.cfg.Bidirectional)
	if err != nil || k.remote == nil || c.authorize(k) != nil {
		return // nobody we may tell
	}
	c.goNotify(notifyJob{peer: k.remote.Peer(), reqID: k.remote.RequestID})
}

// ReleaseKV frees the KV this prefill holds for the params it returned, at
// once, for a proxy whose decode leg never started (client gone, no decode
// reachable, decode refused). The params must carry this engine's own
// signature, so only whoever received them can release. Errors: an
// *engine.InvalidRequestError for params that are not this engine's, or
// one wrapping kvxfer.ErrNotHeld when nothing is held for them (any more).
func (c *Connector) ReleaseKV(kv map[string]any) error {
	if c.prod == nil {
		return &engine.InvalidRequestError{Param: kvParam, Message: "this engine does not prefill for remote decodes (--role decode): it holds no KV to release"}
	}
	n, ok := asInt(kv["remote_num_tokens"])
	if !ok || n < 0 {
		return invalid("remote_num_tokens is required to release KV: pass the prefill's kv_transfer_params verbatim")
	}
	k, err := parseKV(kv, int(n), c.blockSize, true)
	if err == nil && (k.remote == nil || k.remote.EngineID != c.cfg.EngineID) {
		err = invalid("these kv_transfer_params do not name KV held by this engine")
	}
	if err == nil {
		if verr := c.signer.Verify(k.grant(), k.signature, c.cfg.Clock.Now()); verr != nil {
			c.log.Warn("refused a KV release", "err", verr)
			err = invalid("kv_transfer_params are not signed by this engine")
		}
	}
	if err != nil {
		return err
	}
	err = c.prod.Release(k.remote.RequestID)
	c.updateHoldGauge()
	return err
}

// OnNewRequest implements sched.Connector: it records the request's kv
// params and, for a remote prefill, starts heartbeating the prefill's lease
// while the request queues here.
func (c *Connector) OnNewRequest(r *sched.Request) {
	if r.KVTransfer == nil || !c.started {
		return
	}
	k, err := parseKV(r.KVTransfer, len(r.Prompt), c.blockSize, c.cfg.Bidirectional)
	if err != nil {
		// Submit validated the params; a request added another way runs
		// as a plain one.
		c.log.Warn("ignoring invalid kv_transfer_params", "id", r.ID, "err", err)
		return
	}
	switch {
	case k.remoteDecode && k.remote != nil && c.prod != nil && c.cons != nil:
		// Turn 2 on a prefill: pull the history's KV (what of it is a
		// prefix of this prompt), then hold the prompt for the decode leg.
		// No heartbeats: the decode's hold is fixed (turn 2 is
		// client-driven).
		st := &connReq{remoteDecode: true, remote: k.remote, history: true}
		st.pullable = min(matchedTokens(c.cfg.ModelFingerprint, r.Prompt, k.numTokens, k.history, c.blockSize), len(r.Prompt)-1)
		if held := min(k.numTokens, len(r.Prompt)-1); st.pullable < held {
			st.recompute = "history_mismatch"
			c.log.Info("conversation history differs from the held KV; recomputing from the first difference",
				"id", r.ID, "held_tokens", k.numTokens, "matching_tokens", st.pullable)
		}
		c.reqs[r.ID] = st
	case k.remoteDecode && c.prod != nil:
		c.reqs[r.ID] = &connReq{remoteDecode: true}
	case k.remote != nil && c.cons != nil:
		c.reqs[r.ID] = &connReq{remote: k.remote, pullable: len(r.Prompt) - 1}
		c.cons.Watch(k.remote.Peer(), k.remote.RequestID)
	}
}

// GetNumNewMatchedTokens implements sched.Connector: the remote tokens
// after the local prefix hit load asynchronously — for a decode leg the
// prompt except its last token (recomputed to sample the first output
// token), for a turn-2 prefill the held history that is a prefix of the
// prompt, unless it is below the recompute threshold.
func (c *Connector) GetNumNewMatchedTokens(r *sched.Request, numLocalComputed int) (int, bool, error) {
	st := c.reqs[r.ID]
	if st == nil || st.remote == nil || st.phase != waitingForAlloc {
		return 0, false, nil
	}
	n := st.pullable - numLocalComputed
	if n <= 0 || st.history && n < c.cfg.RecomputeThreshold {
		return 0, false, nil
	}
	return n, true, nil
}

// UpdateStateAfterAlloc implements sched.Connector: it stages the pull of
// the remote blocks that the local prefix hit does not cover, or, when
// nothing is to be pulled, a notification that frees them on the prefill.
func (c *Connector) UpdateStateAfterAlloc(r *sched.Request, blocks []int32, numExternal int) {
	st := c.reqs[r.ID]
	if st == nil || st.remote == nil || st.phase != waitingForAlloc {
		return
	}
	if numExternal == 0 {
		st.phase = consumed
		if st.history {
			c.countRecompute(st, r, r.NumComputedTokens())
		}
		c.staged.notifies = append(c.staged.notifies, notifyJob{peer: st.remote.Peer(), reqID: st.remote.RequestID})
		return
	}
	if st.history && c.cfg.Metrics != nil {
		c.cfg.Metrics.HistoryTokensPulled.Add(float64(numExternal))
	}
	bs := c.blockSize
	local := r.NumComputedTokens()
	first, last := local/bs, (local+numExternal+bs-1)/bs
	st.phase = loading
	job := pullJob{id: r.ID, params: *st.remote}
	// Both bounds hold by construction (the block count was validated
	// against the prompt, the scheduler allocated for local+numExternal);
	// a request that breaks them fails its load instead of reading past
	// a slice.
	if last <= len(blocks) && last <= len(st.remote.BlockIDs) {
		job.params.BlockIDs = st.remote.BlockIDs[first:last]
		job.blocks = blocks[first:last]
	} else {
		job.params.BlockIDs = nil
		job.blocks = blocks[min(first, len(blocks)):]
	}
	c.staged.pulls = append(c.staged.pulls, job)
}

// BuildConnectorMeta implements sched.Connector: it hands the staged pulls,
// notifications and cancellations to the worker half and resets them.
func (c *Connector) BuildConnectorMeta(*sched.Output) any {
	if c.staged.empty() {
		return nil
	}
	m := c.staged
	c.staged = connMeta{}
	return &m
}

// RequestFinished implements sched.Connector. A prefill for a remote decode
// that finished normally holds its prompt blocks under a lease and returns
// the params the decode needs; aborted or failed, it frees at once. A
// remote prefill that ends before pulling tells the prefill to free; one
// that ends while pulling cancels the pull (the scheduler keeps its blocks
// until the pull reports, and the pull's DONE frees the prefill's).
func (c *Connector) RequestFinished(r *sched.Request, blockIDs []int32) (bool, map[string]any) {
	st := c.reqs[r.ID]
	if st == nil {
		return false, nil
	}
	delete(c.reqs, r.ID)
	if st.remote != nil {
		switch st.phase {
		case waitingForAlloc:
			c.staged.notifies = append(c.staged.notifies, notifyJob{peer: st.remote.Peer(), reqID: st.remote.RequestID})
		case loading:
			c.staged.cancels = append(c.staged.cancels, r.ID)
		}
	}
	if s := r.Status(); s != sched.FinishedStopped && s != sched.FinishedLength {
		return false, nil
	}
	switch {
	case st.remoteDecode:
		return c.holdForDecode(r, blockIDs)
	case c.cfg.Bidirectional && c.prod != nil:
		return c.holdConversation(r, blockIDs)
	}
	return false, nil
}

// holdForDecode holds a finished prefill's prompt blocks under a lease for
// the decode leg and returns the params the decode needs.
func (c *Connector) holdForDecode(r *sched.Request, blockIDs []int32) (bool, map[string]any) {
	ids, ok := c.leadingBlocks(r, blockIDs, len(r.Prompt))
	if !ok {
		return false, nil
	}
	now := c.cfg.Clock.Now()
	if err := c.prod.Hold(r.ID, ids, now); err != nil {
		c.log.Error("cannot hold KV for the remote decode; freeing it", "id", r.ID, "err", err)
		return false, nil
	}
	g := kvxfer.Grant{EngineID: c.cfg.EngineID, RequestID: r.ID, Host: c.advertHost, Port: c.advertPort, BlockIDs: ids, NumTokens: len(r.Prompt)}
	p := c.params(g, now.Add(c.cfg.Lease))
	p["do_remote_prefill"], p["do_remote_decode"] = true, false
	p["remote_blocks_expiry_time"] = nil
	return true, p
}

// holdConversation holds a finished decode leg's blocks — every token with
// KV, prompt and output, all but the last sampled — for DecodeHoldTTL, not
// renewed by heartbeats, so the next turn's prefill can pull them (vLLM's
// bidirectional mode), and returns the params that name them, with the
// token hash chain the prefill checks its prompt against.
func (c *Connector) holdConversation(r *sched.Request, blockIDs []int32) (bool, map[string]any) {
	n := r.NumComputedTokens()
	ids, ok := c.leadingBlocks(r, blockIDs, n)
	if !ok || n == 0 {
		return false, nil
	}
	now := c.cfg.Clock.Now()
	deadline := now.Add(c.cfg.DecodeHoldTTL)
	if err := c.prod.HoldFor(r.ID, ids, now, c.cfg.DecodeHoldTTL, true); err != nil {
		c.log.Error("cannot hold the conversation's KV for its next turn; freeing it", "id", r.ID, "err", err)
		return false, nil
	}
	tokens := append(append(make([]int32, 0, len(r.Prompt)+len(r.Output())), r.Prompt...), r.Output()...)[:n]
	chain := historyChain(c.cfg.ModelFingerprint, tokens, c.blockSize)
	g := kvxfer.Grant{EngineID: c.cfg.EngineID, RequestID: r.ID, Host: c.advertHost, Port: c.advertPort, BlockIDs: ids, NumTokens: n, Digest: chainDigest(chain)}
	p := c.params(g, deadline)
	p["do_remote_prefill"], p["do_remote_decode"] = false, true
	p["remote_blocks_expiry_time"] = float64(deadline.UnixNano()) / 1e9
	p[historyParam] = chain
	return true, p
}

// leadingBlocks returns the ids of the blocks holding r's first n tokens.
func (c *Connector) leadingBlocks(r *sched.Request, blockIDs []int32, n int) ([]int, bool) {
	nb := (n + c.blockSize - 1) / c.blockSize
	if len(blockIDs) < nb {
		c.log.Error("request finished without KV for the tokens to hold; freeing instead of holding", "id", r.ID, "blocks", len(blockIDs), "want", nb)
		return nil, false
	}
	ids := make([]int, nb)
	for i, b := range blockIDs[:nb] {
		ids[i] = int(b)
	}
	return ids, true
}

// params are the kv_transfer_params naming g's blocks on this engine,
// signed until expiry, with every field vLLM's connector returns.
func (c *Connector) params(g kvxfer.Grant, expiry time.Time) map[string]any {
	return map[string]any{
		kvxfer.SignatureParam:            c.signer.Sign(g, expiry),
		"remote_block_ids":               [][]int{g.BlockIDs},
		"remote_engine_id":               g.EngineID,
		"remote_request_id":              g.RequestID,
		"remote_host":                    g.Host,
		"remote_port":                    g.Port,
		"tp_size":                        1,
		"dcp_size":                       1,
		"pp_size":                        1,
		"transfer_mode":                  "pull",
		"remote_num_tokens":              g.NumTokens,
		"remote_registration_generation": strconv.FormatUint(c.prod.Info().Generation, 10),
	}
}

// countRecompute records why a turn-2 prefill pulled nothing.
func (c *Connector) countRecompute(st *connReq, r *sched.Request, local int) {
	reason := st.recompute
	switch {
	case reason != "":
	case st.pullable-local <= 0:
		reason = "local_hit"
	default:
		reason = "below_threshold"
	}
	if m := c.cfg.Metrics; m != nil {
		m.HistoryRecomputed.WithLabelValues(reason).Inc()
	}
	c.log.Debug("turn-2 prefill computes its history locally", "id", r.ID, "reason", reason, "local_tokens", local, "pullable", st.pullable)
}

// Step implements engine.KVWorker: it starts the step's pulls and
// notifications, cancels pulls of finished requests, sweeps expired leases
// and returns the prefill's released requests as finished_sending. Pulls
// report through Engine.ReportKV when they end.
func (c *Connector) Step(meta any) (engine.KVCompletions, error) {
	var out engine.KVCompletions
	c.mu.Lock()
	pulled := c.pulled
	c.pulled = nil
	c.mu.Unlock()
	for _, id := range pulled {
		// The pull ended (its report is already queued for the step loop):
		// nothing is left to cancel when the request finishes.
		if st := c.reqs[id]; st != nil && st.phase == loading {
			st.phase = consumed
		}
	}
	if m, ok := meta.(*connMeta); ok && m != nil {
		c.mu.Lock()
		for _, id := range m.cancels {
			if cancel := c.inflight[id]; cancel != nil {
				cancel()
			}
		}
		c.mu.Unlock()
		for _, n := range m.notifies {
			c.goNotify(n)
		}
		for _, p := range m.pulls {
			c.startPull(p)
		}
	}
	if c.prod != nil {
		c.prod.Sweep(c.cfg.Clock.Now())
		out.FinishedSending = releasedIDs(c.prod.TakeReleased())
		c.updateHoldGauge()
	}
	return out, nil
}

// RelieveMemory implements engine.MemoryReliever: it gives up the oldest
// conversation holds (never a prefill's hold for a waiting decode leg) when
// new requests lack blocks — under memory pressure new requests win over
// kept conversations, whose next turn then recomputes its history.
func (c *Connector) RelieveMemory(want int) engine.KVCompletions {
	if c.prod == nil || !c.cfg.Bidirectional || c.prod.Evict(want, c.cfg.Clock.Now()) == 0 {
		return engine.KVCompletions{}
	}
	c.updateHoldGauge()
	return engine.KVCompletions{FinishedSending: releasedIDs(c.prod.TakeReleased())}
}

func (c *Connector) updateHoldGauge() {
	if m := c.cfg.Metrics; m != nil && c.cfg.Bidirectional && c.prod != nil {
		m.ConversationHolds.Set(float64(c.prod.FixedHolds()))
	}
}

// startPull runs one pull on a goroutine. The destination slices are taken
// here, on the step loop, which owns the pool.
func (c *Connector) startPull(j pullJob) {
	dst := make([][]byte, len(j.blocks))
	for i, b := range j.blocks {
		dst[i] = c.pool.BlockBytes(b)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.report(failedLoad(j, errors.New("kv connector closed")))
		return
	}
	ctx, cancel := context.WithCancel(c.base)
	c.inflight[j.id] = cancel
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		var err error
		if len(j.params.BlockIDs) != len(j.blocks) || len(j.blocks) == 0 {
			err = fmt.Errorf("kv pull of request %q: %d remote blocks for %d local ones (engine bug)", j.id, len(j.params.BlockIDs), len(j.blocks))
		} else {
			err = c.cons.Pull(ctx, j.params, dst)
		}
		c.cons.Unwatch(j.params.Peer(), j.params.RequestID)
		c.mu.Lock()
		delete(c.inflight, j.id)
		c.pulled = append(c.pulled, j.id)
		c.mu.Unlock()
		cancel()
		if err != nil {
			c.log.Warn("kv pull failed; the request gets a generic error", "id", j.id, "remote_engine_id", j.params.EngineID,
				"remote_addr", j.params.Peer().Addr(), "reason", kvxfer.FailureReason(err), "err", err)
			c.report(failedLoad(j, err))
			return
		}
		c.report(engine.KVCompletions{FinishedRecving: []string{j.id}})
	}()
}

// failedLoad reports a pull that failed: every destination block is
// invalid (its contents are undefined), and the reason goes with it. The
// reason reaches the client, so it says nothing about what the network
// did (whether an address answered, refused or timed out, or failed to
// authenticate): only what an authenticated prefill engine answered
// (incompatible, lease expired or released, restarted, block reused) is
// spelled out, as those tell an operator what to change. The engine log
// has the details of the rest.
func failedLoad(j pullJob, err error) engine.KVCompletions {
	why := fmt.Sprintf("pulling the prompt's KV from prefill engine %s failed (%s): %v", j.params.EngineID, kvxfer.FailureReason(err), err)
	if !fromAuthenticatedPeer(err) {
		why = fmt.Sprintf("the prompt's KV could not be loaded from the prefill engine (request %s); the decode engine's log has the details — retry the request", j.id)
	}
	return engine.KVCompletions{
		FinishedRecving: []string{j.id},
		InvalidBlocks:   j.blocks,
		LoadErrors:      map[string]string{j.id: why},
	}
}

// fromAuthenticatedPeer reports errors only an authenticated producer's
// answer can cause.
func fromAuthenticatedPeer(err error) bool {
	for _, e := range []error{kvxfer.ErrIncompatible, kvxfer.ErrNotHeld, kvxfer.ErrPeerRestarted, kvxfer.ErrGenerationChanged, kvxfer.ErrBadBlock} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// goNotify tells a prefill to free a request's KV, on a goroutine.
func (c *Connector) goNotify(n notifyJob) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		c.cons.Unwatch(n.peer, n.reqID)
		ctx, cancel := context.WithTimeout(c.base, c.cfg.NotifyTimeout)
		defer cancel()
		if err := c.cons.Notify(ctx, n.peer, n.reqID); err != nil && !errors.Is(err, kvxfer.ErrNotHeld) {
			c.log.Warn("cannot tell the prefill engine to free KV this engine will not read; it frees it when the lease expires",
				"remote_engine_id", n.peer.EngineID, "remote_request_id", n.reqID, "reason", kvxfer.FailureReason(err), "err", err)
		}
	}()
}

// sweepLoop expires leases while the engine is idle (Step sweeps while it
// runs), so held blocks return to the pool without a request to drive the
// step loop.
func (c *Connector) sweepLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.prod.Sweep(c.cfg.Clock.Now())
			c.drainReleases()
		}
	}
}

// drainReleases hands the producer's releases to the step loop.
func (c *Connector) drainReleases() {
	if ids := releasedIDs(c.prod.TakeReleased()); len(ids) > 0 {
		c.report(engine.KVCompletions{FinishedSending: ids})
	}
}

func releasedIDs(rs []kvxfer.Release) []string {
	if len(rs) == 0 {
		return nil
	}
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.RequestID
	}
	return ids
}

// HeldBlocks returns how many blocks the prefill side holds for remote
// decodes (0 for a decode-only connector).
func (c *Connector) HeldBlocks() int {
	if c.prod == nil {
		return 0
	}
	return c.prod.HeldBlocks()
}

// Close cancels pulls in flight and waits for them (so nothing writes into
// the pool afterwards), then closes the side channel and the consumer.
// Engine.Shutdown calls it after the step loop stopped.
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
		err = c.prod.Close()
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
