package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/tandem-serve/tandem/internal/clock"
	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Config configures an Engine.
type Config struct {
	// Model is the forward pass: a *model.Model, or a simulated one
	// (internal/sim).
	Model     Forwarder
	Tokenizer *tokenizer.Tokenizer
	// BlockSize is the number of tokens per KV block (default 16).
	BlockSize int
	// KVCacheDType is the KV element type as --kv-cache-dtype spells it
	// (kvlayout.ParseElemType): "" or "auto" for the model's default.
	KVCacheDType string
	// NumBlocks sizes the KV pool in blocks; if zero, KVCacheMemory sizes
	// it in bytes.
	NumBlocks     int
	KVCacheMemory int64
	// KVDir, when set, puts the KV pool in a named file in that directory;
	// by default it is an anonymous memory file (see kvcache.Config.Dir).
	KVDir string
	// MaxNumSeqs and MaxNumBatchedTokens bound a step (sched defaults when
	// zero).
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt plus output tokens; zero means the model's
	// own limit, which it may not exceed.
	MaxModelLen int
	// LoadFailurePolicy applies to failed KV loads (default "fail").
	LoadFailurePolicy sched.LoadFailurePolicy
	// PrefillScheduleInterval N > 1 runs prefill compute only on every Nth
	// step while requests decode (--prefill-schedule-interval; see
	// sched.Config); 0 or 1 prefills on every step.
	PrefillScheduleInterval int
	// Metrics receives the engine's metrics; nil disables them.
	Metrics *metrics.Engine
	// Connector is the scheduler half of a KV connector (default none);
	// KVWorker its worker half, if it has one. If the Connector implements
	// KVRequestChecker, Submit consults it. If the KVWorker implements
	// io.Closer, Shutdown closes it after the step loop stopped and before
	// the KV pool is released, so no transfer touches freed memory.
	Connector sched.Connector
	KVWorker  KVWorker
	Logger    *slog.Logger
	Clock     clock.Clock

	// KVEvents, if set, sees every change of the prefix cache and a Flush
	// at the end of each step (a kvevents.Publisher: --kv-events-config).
	// With hybrid KV-cache groups, a sink that implements
	// kvcache.GroupCacheObserver and SetGroupWindows([]int) is told the
	// groups' windows and sees every group's changes; any other sees
	// group 0's (the full-attention group's) only.
	KVEvents KVEventSink

	// DisableHybridKVCache keeps one KV-cache group of every layer even
	// for a model with sliding-window layers (vLLM's
	// --disable-hybrid-kv-cache-manager): every layer keeps every block.
	DisableHybridKVCache bool
}

// Stats is a snapshot of the engine's load.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of KV blocks in use.
	KVUsage     float64
	FreeBlocks  int
	TotalBlocks int
}

// Engine serves one model. Its methods are safe for concurrent use.
type Engine struct {
	cfg         Config
	model       Forwarder
	tok         *tokenizer.Tokenizer
	pool        *kvcache.Pool
	sched       *sched.Scheduler
	layout      kvlayout.Layout
	maxModelLen int
	eos         []int32
	log         *slog.Logger
	clock       clock.Clock
	m           *metrics.Engine

	in   inbox
	done chan struct{} // closed when the loop exits

	mu       sync.Mutex
	closing  bool
	live     map[string]bool
	stats    Stats
	idle     chan struct{} // closed by the loop once closing and no request is left
	drained  chan struct{} // closed by the loop once closing, idle and no block is held
	shutOnce sync.Once

	// Step-loop state.
	reqs                    map[string]*reqState
	unadmitted              []*reqState // with kv params, not yet admitted: Timing's admission is seen after Schedule
	quit, abortAll          bool
	dropHolds               bool
	prefixQ, prefixH        uint64
	deferred, lifted        uint64       // the scheduler's cadence counters, as last published
	cadence                 atomic.Int64 // the prefill cadence in use, as the loop last set it
	seqs                    []model.Seq
	draws                   []draw
	drainedClosed, stopping bool
	idleClosed              bool
}

// New loads nothing: it sizes the KV pool for cfg.Model, builds the
// scheduler and starts the step loop.
func New(cfg Config) (*Engine, error) {
	if cfg.Model == nil || cfg.Tokenizer == nil {
		return nil, errors.New("engine: Config needs a Model and a Tokenizer")
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = kvcache.DefaultBlockSize
	}
	if cfg.BlockSize < 0 {
		return nil, fmt.Errorf("engine: block size %d must be positive", cfg.BlockSize)
	}
	maxLen := cfg.Model.MaxModelLen()
	if cfg.MaxModelLen > maxLen {
		return nil, fmt.Errorf("engine: max model len %d exceeds the model's %d: lower --max-model-len", cfg.MaxModelLen, maxLen)
	}
	if cfg.MaxModelLen > 0 {
		maxLen = cfg.MaxModelLen
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.System{}
	}
	layout, windows, err := PoolLayout(cfg.Model, cfg.BlockSize, cfg.KVCacheDType, cfg.DisableHybridKVCache)
	if err != nil {
		return nil, err
	}
	pool, err := kvcache.New(kvcache.Config{Layout: layout, NumBlocks: cfg.NumBlocks, MemoryBytes: cfg.KVCacheMemory, Dir: cfg.KVDir, ExtraKey: cfg.Model.Fingerprint()})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.KVEvents != nil {
		if gs, ok := cfg.KVEvents.(interface{ SetGroupWindows([]int) }); ok && windows != nil {
			gs.SetGroupWindows(windows)
		}
		pool.SetObserver(cfg.KVEvents)
	}
	s, err := sched.New(sched.Config{MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens, LoadFailurePolicy: cfg.LoadFailurePolicy,
		PrefillScheduleInterval: cfg.PrefillScheduleInterval, GroupWindows: windows}, pool.Blocks, cfg.Connector)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		cfg: cfg, model: cfg.Model, tok: cfg.Tokenizer, pool: pool, sched: s, layout: pool.Layout(),
		maxModelLen: maxLen, eos: cfg.Tokenizer.EOS(), log: cfg.Logger, clock: cfg.Clock, m: cfg.Metrics,
		in: inbox{wake: make(chan struct{}, 1)}, done: make(chan struct{}), idle: make(chan struct{}), drained: make(chan struct{}),
		live: make(map[string]bool), reqs: make(map[string]*reqState),
	}
	if gen := cfg.Model.GenerationConfig(); len(gen.EOS) > 0 {
		e.eos = mergeIDs(e.eos, gen.EOS)
	}
	e.publishStats()
	e.publishCadence()
	go e.run()
	return e, nil
}

func mergeIDs(a, b []int32) []int32 {
	out := append([]int32(nil), a...)
	for _, x := range b {
		found := false
		for _, y := range out {
			found = found || x == y
		}
		if !found {
			out = append(out, x)
		}
	}
	return out
}

// MaxModelLen returns the most prompt plus output tokens a request may use.
func (e *Engine) MaxModelLen() int { return e.maxModelLen }

// Tokenizer returns the model's tokenizer.
func (e *Engine) Tokenizer() *tokenizer.Tokenizer { return e.tok }

// KVPool returns the engine's KV pool for a transfer layer, which may read
// and write only the bytes (BlockBytes, Path, Generation) of blocks the
// connector handed it; all accounting belongs to the step loop.
func (e *Engine) KVPool() *kvcache.Pool { return e.pool }

// Ready reports whether the engine accepts requests.
func (e *Engine) Ready() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.closing
}

// Stats returns the load as of the last step.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Shutdown stops accepting requests (Submit returns ErrShuttingDown, Ready
// false), lets running and queued requests finish until ctx is done, then
// aborts the rest, stops the loop and releases the KV pool. It returns
// ctx.Err() if requests had to be aborted. It is Drain with one deadline
// for requests and KV holds alike.
func (e *Engine) Shutdown(ctx context.Context) error { return e.Drain(ctx, ctx) }

// Drain is a graceful shutdown with two deadlines. It stops accepting
// requests at once (Submit returns ErrShuttingDown, Ready false); lets
// running and queued requests finish until reqCtx is done, then aborts the
// rest; keeps the blocks a KV connector holds for another engine (a
// prefill's KV that a remote decode has not read yet, loads still writing
// into aborted requests' blocks) until the connector releases them (the
// decode's DONE, lease expiry) or holdCtx is done, whichever is first (it
// is looked at once the requests are done, so it should not end before
// reqCtx); then stops the loop, closes the KV worker (a prefill's side
// channel serves until here) and releases the KV pool.
//
// It returns nil for a clean drain, and an error wrapping the context's
// error when requests had to be aborted or holds given up. Only the first
// call drains; a concurrent or later call waits for it and returns nil.
func (e *Engine) Drain(reqCtx, holdCtx context.Context) error {
	var err error
	e.shutOnce.Do(func() {
		e.mu.Lock()
		e.closing = true // after this no Submit posts (see Submit)
		e.mu.Unlock()
		e.in.post(drainMsg{})
		select {
		case <-e.idle:
		case <-reqCtx.Done():
			select {
			case <-e.idle:
			default:
				err = fmt.Errorf("engine: requests in flight aborted at the shutdown deadline: %w", reqCtx.Err())
				e.in.post(abortAllMsg{})
			}
		}
		select {
		case <-e.drained:
		case <-holdCtx.Done():
		}
		select {
		case <-e.drained:
		default:
			// Out of time for the holds: give them up.
			held := make(chan int, 1)
			e.in.post(dropHoldsMsg{held})
			if n := <-held; n > 0 {
				err = errors.Join(err, fmt.Errorf("engine: KV blocks of %d finished requests, held for another engine, given up at the drain deadline: %w", n, holdCtx.Err()))
			}
			<-e.drained
		}
		e.in.post(quitMsg{})
		<-e.done
		if c, ok := e.cfg.KVWorker.(io.Closer); ok {
			if cerr := c.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
		if cerr := e.pool.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	})
	return err
}

// InFlight returns how many submitted requests have not delivered their
// final event yet (queued, running or loading KV); KV a finished prefill
// holds for a remote decode is not counted.
func (e *Engine) InFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.live)
}
