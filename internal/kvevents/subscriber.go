package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/kvevents/zmtp"
)

// Redial backoff of a Subscriber's connections.
const (
	redialMin = 100 * time.Millisecond
	redialMax = 5 * time.Second
)

// Engine names one engine's KV event sockets for a Subscriber.
type Engine struct {
	// Name is the engine's key in the Index.
	Name string
	// Endpoint is its PUB socket ("tcp://host:5557"); ReplayEndpoint its
	// ROUTER ("" if it has none: gaps are then not recoverable and clear
	// the engine's entries).
	Endpoint, ReplayEndpoint string
	// Topic filters messages by prefix ("" takes all).
	Topic string
}

// SubscriberOptions tune a Subscriber; zero values take defaults.
type SubscriberOptions struct {
	// MaxPayload bounds one message's payload (default 64 MiB).
	MaxPayload int64
	// Timeout bounds a handshake and a replay (default 5 s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Subscriber keeps an Index current from engines' KV events: it subscribes
// to each engine's PUB socket, applies each batch in sequence order, and on a
// gap (a message lost to a high-water mark or a dropped batch) asks the
// engine's replay socket for the missing batches. Each (re)connection first
// replays from the last batch applied: if the engine answers with that batch
// unchanged it is the same engine and the rest catches up; otherwise the
// engine restarted (its sequence numbers began again) and its entries are
// cleared before its history is replayed from 0.
type Subscriber struct {
	idx  *Index
	opts SubscriberOptions
	log  *slog.Logger
	seed maphash.Seed

	mu      sync.Mutex
	engines map[string]*engineSub
}

// NewSubscriber returns a Subscriber feeding idx, following no engine yet.
func NewSubscriber(idx *Index, opts SubscriberOptions) *Subscriber {
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 64 << 20
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Subscriber{idx: idx, opts: opts, log: opts.Logger.With("component", "kvevents"), seed: maphash.MakeSeed(), engines: make(map[string]*engineSub)}
}

// EngineStats counts what a Subscriber saw of one engine.
type EngineStats struct {
	// Connected is true while the subscriber follows the engine's live
	// messages (after the replay that starts each connection).
	Connected bool
	// Next is the next sequence number expected.
	Next uint64
	// Applied counts batches applied, Duplicates batches already applied
	// (overlap of replay and live messages), Gaps sequence gaps seen,
	// Replays replay requests made, Lost batches neither received nor
	// replayable, Restarts engine restarts detected (entries cleared).
	Applied, Duplicates, Gaps, Replays, Lost, Restarts, Malformed uint64
}

type engineSub struct {
	eng    Engine
	cancel context.CancelFunc
	done   chan struct{}

	// Owned by the engine's goroutine, read under mu for Stats.
	mu      sync.Mutex
	known   bool // next and lastSum describe a batch applied
	next    uint64
	lastSum uint64
	stats   EngineStats
	errOnce bool
}

// Add starts following an engine. Adding a name already followed replaces
// its sockets.
func (s *Subscriber) Add(e Engine) error {
	if _, err := tcpAddr(e.Endpoint); err != nil {
		return fmt.Errorf("kvevents: engine %s: %w", e.Name, err)
	}
	if e.ReplayEndpoint != "" {
		if _, err := tcpAddr(e.ReplayEndpoint); err != nil {
			return fmt.Errorf("kvevents: engine %s replay: %w", e.Name, err)
		}
	}
	s.Remove(e.Name)
	s.idx.AddEngine(e.Name)
	ctx, cancel := context.WithCancel(context.Background())
	es := &engineSub{eng: e, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	s.engines[e.Name] = es
	s.mu.Unlock()
	go s.follow(ctx, es)
	return nil
}

// Remove stops following an engine and drops its entries from the index.
func (s *Subscriber) Remove(name string) {
	s.mu.Lock()
	es := s.engines[name]
	delete(s.engines, name)
	s.mu.Unlock()
	if es != nil {
		es.cancel()
		<-es.done
	}
	s.idx.RemoveEngine(name)
}

// Close stops following every engine (the index keeps its entries).
func (s *Subscriber) Close() {
	s.mu.Lock()
	all := s.engines
	s.engines = make(map[string]*engineSub)
	s.mu.Unlock()
	for _, es := range all {
		es.cancel()
	}
	for _, es := range all {
		<-es.done
	}
}

// Stats returns what the Subscriber saw of an engine.
func (s *Subscriber) Stats(name string) (EngineStats, bool) {
	s.mu.Lock()
	es := s.engines[name]
	s.mu.Unlock()
	if es == nil {
		return EngineStats{}, false
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	st := es.stats
	st.Next = es.next
	return st, true
}

// follow connects to an engine until ctx ends, reconnecting with backoff.
func (s *Subscriber) follow(ctx context.Context, es *engineSub) {
	defer close(es.done)
	backoff := redialMin
	for ctx.Err() == nil {
		start := time.Now()
		err := s.session(ctx, es)
		es.mu.Lock()
		es.stats.Connected = false
		es.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > redialMax {
			backoff = redialMin
		}
		s.log.Debug("kv events: engine connection ended", "engine", es.eng.Name, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, redialMax)
	}
}

// dial connects a socket of type sockType (zmtp.SUB or zmtp.DEALER) to
// endpoint; the connection closes when ctx ends.
func (s *Subscriber) dial(ctx context.Context, endpoint, sockType string) (*zmtp.Conn, error) {
	addr, err := tcpAddr(endpoint)
	if err != nil {
		return nil, err
	}
	return zmtp.Dial(ctx, addr, sockType, zmtp.Options{MaxFrame: s.opts.MaxPayload, HandshakeTimeout: s.opts.Timeout, Logger: s.log})
}

// session runs one connection to an engine's PUB socket.
func (s *Subscriber) session(ctx context.Context, es *engineSub) error {
	z, err := s.dial(ctx, es.eng.Endpoint, zmtp.SUB)
	if err != nil {
		return err
	}
	defer z.Close()
	if err := z.Subscribe([]byte(es.eng.Topic)); err != nil {
		return err
	}
	reconnected := es.known
	if es.eng.ReplayEndpoint != "" {
		if err := s.resync(ctx, es); err != nil {
			s.log.Warn("kv events: replay on connect failed", "engine", es.eng.Name, "err", err)
		}
		reconnected = false // the replay settled it
	}
	es.mu.Lock()
	es.stats.Connected = true
	es.mu.Unlock()
	for {
		parts, err := z.ReadMsg(nil)
		if err != nil {
			return err
		}
		if len(parts) != 3 || len(parts[1]) != 8 {
			es.count(func(st *EngineStats) { st.Malformed++ })
			continue
		}
		seq := binary.BigEndian.Uint64(parts[1])
		if reconnected {
			// No replay socket: the first message after a reconnect tells
			// whether the engine restarted (its sequence went back) or
			// batches were lost while away.
			reconnected = false
			if seq < es.next {
				s.restart(es)
			}
		}
		s.live(ctx, es, seq, parts[2])
	}
}

// live handles a batch from the PUB socket: on a gap it first replays the
// missing batches.
func (s *Subscriber) live(ctx context.Context, es *engineSub, seq uint64, payload []byte) {
	gap := es.known && seq > es.next
	if gap {
		es.count(func(st *EngineStats) { st.Gaps++ })
	}
	// A gap, or a first message that is not the engine's first batch (the
	// replay on connect came before it published them, or there was none).
	if es.eng.ReplayEndpoint != "" && (gap || !es.known && seq > 0) {
		from := es.next
		if err := s.replay(ctx, es, from, func(rs uint64, p []byte) bool {
			if rs < seq {
				s.inOrder(es, rs, p)
			}
			return rs < seq
		}); err != nil {
			s.log.Warn("kv events: replay failed", "engine", es.eng.Name, "from", from, "err", err)
		}
	}
	s.inOrder(es, seq, payload)
}

// inOrder applies batch seq if it is the next one, skips it if it was
// applied, and otherwise (batches lost for good: what they removed may
// linger) clears the engine's entries and starts over from it.
func (s *Subscriber) inOrder(es *engineSub, seq uint64, payload []byte) {
	switch {
	case es.known && seq < es.next:
		es.count(func(st *EngineStats) { st.Duplicates++ })
		return
	case es.known && seq > es.next:
		lost := seq - es.next
		es.count(func(st *EngineStats) { st.Lost += lost })
		s.log.Warn("kv events: batches lost, clearing the engine's entries", "engine", es.eng.Name, "from", es.next, "to", seq-1)
		s.idx.ClearEngine(es.eng.Name)
	}
	s.apply(es, seq, payload)
}

// resync replays on (re)connection: from the last batch applied, checking
// it is unchanged (same engine), or from 0 for an engine not seen before or
// restarted.
func (s *Subscriber) resync(ctx context.Context, es *engineSub) error {
	if es.known {
		last, sum := es.next-1, es.lastSum
		same, first := false, true
		err := s.replay(ctx, es, last, func(seq uint64, p []byte) bool {
			if first {
				first = false
				same = seq == last && maphash.Bytes(s.seed, p) == sum
				return same
			}
			s.inOrder(es, seq, p)
			return true
		})
		if err != nil {
			return err
		}
		if same {
			return nil
		}
		s.restart(es)
	}
	return s.replay(ctx, es, 0, func(seq uint64, p []byte) bool {
		s.inOrder(es, seq, p)
		return true
	})
}

// restart clears an engine that restarted.
func (s *Subscriber) restart(es *engineSub) {
	s.log.Info("kv events: engine restarted, clearing its entries", "engine", es.eng.Name)
	s.idx.ClearEngine(es.eng.Name)
	es.mu.Lock()
	es.known, es.next, es.lastSum = false, 0, 0
	es.stats.Restarts++
	es.mu.Unlock()
}

// apply decodes and applies batch seq and makes it the last one applied.
func (s *Subscriber) apply(es *engineSub, seq uint64, payload []byte) {
	b, err := DecodeBatch(payload)
	if err != nil {
		// Skip it but keep the sequence: one bad batch must not stall the
		// engine's stream.
		es.count(func(st *EngineStats) { st.Malformed++ })
		if !es.errOnce {
			es.errOnce = true
			s.log.Warn("kv events: undecodable batch", "engine", es.eng.Name, "seq", seq, "err", err)
		}
	} else {
		s.idx.Apply(es.eng.Name, b)
	}
	es.mu.Lock()
	es.known, es.next, es.lastSum = true, seq+1, maphash.Bytes(s.seed, payload)
	es.stats.Applied++
	es.mu.Unlock()
}

func (es *engineSub) count(f func(*EngineStats)) {
	es.mu.Lock()
	f(&es.stats)
	es.mu.Unlock()
}

// replay asks the engine's replay socket for the batches from start on and
// passes each to f in order until f returns false or the end marker.
func (s *Subscriber) replay(ctx context.Context, es *engineSub, start uint64, f func(seq uint64, payload []byte) bool) error {
	es.count(func(st *EngineStats) { st.Replays++ })
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	z, err := s.dial(ctx, es.eng.ReplayEndpoint, zmtp.DEALER)
	if err != nil {
		return err
	}
	defer z.Close()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if err := z.Write(nil, req[:]); err != nil { // [delimiter, start] as a REQ sends it
		return err
	}
	if err := z.Flush(); err != nil {
		return err
	}
	for {
		parts, err := z.ReadMsg(nil)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("replay from %d: %w", start, ctx.Err())
			}
			return err
		}
		if len(parts) > 0 && len(parts[0]) == 0 {
			parts = parts[1:] // the delimiter
		}
		if len(parts) != 2 || len(parts[0]) != 8 {
			return errors.New("malformed replay message")
		}
		seq := binary.BigEndian.Uint64(parts[0])
		if seq == binary.BigEndian.Uint64(endSeq) {
			return nil
		}
		if !f(seq, parts[1]) {
			return nil
		}
	}
}
