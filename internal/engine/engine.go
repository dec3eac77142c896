package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Clock tells the engine the time (for latency metrics and logs), so tests
// can inject one.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// KVCompletions are what the worker half of a KV connector observed since it
// last reported: async loads that ended (successfully or not), held blocks
// the remote side no longer needs, and blocks whose load failed.
type KVCompletions struct {
	FinishedRecving []string
	FinishedSending []string
	InvalidBlocks   []int32
	// LoadErrors says, by request id, why a load in FinishedRecving failed;
	// a request the fail policy ends carries it in its error.
	LoadErrors map[string]string
}

func (c KVCompletions) empty() bool {
	return len(c.FinishedRecving)+len(c.FinishedSending)+len(c.InvalidBlocks)+len(c.LoadErrors) == 0
}

// KVWorker is the worker half of a KV connector (vLLM's start_load_kv plus
// get_finished), called by the step loop.
type KVWorker interface {
	// Step is called once per step, after scheduling and before the model
	// runs, with the scheduler connector's metadata for the step. It starts
	// the step's asynchronous loads, completes its synchronous ones before
	// returning, and returns the completions observed since the last call.
	// Completions that happen while the engine is idle are reported with
	// Engine.ReportKV instead, which wakes the loop.
	Step(meta any) (KVCompletions, error)
}

// KVRequestChecker is implemented by a KV connector (Config.Connector) that
// checks kv_transfer_params in Submit, before anything is allocated. Its
// methods are called from Submit's caller, on any goroutine.
type KVRequestChecker interface {
	// CheckKVTransfer returns an *InvalidRequestError for params this engine
	// cannot serve (malformed, inconsistent with the prompt, or asking for a
	// role it does not have), and the most output tokens the request may
	// produce here: 0 for no limit of its own, 1 for a prefill whose decode
	// runs elsewhere.
	CheckKVTransfer(kv map[string]any, promptLen int) (maxTokens int, err error)
	// RejectedKVTransfer is called when the engine refuses a request that
	// carries kv params, for any reason, before the scheduler saw it, so the
	// connector can tell a remote engine holding KV for it to free it now.
	RejectedKVTransfer(kv map[string]any)
}

// Config configures an Engine.
type Config struct {
	Model     *model.Model
	Tokenizer *tokenizer.Tokenizer
	// BlockSize is the number of tokens per KV block (default 16).
	BlockSize int
	// KVCacheDType is the KV element type as --kv-cache-dtype spells it
	// (model.ParseKVDType): "" or "auto" for the model's default.
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
	Clock     Clock
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
	model       *model.Model
	tok         *tokenizer.Tokenizer
	pool        *kvcache.Pool
	sched       *sched.Scheduler
	layout      model.KVLayout
	maxModelLen int
	eos         []int32
	log         *slog.Logger
	clock       Clock
	m           *metrics.Engine

	in   inbox
	done chan struct{} // closed when the loop exits

	mu       sync.Mutex
	closing  bool
	live     map[string]bool
	stats    Stats
	drained  chan struct{} // closed by the loop once closing and empty
	shutOnce sync.Once

	// Step-loop state.
	reqs                    map[string]*reqState
	quit, abortAll          bool
	prefixQ, prefixH        uint64
	seqs                    []model.Seq
	draws                   []draw
	drainedClosed, stopping bool
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
		cfg.Clock = realClock{}
	}
	layout := cfg.Model.KVLayout(cfg.BlockSize)
	if dt, set, err := model.ParseKVDType(cfg.KVCacheDType); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	} else if set {
		layout = cfg.Model.KVLayoutOf(cfg.BlockSize, dt)
	}
	pool, err := kvcache.New(kvcache.Config{Layout: layout, NumBlocks: cfg.NumBlocks, MemoryBytes: cfg.KVCacheMemory, Dir: cfg.KVDir, ExtraKey: cfg.Model.Fingerprint()})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	s, err := sched.New(sched.Config{MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens, LoadFailurePolicy: cfg.LoadFailurePolicy}, pool.Blocks, cfg.Connector)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		cfg: cfg, model: cfg.Model, tok: cfg.Tokenizer, pool: pool, sched: s, layout: pool.Layout(),
		maxModelLen: maxLen, eos: cfg.Tokenizer.EOS(), log: cfg.Logger, clock: cfg.Clock, m: cfg.Metrics,
		in: inbox{wake: make(chan struct{}, 1)}, done: make(chan struct{}), drained: make(chan struct{}),
		live: make(map[string]bool), reqs: make(map[string]*reqState),
	}
	if gen := cfg.Model.GenerationConfig(); len(gen.EOS) > 0 {
		e.eos = mergeIDs(e.eos, gen.EOS)
	}
	e.publishStats()
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

// reqState is the step loop's view of one request.
type reqState struct {
	id        string // internal: ext plus a random suffix
	ext       string // the client's id (Request.ID or generated)
	req       *Request
	sr        *sched.Request
	sampler   *sample.Sampler
	dec       *tokenizer.StreamDecoder
	stop      *sample.StopChecker
	stopIDs   map[int32]bool // EOS unless ignore_eos, and stop_token_ids
	userStops map[int32]bool // stop_token_ids only (reported as stop_reason)
	maxTokens int
	out       *stream

	stopReason                     string
	arrival, firstToken, lastToken time.Time
	scheduled                      bool
}

// Submit validates and queues a request. Its events arrive on the returned
// Handle; cancelling ctx aborts the request and frees its KV blocks.
func (e *Engine) Submit(ctx context.Context, r *Request) (*Handle, error) {
	if r == nil {
		return nil, &InvalidRequestError{Message: "no request"}
	}
	r, maxTokens, err := e.check(r)
	if err != nil {
		e.RejectKVTransfer(r.KVTransfer)
		return nil, err
	}
	ext := r.ID
	if ext == "" {
		ext = uuid.NewString()
	}
	// The internal id gets a random suffix, as in vLLM: a request id stays
	// in the scheduler after the request finished while a KV connector
	// holds its blocks (a prefill for a remote decode), and the same client
	// id may meanwhile arrive again, e.g. as the decode leg of the same
	// request on an engine that does both.
	id := ext + "-" + uuid.NewString()[:8]

	p := r.Params
	rs := &reqState{
		id: id, ext: ext, req: r, maxTokens: maxTokens, out: newStream(),
		sampler: sample.NewSampler(&p, e.model.VocabSize(), e.eos),
		dec:     tokenizer.NewDecoder(e.tok, !p.KeepSpecialTokens, r.Prompt),
		stopIDs: map[int32]bool{}, userStops: map[int32]bool{},
		arrival: e.clock.Now(),
	}
	if len(p.Stop) > 0 {
		rs.stop = sample.NewStopChecker(p.Stop, p.IncludeStopStrInOutput)
	}
	if !p.IgnoreEOS {
		for _, t := range e.eos {
			rs.stopIDs[t] = true
		}
	}
	for _, t := range p.StopTokenIDs {
		rs.stopIDs[t], rs.userStops[t] = true, true
	}
	rs.sr = &sched.Request{ID: id, Prompt: r.Prompt, MaxTokens: maxTokens, KVTransfer: r.KVTransfer}

	// The request is posted under the lock that Shutdown takes to set
	// closing, so it is either refused here or in the inbox ahead of the
	// drain message, and the drain waits for it to finish: a request can
	// never arrive after the loop stopped and wait forever for its final
	// event.
	e.mu.Lock()
	switch {
	case e.closing:
		e.mu.Unlock()
		e.RejectKVTransfer(r.KVTransfer)
		return nil, ErrShuttingDown
	case e.live[ext]:
		e.mu.Unlock()
		e.RejectKVTransfer(r.KVTransfer)
		return nil, &InvalidRequestError{Message: fmt.Sprintf("request id %q is already in flight: use a unique X-Request-Id", ext), Param: "request_id"}
	}
	e.live[ext] = true
	e.in.post(rs)
	e.mu.Unlock()
	events := make(chan Event, 1)
	go rs.out.forward(ctx, events, func() { e.Abort(id) })
	return &Handle{ID: id, Events: events}, nil
}

// check validates r, the KV connector's part first, and returns the request
// to run (a copy when the connector caps its output) and its effective
// max_tokens.
func (e *Engine) check(r *Request) (*Request, int, error) {
	if kc, ok := e.cfg.Connector.(KVRequestChecker); ok && r.KVTransfer != nil {
		limit, err := kc.CheckKVTransfer(r.KVTransfer, len(r.Prompt))
		if err != nil {
			return r, 0, err
		}
		if limit > 0 && (r.Params.MaxTokens <= 0 || r.Params.MaxTokens > limit) {
			c := *r
			c.Params.MaxTokens = limit
			c.Params.MinTokens = min(c.Params.MinTokens, limit)
			r = &c
		}
	}
	maxTokens, err := e.validate(r)
	return r, maxTokens, err
}

// RejectKVTransfer tells the KV connector that a request carrying kv params
// was refused before the scheduler saw it (by Submit itself or by the API
// layer in front of it), so that a prefill holding blocks for it can free
// them at once.
func (e *Engine) RejectKVTransfer(kv map[string]any) {
	if kc, ok := e.cfg.Connector.(KVRequestChecker); ok && kv != nil {
		kc.RejectedKVTransfer(kv)
	}
}

// validate checks what the engine itself depends on and returns the
// effective max_tokens.
func (e *Engine) validate(r *Request) (int, error) {
	if len(r.Prompt) == 0 {
		return 0, &InvalidRequestError{Message: "the prompt is empty: send at least one token", Param: "prompt"}
	}
	vocab := e.model.VocabSize()
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= vocab {
			return 0, &InvalidRequestError{Message: fmt.Sprintf("token id %d at position %d is outside the vocabulary [0, %d)", t, i, vocab), Param: "prompt"}
		}
	}
	maxTokens := r.Params.MaxTokens
	if maxTokens <= 0 {
		maxTokens = e.maxModelLen - len(r.Prompt)
		if maxTokens <= 0 {
			return 0, &InvalidRequestError{Message: fmt.Sprintf("this model's maximum context length is %d tokens, but the prompt has %d: shorten the prompt", e.maxModelLen, len(r.Prompt)), Param: "prompt"}
		}
	}
	if n := len(r.Prompt) + maxTokens; n > e.maxModelLen {
		return 0, &InvalidRequestError{Message: fmt.Sprintf("this model's maximum context length is %d tokens, but you requested %d (%d in the prompt, %d in the completion): reduce the prompt or max_tokens", e.maxModelLen, n, len(r.Prompt), maxTokens), Param: "max_tokens"}
	}
	p := r.Params
	p.MaxTokens = maxTokens
	if err := sample.Validate(&p, vocab); err != nil {
		var pe *sample.ParamError
		if errors.As(err, &pe) {
			return 0, &InvalidRequestError{Message: pe.Message, Param: pe.Param}
		}
		return 0, &InvalidRequestError{Message: err.Error()}
	}
	if r.Params.MinTokens > maxTokens {
		return 0, &InvalidRequestError{Message: fmt.Sprintf("min_tokens %d is larger than max_tokens %d", r.Params.MinTokens, maxTokens), Param: "min_tokens"}
	}
	return maxTokens, nil
}

// Abort ends a request early with FinishAbort; unknown or finished ids are
// ignored.
func (e *Engine) Abort(id string) { e.in.post(abortMsg(id)) }

// ReportKV hands KV connector completions to the step loop and wakes it.
func (e *Engine) ReportKV(c KVCompletions) {
	if !c.empty() {
		e.in.post(c)
	}
}

// Shutdown stops accepting requests (Submit returns ErrShuttingDown, Ready
// false), lets running and queued requests finish until ctx is done, then
// aborts the rest, stops the loop and releases the KV pool. It returns
// ctx.Err() if requests had to be aborted.
func (e *Engine) Shutdown(ctx context.Context) error {
	var err error
	e.shutOnce.Do(func() {
		e.mu.Lock()
		e.closing = true // after this no Submit posts (see Submit)
		e.mu.Unlock()
		e.in.post(drainMsg{})
		select {
		case <-e.drained:
		case <-ctx.Done():
			err = ctx.Err()
			e.in.post(abortAllMsg{})
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

type (
	abortMsg    string
	drainMsg    struct{}
	abortAllMsg struct{}
	quitMsg     struct{}
)

// inbox is the loop's unbounded message queue: posting never blocks.
type inbox struct {
	mu   sync.Mutex
	msgs []any
	wake chan struct{}
}

func (b *inbox) post(m any) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *inbox) take() []any {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.msgs
	b.msgs = nil
	return m
}

// run is the step loop.
func (e *Engine) run() {
	defer close(e.done)
	for {
		for _, m := range e.in.take() {
			e.handle(m)
		}
		if e.quit {
			return
		}
		// A drain also waits for blocks a connector holds (KV a remote
		// decode has not read yet, loads still writing into aborted
		// requests' blocks), unless the deadline forced an abort.
		if e.stopping && len(e.reqs) == 0 && (e.abortAll || e.sched.Stats().Held == 0) && !e.drainedClosed {
			e.drainedClosed = true
			close(e.drained)
		}
		// HasWork is false for requests blocked on memory or loading KV, so
		// the loop sleeps until a message (a request, an abort, a KV report
		// that frees or fills blocks, shutdown) might let one progress.
		if !e.sched.HasWork() {
			e.publishStats()
			<-e.in.wake
			continue
		}
		e.step()
	}
}

func (e *Engine) handle(m any) {
	switch m := m.(type) {
	case *reqState:
		if e.abortAll {
			e.RejectKVTransfer(m.req.KVTransfer)
			e.reject(m, FinishAbort, errors.New("engine shut down before the request started"))
			return
		}
		if err := e.sched.Add(m.sr); err != nil {
			e.reject(m, FinishError, err)
			return
		}
		e.reqs[m.id] = m
	case abortMsg:
		e.sched.Abort(string(m))
	case KVCompletions:
		e.kvCompletions(m)
	case drainMsg:
		e.stopping = true
	case abortAllMsg:
		e.abortAll = true
		for id := range e.reqs {
			e.sched.Abort(id)
		}
	case quitMsg:
		e.quit = true
	}
}

// kvCompletions hands a KV connector's completions to the scheduler.
func (e *Engine) kvCompletions(c KVCompletions) {
	for id, why := range c.LoadErrors {
		e.sched.NoteLoadError(id, why)
	}
	e.sched.UpdateFromConnector(c.FinishedRecving, c.FinishedSending, c.InvalidBlocks)
}

// reject finishes a request the scheduler never took.
func (e *Engine) reject(rs *reqState, reason FinishReason, err error) {
	e.release(rs.ext)
	rs.out.push(Event{Finish: reason, Err: err, Usage: Usage{PromptTokens: len(rs.req.Prompt)}}, true)
}

// release frees a finished request's external id for reuse. It runs before
// the final event is pushed, so a caller that has seen a request end can
// submit the same id again at once (the decode leg of a request on an engine
// that also did its prefill).
func (e *Engine) release(ext string) {
	e.mu.Lock()
	delete(e.live, ext)
	e.mu.Unlock()
}

// step runs one schedule → connector → model → sample → update round.
func (e *Engine) step() {
	out := e.sched.Schedule()
	now := e.clock.Now()
	e.finish(out.Finished, now)
	if e.cfg.KVWorker != nil {
		c, err := e.cfg.KVWorker.Step(out.ConnectorMeta)
		if err != nil {
			e.log.Error("kv connector worker step failed", "err", err)
		}
		if !c.empty() {
			e.kvCompletions(c)
		}
	}
	if e.m != nil {
		e.m.NumPreemptions.Add(float64(len(out.Preempted)))
	}

	// Requests a failed synchronous load just voided stay out of the batch.
	batch := out.Scheduled[:0:0]
	e.seqs = e.seqs[:0]
	for _, sc := range out.Scheduled {
		if sc.Req.Status() != sched.Running || sc.Req.Discarded() {
			continue
		}
		if rs := e.reqs[sc.Req.ID]; rs != nil && !rs.scheduled {
			rs.scheduled = true
			if e.m != nil {
				e.m.QueueTime.Observe(now.Sub(rs.arrival).Seconds())
			}
		}
		seq := model.Seq{Tokens: sc.Tokens, Pos: sc.Pos, Blocks: sc.Blocks}
		if sc.Sample {
			seq.Logits = []int{len(sc.Tokens) - 1}
		}
		batch = append(batch, sc)
		e.seqs = append(e.seqs, seq)
	}
	var results []sched.Result
	if len(batch) > 0 {
		logits, err := e.model.Forward(e.seqs, e.pool.Data(), e.layout)
		now = e.clock.Now()
		if err != nil {
			e.log.Error("model forward failed", "err", err, "batch", len(batch))
			for _, sc := range batch {
				e.sched.Fail(sc.Req.ID, fmt.Sprintf("model forward failed: %v", err))
			}
		} else {
			results = e.sampleAll(batch, logits, now)
		}
	}
	e.finish(e.sched.Update(out, results), now)
	e.publishStats()
}

// sampleOne samples rs's next token, decides whether it ends the request
// and queues the token and its text for the client.
// draw is one request's sampling in a step.
type draw struct {
	rs     *reqState
	logits []float32
	tok    int32
	lp     *sample.Logprob
}

// sampleAll samples every request of the batch that reached the end of its
// known tokens. The draws run in parallel on the model's worker pool — each
// request has its own Sampler and random stream, so the tokens do not depend
// on how the requests are split — and the rest (detokenizing, stops, events)
// runs here, in batch order.
func (e *Engine) sampleAll(batch []sched.Scheduled, logits [][]float32, now time.Time) []sched.Result {
	draws := e.draws[:0]
	for i, sc := range batch {
		if rs := e.reqs[sc.Req.ID]; sc.Sample && rs != nil {
			draws = append(draws, draw{rs: rs, logits: logits[i]})
		}
	}
	e.draws = draws[:0]
	if len(draws) == 0 {
		return nil
	}
	e.model.Pool().Parallel(len(draws), func(lo, hi int) {
		for j := lo; j < hi; j++ {
			d := &draws[j]
			d.tok, d.lp = d.rs.sampler.Sample(d.logits, d.rs.req.Prompt, d.rs.sr.Output())
		}
	})
	results := make([]sched.Result, 0, len(draws))
	for _, d := range draws {
		results = append(results, e.sampleOne(d.rs, d.tok, d.lp, now))
	}
	clear(draws) // drop references to finished requests until the next step
	return results
}

func (e *Engine) sampleOne(rs *reqState, tok int32, lp *sample.Logprob, now time.Time) sched.Result {
	p := &rs.req.Params
	n := len(rs.sr.Output()) + 1
	ev := Event{Tokens: []int32{tok}}
	if lp != nil {
		tl := TokenLogprob{Token: lp.Token, Logprob: lp.Logprob}
		for _, t := range lp.Top {
			tl.Top = append(tl.Top, TopLogprob{Token: t.Token, Logprob: t.Logprob})
		}
		ev.Logprobs = []TokenLogprob{tl}
	}
	res := sched.Result{ID: rs.id, Token: tok}
	checkStops := n >= p.MinTokens
	if checkStops && rs.stopIDs[tok] {
		res.Finish = sched.FinishedStopped
		if rs.userStops[tok] {
			rs.stopReason = strconv.Itoa(int(tok))
		}
		if p.IncludeStopStrInOutput {
			ev.Text = rs.dec.Add(tok)
		}
		ev.Text += rs.dec.Flush()
		if rs.stop != nil {
			emit, _, _ := rs.stop.Push(ev.Text)
			ev.Text = emit + rs.stop.Flush()
		}
	} else {
		text := rs.dec.Add(tok)
		last := n >= rs.maxTokens
		if last {
			text += rs.dec.Flush()
		}
		switch {
		case rs.stop == nil:
			ev.Text = text
		case !checkStops:
			ev.Text = text
		default:
			emit, stopped, matched := rs.stop.Push(text)
			ev.Text = emit
			if stopped {
				res.Finish, rs.stopReason = sched.FinishedStopped, matched
			} else if last {
				ev.Text += rs.stop.Flush()
			}
		}
		if res.Finish == 0 && last {
			res.Finish = sched.FinishedLength
		}
	}
	rs.out.push(ev, false)

	if e.m != nil {
		e.m.GenerationTokens.Inc()
		if rs.firstToken.IsZero() {
			e.m.TimeToFirstToken.Observe(now.Sub(rs.arrival).Seconds())
			cached, ext := rs.sr.NumCachedTokens(), rs.sr.NumExternalTokens()
			e.m.PromptTokens.Add(float64(len(rs.req.Prompt)))
			e.m.PromptTokensBySrc.WithLabelValues("local_cache_hit").Add(float64(cached))
			e.m.PromptTokensBySrc.WithLabelValues("external_kv_transfer").Add(float64(ext))
			e.m.PromptTokensBySrc.WithLabelValues("local_compute").Add(float64(max(len(rs.req.Prompt)-cached-ext, 0)))
		} else {
			e.m.InterTokenLatency.Observe(now.Sub(rs.lastToken).Seconds())
		}
	}
	if rs.firstToken.IsZero() {
		rs.firstToken = now
	}
	rs.lastToken = now
	return res
}

var finishReasons = map[sched.Status]FinishReason{
	sched.FinishedStopped: FinishStop,
	sched.FinishedLength:  FinishLength,
	sched.FinishedAborted: FinishAbort,
	sched.FinishedError:   FinishError,
}

// finish sends the final event of each finished request, records its
// metrics and logs it.
func (e *Engine) finish(fs []sched.Finished, now time.Time) {
	for _, f := range fs {
		rs := e.reqs[f.Req.ID]
		if rs == nil || rs.sr != f.Req {
			continue
		}
		delete(e.reqs, rs.id)
		reason := finishReasons[f.Status]
		usage := Usage{PromptTokens: len(rs.req.Prompt), CompletionTokens: len(f.Req.Output()), CachedTokens: f.Req.NumCachedTokens() + f.Req.NumExternalTokens()}
		ev := Event{Finish: reason, KVTransfer: f.KVTransfer, Usage: usage}
		if reason == FinishStop {
			ev.StopReason = rs.stopReason
		}
		if reason == FinishError {
			ev.Err = errors.New(f.Err)
		}
		e.release(rs.ext)
		rs.out.push(ev, true)

		e2e := now.Sub(rs.arrival)
		var ttft time.Duration
		if !rs.firstToken.IsZero() {
			ttft = rs.firstToken.Sub(rs.arrival)
		}
		if e.m != nil {
			e.m.RequestSuccess.WithLabelValues(string(reason)).Inc()
			e.m.E2ELatency.Observe(e2e.Seconds())
		}
		attrs := []any{"id", rs.id, "prompt_tokens", usage.PromptTokens, "output_tokens", usage.CompletionTokens,
			"cached_tokens", usage.CachedTokens, "external_tokens", f.Req.NumExternalTokens(), "preemptions", f.Req.NumPreemptions(),
			"finish_reason", string(reason), "ttft", ttft, "e2e", e2e}
		if f.Err != "" {
			attrs = append(attrs, "err", f.Err)
		}
		e.log.Info("request finished", attrs...)
	}
}

// publishStats refreshes Stats and the gauges.
func (e *Engine) publishStats() {
	st := e.sched.Stats()
	s := Stats{Running: st.Running, Waiting: st.Waiting, KVUsage: e.pool.Usage(), FreeBlocks: e.pool.FreeBlocks(), TotalBlocks: e.pool.NumBlocks()}
	e.mu.Lock()
	e.stats = s
	e.mu.Unlock()
	if e.m != nil {
		e.m.NumRequestsRunning.Set(float64(s.Running))
		e.m.NumRequestsWaiting.Set(float64(s.Waiting))
		e.m.KVCacheUsage.Set(s.KVUsage)
		q, h := e.pool.PrefixStats()
		e.m.PrefixCacheQueries.Add(float64(q - e.prefixQ))
		e.m.PrefixCacheHits.Add(float64(h - e.prefixH))
		e.prefixQ, e.prefixH = q, h
	}
}
