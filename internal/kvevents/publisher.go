package kvevents

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvevents/zmtp"
)

// endSeq is the replay's end marker: -1 as 8 big-endian bytes (vLLM's
// ZmqEventPublisher.END_SEQ).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Timeouts of the publisher's sockets.
const (
	handshakeTimeout = 5 * time.Second
	writeTimeout     = 10 * time.Second
)

// PublisherOptions are what the engine adds to a Config.
type PublisherOptions struct {
	// BlockSize is the engine's tokens per block (BlockStored.block_size).
	BlockSize int
	// DataParallelRank goes in every batch (0 for a Tandem engine).
	DataParallelRank int
	// Now is the clock of the batches' timestamps (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Publisher publishes an engine's KV cache events in vLLM's wire format: a
// ZMQ PUB socket sending [topic, sequence (8 bytes, big-endian), msgpack
// KVEventBatch] per engine step that changed the prefix cache, and, if
// configured, a ROUTER socket replaying the last BufferSteps batches from a
// requested sequence number, as vLLM's ZmqEventPublisher does.
//
// It is the engine's kvcache.CacheObserver: BlockStored and BlockRemoved
// collect the step's events and Flush hands them to the publishing goroutine
// through a bounded queue without ever blocking; a full queue drops the batch
// (counted), and subscribers recover through a sequence gap and the replay
// socket. BlockStored, BlockRemoved and Flush belong to the goroutine that
// owns the KV cache; the other methods are safe for concurrent use.
type Publisher struct {
	cfg  Config
	opts PublisherOptions
	log  *slog.Logger

	// Owned by the step loop.
	pending []Event
	windows []int // the engine's KV-cache groups (SetGroupWindows)

	queue   chan *Batch
	stop    chan struct{}
	stopped chan struct{}
	closing sync.Once

	pub    *zmtp.PubSocket
	replay *zmtp.RouterSocket // nil without a replay endpoint
	ring   ring

	seq uint64 // next sequence number, publishing goroutine only
	// skipForTest, if set, keeps a batch from subscribers (not from the
	// replay ring): a lost message.
	skipForTest func(seq uint64) bool
	published   atomic.Uint64
	queueDrops  atomic.Uint64
	peerDrops   atomic.Uint64
	noTokens    atomic.Uint64
	replays     atomic.Uint64
}

// NewPublisher binds (or dials) cfg's sockets and starts publishing.
func NewPublisher(cfg Config, opts PublisherOptions) (*Publisher, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if cfg.MaxQueueSize <= 0 {
		cfg.MaxQueueSize = DefaultMaxQueueSize
	}
	addr, err := tcpAddr(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("kvevents: endpoint: %w", err)
	}
	maxPeers := cfg.MaxSubscribers
	if maxPeers <= 0 {
		maxPeers = DefaultMaxSubscribers
	}
	p := &Publisher{
		cfg: cfg, opts: opts, log: opts.Logger.With("component", "kvevents"),
		queue: make(chan *Batch, cfg.MaxQueueSize), stop: make(chan struct{}), stopped: make(chan struct{}),
		ring: ring{max: cfg.BufferSteps},
	}
	zopts := zmtp.Options{HWM: max(cfg.HWM, 1), MaxPeers: maxPeers, HandshakeTimeout: handshakeTimeout, WriteTimeout: writeTimeout, Logger: p.log}
	if cfg.Connect {
		p.pub = zmtp.DialPub(addr, zopts)
	} else if p.pub, err = zmtp.ListenPub(addr, zopts); err != nil {
		return nil, fmt.Errorf("kvevents: endpoint %s: %w (if another process holds the port, pick another endpoint in --kv-events-config)", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		raddr, err := tcpAddr(cfg.ReplayEndpoint)
		if err == nil {
			ropts := zopts
			ropts.MaxFrame = maxReplayRequest
			p.replay, err = zmtp.ListenRouter(raddr, p.serveReplay, ropts)
		}
		if err != nil {
			p.pub.Close()
			return nil, fmt.Errorf("kvevents: replay endpoint %s: %w (if another process holds the port, pick another replay_endpoint in --kv-events-config)", cfg.ReplayEndpoint, err)
		}
	}
	go p.run()
	return p, nil
}

// Addr is the bound PUB address (nil when the endpoint is dialed).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the bound replay address (nil without a replay endpoint).
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// SetGroupWindows tells the publisher the engine's KV-cache groups (their
// sliding windows, 0 for full attention; engine.Engine.KVGroupWindows):
// with several, every event carries its group_idx and a BlockStored its
// group's kv_cache_spec. Call it before the first event.
func (p *Publisher) SetGroupWindows(windows []int) { p.windows = windows }

// BlockStored records that a block entered the prefix cache (of KV-cache
// group 0). A store that continues the previous one (its parent is that
// one's last block, in the same group) joins it, so a request's blocks
// cached in one step are one event per group, as in vLLM.
func (p *Publisher) BlockStored(hash, parent kvcache.BlockHash, tokens []int32) {
	p.GroupBlockStored(0, hash, parent, tokens)
}

// GroupBlockStored is BlockStored in KV-cache group g
// (kvcache.GroupCacheObserver).
func (p *Publisher) GroupBlockStored(g int, hash, parent kvcache.BlockHash, tokens []int32) {
	if g != 0 && len(p.windows) <= 1 {
		return // groups it was not told of: group 0's events only
	}
	h := WireHash(hash)
	bs := p.opts.BlockSize
	if tokens == nil {
		p.noTokens.Add(1)
	} else if bs == 0 {
		bs = len(tokens)
	}
	if n := len(p.pending); n > 0 && tokens != nil && parent != (kvcache.BlockHash{}) {
		last := &p.pending[n-1]
		if last.Kind == BlockStored && last.Group == g && last.Hashes[len(last.Hashes)-1] == WireHash(parent) &&
			len(last.Tokens) == len(last.Hashes)*len(tokens) {
			last.Hashes = append(last.Hashes, h)
			last.Tokens = append(last.Tokens, tokens...)
			return
		}
	}
	e := Event{Kind: BlockStored, Hashes: []uint64{h}, BlockSize: bs, Medium: MediumGPU}
	if len(p.windows) > 1 {
		e.Group, e.HasGroup = g, true
		if g < len(p.windows) {
			e.Window = p.windows[g]
		}
	}
	if tokens != nil {
		e.Tokens = append([]int32(nil), tokens...)
		if parent != (kvcache.BlockHash{}) {
			e.Parent, e.HasParent = WireHash(parent), true
		}
	}
	p.pending = append(p.pending, e)
}

// BlockRemoved records that a block left the prefix cache (of KV-cache
// group 0).
func (p *Publisher) BlockRemoved(hash kvcache.BlockHash) { p.GroupBlockRemoved(0, hash) }

// GroupBlockRemoved is BlockRemoved in KV-cache group g
// (kvcache.GroupCacheObserver).
func (p *Publisher) GroupBlockRemoved(g int, hash kvcache.BlockHash) {
	if g != 0 && len(p.windows) <= 1 {
		return
	}
	h := WireHash(hash)
	if n := len(p.pending); n > 0 && p.pending[n-1].Kind == BlockRemoved && p.pending[n-1].Group == g {
		p.pending[n-1].Hashes = append(p.pending[n-1].Hashes, h)
		return
	}
	e := Event{Kind: BlockRemoved, Hashes: []uint64{h}, Medium: MediumGPU}
	if len(p.windows) > 1 {
		e.Group, e.HasGroup = g, true
	}
	p.pending = append(p.pending, e)
}

// Flush hands the events recorded since the last Flush to the publishing
// goroutine as one batch, or drops them when its queue is full. It never
// blocks.
func (p *Publisher) Flush() {
	if len(p.pending) == 0 {
		return
	}
	p.enqueue(p.pending)
	p.pending = nil
}

func (p *Publisher) enqueue(events []Event) {
	b := &Batch{TS: float64(p.opts.Now().UnixNano()) / 1e9, Events: events, DataParallelRank: p.opts.DataParallelRank, HasRank: true}
	select {
	case p.queue <- b:
	default:
		p.queueDrops.Add(1)
	}
}

// Close publishes AllBlocksCleared (the engine's cache goes away with it),
// gives subscribers up to linger to receive what is queued, and closes the
// sockets. Call it after the engine stopped.
func (p *Publisher) Close(linger time.Duration) error {
	p.shutdown(true, linger)
	return nil
}

// shutdown stops publishing; final publishes AllBlocksCleared first. Tests
// call it with final false to play an engine that died.
func (p *Publisher) shutdown(final bool, linger time.Duration) {
	p.closing.Do(func() {
		if final {
			p.enqueue([]Event{{Kind: AllBlocksCleared}})
		}
		close(p.stop)
		<-p.stopped
		if p.replay != nil {
			p.replay.Close()
		}
		deadline := time.Now().Add(linger)
		for time.Now().Before(deadline) && p.pub.Unsent() > 0 {
			time.Sleep(5 * time.Millisecond)
		}
		p.pub.Close()
	})
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	// Published is the number of batches sent (the next sequence number).
	Published uint64
	// QueueDrops counts batches dropped because the publishing goroutine
	// was behind (max_queue_size); PeerDrops counts messages not queued for
	// a subscriber past its high-water mark.
	QueueDrops, PeerDrops uint64
	// StoredWithoutTokens counts blocks stored whose tokens the cache did
	// not see hashed (published with empty token_ids).
	StoredWithoutTokens uint64
	// Replays counts replay requests served.
	Replays uint64
	// Subscribers is the number of connected subscribers that subscribed
	// to a topic.
	Subscribers int
	// Rejected counts connections closed on accept, past max_subscribers
	// on the PUB socket or on the replay socket.
	Rejected uint64
}

// Stats returns the counters.
func (p *Publisher) Stats() PublisherStats {
	rejected := p.pub.Rejected()
	if p.replay != nil {
		rejected += p.replay.Rejected()
	}
	return PublisherStats{
		Published: p.published.Load(), QueueDrops: p.queueDrops.Load(), PeerDrops: p.peerDrops.Load(),
		StoredWithoutTokens: p.noTokens.Load(), Replays: p.replays.Load(), Subscribers: p.pub.Subscribers(), Rejected: rejected,
	}
}

// Collectors returns Prometheus collectors of the counters, under
// tandem:kv_events_*.
func (p *Publisher) Collectors() []prometheus.Collector {
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tandem:kv_events_" + name, Help: help}, f)
	}
	u := func(a *atomic.Uint64) func() float64 { return func() float64 { return float64(a.Load()) } }
	return []prometheus.Collector{
		counter("batches_published_total", "KV event batches published (one per engine step that changed the prefix cache).", u(&p.published)),
		counter("batches_dropped_total", "KV event batches dropped because the publisher was behind (max_queue_size); subscribers see a sequence gap and replay.", u(&p.queueDrops)),
		counter("subscriber_drops_total", "KV event messages not sent to a subscriber past its high-water mark (hwm).", u(&p.peerDrops)),
		counter("stored_without_tokens_total", "Blocks published as stored with empty token_ids (the cache did not see them hashed).", u(&p.noTokens)),
		counter("replays_total", "Replay requests served.", u(&p.replays)),
		counter("subscribers_rejected_total", "Connections to the PUB or replay socket closed on accept, past max_subscribers.", func() float64 { return float64(p.Stats().Rejected) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tandem:kv_events_subscribers", Help: "Connected KV event subscribers that subscribed to a topic."},
			func() float64 { return float64(p.Stats().Subscribers) }),
	}
}

// run is the publishing goroutine: it numbers, encodes, keeps and sends
// each batch.
func (p *Publisher) run() {
	defer close(p.stopped)
	topic := []byte(p.cfg.Topic)
	send := func(b *Batch) {
		payload := AppendBatch(nil, b, p.cfg.EventEncoding)
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], p.seq)
		p.ring.add(p.seq, payload)
		p.seq++
		p.published.Store(p.seq)
		msg := [][]byte{topic, seq[:], payload}
		if p.skipForTest != nil && p.skipForTest(p.seq-1) {
			return
		}
		p.peerDrops.Add(uint64(p.pub.Publish(msg)))
	}
	for {
		select {
		case b := <-p.queue:
			send(b)
		case <-p.stop:
			for {
				select {
				case b := <-p.queue:
					send(b)
				default:
					return
				}
			}
		}
	}
}

// maxReplayRequest bounds a replay request frame.
const maxReplayRequest = 64

// serveReplay answers replay requests on one connection: a request is
// [empty delimiter, start sequence as big-endian bytes] from a REQ or DEALER
// (vLLM's ROUTER sees [identity, "", seq]); the answer is one message
// ["", seq, payload] per kept batch from seq on, then ["", -1, ""].
func (p *Publisher) serveReplay(parts [][]byte, reply func(frames ...[]byte) error) error {
	var prefix [][]byte
	switch {
	case len(parts) == 2 && len(parts[0]) == 0:
		prefix = [][]byte{{}}
	case len(parts) == 1:
	default:
		p.log.Debug("kv events: invalid replay request", "frames", len(parts))
		return nil
	}
	req := parts[len(parts)-1]
	if len(req) == 0 || len(req) > 8 {
		p.log.Debug("kv events: invalid replay request", "bytes", len(req))
		return nil
	}
	var start uint64
	for _, b := range req {
		start = start<<8 | uint64(b)
	}
	p.replays.Add(1)
	var seq [8]byte
	for _, e := range p.ring.from(start) {
		binary.BigEndian.PutUint64(seq[:], e.seq)
		if err := reply(append(prefix, seq[:], e.payload)...); err != nil {
			return err
		}
	}
	return reply(append(prefix, endSeq, nil)...)
}

// ring keeps the last max encoded batches for replay.
type ring struct {
	mu    sync.Mutex
	max   int
	ents  []ringEntry
	start int // index of the oldest entry once full
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

func (r *ring) add(seq uint64, payload []byte) {
	if r.max <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ents) < r.max {
		r.ents = append(r.ents, ringEntry{seq, payload})
		return
	}
	r.ents[r.start] = ringEntry{seq, payload}
	r.start = (r.start + 1) % r.max
}

// from returns the kept entries with sequence numbers from start on, oldest
// first.
func (r *ring) from(start uint64) []ringEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ringEntry
	for i := range r.ents {
		e := r.ents[(r.start+i)%len(r.ents)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}
