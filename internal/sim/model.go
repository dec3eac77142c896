package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Default shape of the simulated model: small blocks that still exercise
// every part of the layout (several layers, K and V, more than one head).
const (
	DefaultLayers  = 2
	DefaultKVHeads = 2
	DefaultHeadDim = 8
)

// Config configures a simulated model.
type Config struct {
	// Vocab is the width of a logits row (the served model's vocabulary).
	Vocab int
	// Choices are the ids the model makes likely (default all): the
	// tokenizer's ordinary text tokens, say, so that answers decode to
	// readable words rather than special tokens or stray bytes. The others
	// get a logit of -100.
	Choices []int32
	// MaxModelLen is the most positions a sequence may use.
	MaxModelLen int
	// EOS are the end-of-sequence ids the simulated model may choose.
	EOS []int32
	// Generation is returned by GenerationConfig (the served model's
	// generation_config.json defaults).
	Generation model.GenerationConfig
	// Layers, KVHeads and HeadDim shape the KV cache (defaults
	// DefaultLayers, DefaultKVHeads and DefaultHeadDim).
	Layers, KVHeads, HeadDim int
	// KVCacheDType is the KV element type as --kv-cache-dtype spells it:
	// bfloat16 or float32; "" and auto are bfloat16 (a simulated model has
	// no weights to take it from).
	KVCacheDType string
	// Seed picks the simulated model's outputs; engines that must agree
	// (colocated and disaggregated runs) need the same one.
	Seed uint64
	// MeanOutputLen makes the model end an answer with EOS after that many
	// tokens on average (a deterministic, geometrically distributed
	// length); 0 never chooses EOS, so answers run to max_tokens.
	MeanOutputLen int
	// Time is the time model (default DefaultProfile()); Speed divides
	// every simulated duration (default 1: real time).
	Time  TimeModel
	Speed float64
	// Faults are injected failures (default none).
	Faults Faults
	// Sleep waits for a step's simulated time (default time.Sleep); tests
	// replace it.
	Sleep func(time.Duration)
	// Logger receives fault-injection events (default slog.Default()).
	Logger *slog.Logger
}

// Faults are failures a simulated engine injects for resilience tests.
// Rates are probabilities in [0, 1], drawn from the model's own seeded
// random stream.
type Faults struct {
	// ErrorRate fails a request at the step that computes its last prompt
	// token (the request ends with an error, HTTP 500).
	ErrorRate float64
	// StallEvery and StallFor freeze the step loop for StallFor at the
	// first step after each StallEvery of wall time.
	StallEvery, StallFor time.Duration
	// KVDelay makes every KV load finish that much later (a slow
	// transfer); KVFailRate fails a load (every block it wrote is
	// invalid); KVCorruptRate damages one byte of a loaded block before the
	// check, which catches it. Failed and damaged loads go through the
	// engine's --kv-load-failure-policy.
	KVDelay                   time.Duration
	KVFailRate, KVCorruptRate float64
	// CrashAfter > 0 ends the process (Crash) when the step that would
	// start request CrashAfter+1 runs: CrashAfter requests started, the
	// ones still running are cut off as by a real crash.
	CrashAfter int
	// Crash is what a crash does (default: log and os.Exit(70), no
	// cleanup).
	Crash func()
}

// Stats counts what a simulated model did.
type Stats struct {
	// Steps and Tokens are forward passes and the tokens they wrote.
	Steps, Tokens int64
	// CheckedTokens counts token slots whose KV pattern was checked, in
	// loads (LoadsChecked of them) and in forward passes; BadLoads and
	// BadForwards count the checks that failed.
	CheckedTokens, LoadsChecked, BadLoads, BadForwards int64
	// Requests counts requests whose last prompt token was computed.
	Requests int64
	// SimulatedTime is the sum of the steps' simulated durations (before
	// Speed).
	SimulatedTime time.Duration
}

// Model is a simulated model: an engine.Forwarder (and engine.KVChecker)
// that sleeps instead of computing. See the package documentation.
type Model struct {
	cfg         Config
	kvDType     kvlayout.ElemType
	pool        *tensor.Pool
	fingerprint string
	base        []float32 // one logits row, rotated per token
	logits      []float32
	rng         *rand.Rand
	nextStall   time.Time
	requests    int
	log         *slog.Logger

	steps, tokens, checked, loads, badLoads, badForwards, reqs, simNanos atomic.Int64
}

var (
	_ engine.Forwarder = (*Model)(nil)
	_ engine.KVChecker = (*Model)(nil)
)

// New makes a simulated model. Close releases its worker pool.
func New(cfg Config) (*Model, error) {
	if cfg.Vocab < 1 {
		return nil, errors.New("sim: the simulated model needs a vocabulary size")
	}
	if len(cfg.Choices) == 0 {
		cfg.Choices = make([]int32, cfg.Vocab)
		for i := range cfg.Choices {
			cfg.Choices[i] = int32(i)
		}
	}
	for _, id := range cfg.Choices {
		if id < 0 || int(id) >= cfg.Vocab {
			return nil, fmt.Errorf("sim: choice %d is outside the vocabulary of %d", id, cfg.Vocab)
		}
	}
	if cfg.MaxModelLen < 1 {
		return nil, errors.New("sim: the simulated model needs a max model len")
	}
	cfg.Layers = cmpOr(cfg.Layers, DefaultLayers)
	cfg.KVHeads = cmpOr(cfg.KVHeads, DefaultKVHeads)
	cfg.HeadDim = cmpOr(cfg.HeadDim, DefaultHeadDim)
	kvDType, set, err := kvlayout.ParseElemType(cfg.KVCacheDType)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if !set {
		kvDType = kvlayout.BF16
	}
	if cfg.Speed == 0 {
		cfg.Speed = 1
	}
	if !(cfg.Speed > 0) {
		return nil, fmt.Errorf("sim: speed %v must be positive", cfg.Speed)
	}
	if cfg.MeanOutputLen < 0 {
		return nil, fmt.Errorf("sim: mean output length %d must not be negative", cfg.MeanOutputLen)
	}
	f := cfg.Faults
	for _, r := range []float64{f.ErrorRate, f.KVFailRate, f.KVCorruptRate} {
		if !(r >= 0 && r <= 1) {
			return nil, fmt.Errorf("sim: fault rate %v: want a probability in [0, 1]", r)
		}
	}
	if f.StallEvery < 0 || f.StallFor < 0 || f.KVDelay < 0 || f.CrashAfter < 0 {
		return nil, errors.New("sim: fault durations and counts must not be negative")
	}
	if cfg.Time == nil {
		cfg.Time = DefaultProfile()
	}
	if cfg.Sleep == nil {
		cfg.Sleep = time.Sleep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Faults.Crash == nil {
		log := cfg.Logger
		cfg.Faults.Crash = func() {
			log.Error("simulated crash (--sim-crash-after): exiting without cleanup", "requests", cfg.Faults.CrashAfter)
			os.Exit(70)
		}
	}
	m := &Model{
		cfg:     cfg,
		kvDType: kvDType,
		pool:    tensor.NewPool(1),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x73696d)),
		log:     cfg.Logger.With("component", "sim"),
	}
	h := sha256.New()
	fmt.Fprintf(h, "tandem sim v1 layers=%d kv_heads=%d head_dim=%d vocab=%d", cfg.Layers, cfg.KVHeads, cfg.HeadDim, cfg.Vocab)
	m.fingerprint = "sim-" + hex.EncodeToString(h.Sum(nil))[:32]
	// The shape of a logits row: rank r scores -r/20 for the first 1000
	// ranks, so greedy decoding takes rank 0 and temperature 1 spreads
	// over some tens of tokens, as a trained model's would.
	m.base = make([]float32, len(cfg.Choices))
	for r := range m.base {
		m.base[r] = -float32(min(r, 1000)) / 20
	}
	if f.StallEvery > 0 {
		m.nextStall = time.Now().Add(f.StallEvery)
	}
	return m, nil
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Close stops the model's worker pool.
func (m *Model) Close() error {
	m.pool.Close()
	return nil
}

// VocabSize implements engine.Forwarder.
func (m *Model) VocabSize() int { return m.cfg.Vocab }

// MaxModelLen implements engine.Forwarder.
func (m *Model) MaxModelLen() int { return m.cfg.MaxModelLen }

// KVLayout implements engine.Forwarder.
func (m *Model) KVLayout(blockSize int) kvlayout.Layout {
	return m.KVLayoutOf(blockSize, m.kvDType)
}

// KVLayoutOf implements engine.Forwarder.
func (m *Model) KVLayoutOf(blockSize int, dt kvlayout.ElemType) kvlayout.Layout {
	return kvlayout.Layout{BlockSize: blockSize, Layers: m.cfg.Layers, KVHeads: m.cfg.KVHeads, HeadDim: m.cfg.HeadDim, DType: dt}
}

// Fingerprint implements engine.Forwarder: it names the simulated shape,
// so a simulated engine never exchanges KV with a real one.
func (m *Model) Fingerprint() string { return m.fingerprint }

// GenerationConfig implements engine.Forwarder.
func (m *Model) GenerationConfig() model.GenerationConfig { return m.cfg.Generation }

// Pool implements engine.Forwarder: one worker, as sampling a simulated
// step needs no more.
func (m *Model) Pool() *tensor.Pool { return m.pool }

// Stats returns the counters so far; safe to call from any goroutine.
func (m *Model) Stats() Stats {
	return Stats{
		Steps: m.steps.Load(), Tokens: m.tokens.Load(),
		CheckedTokens: m.checked.Load(), LoadsChecked: m.loads.Load(), BadLoads: m.badLoads.Load(), BadForwards: m.badForwards.Load(),
		Requests: m.reqs.Load(), SimulatedTime: time.Duration(m.simNanos.Load()),
	}
}

// Forward implements engine.Forwarder. For each sequence it checks, at the
// step that computes the last prompt token, the KV pattern of every earlier
// position (local prefix hits and pulled blocks alike); writes the pattern
// of its new tokens; and returns logits that depend only on the seed and
// the last tokens and position (batch invariance by construction). Then
// it sleeps for the time model's step time over Speed. Sequences that
// fail the check or an injected error are reported as model.SeqErrors.
func (m *Model) Forward(seqs []model.Seq, pool []byte, layout kvlayout.Layout) ([][]float32, error) {
	if err := m.validate(seqs, pool, layout); err != nil {
		return nil, err
	}
	f := &m.cfg.Faults
	if f.StallEvery > 0 && !time.Now().Before(m.nextStall) {
		m.log.Warn("simulated stall (--sim-stall-every): the step loop freezes", "for", f.StallFor)
		m.cfg.Sleep(m.scaled(f.StallFor))
		m.nextStall = time.Now().Add(f.StallEvery)
	}
	var errs model.SeqErrors
	fail := func(i int, err error) {
		if errs == nil {
			errs = make(model.SeqErrors)
		}
		errs[i] = err
	}
	R := 0
	for i := range seqs {
		R += len(seqs[i].Logits)
	}
	m.logits = growF32(m.logits, R*m.cfg.Vocab)
	row := 0
	for i := range seqs {
		sq := &seqs[i]
		end := sq.Pos + len(sq.Tokens)
		if n := len(sq.Prompt); n > 0 && sq.Pos < n && end >= n {
			// This step computes the last prompt token: the request starts
			// here (once per engine, again after a preemption).
			m.requests++
			m.reqs.Add(1)
			if f.CrashAfter > 0 && m.requests > f.CrashAfter {
				f.Crash()
			}
			if sq.Pos > 0 {
				m.checked.Add(int64(sq.Pos))
				if perr := checkRange(pool, layout, sq.Blocks, sq.TokenAt, 0, sq.Pos); perr != nil {
					m.badForwards.Add(1)
					fail(i, perr)
				}
			}
			if f.ErrorRate > 0 && m.rng.Float64() < f.ErrorRate {
				fail(i, errors.New("simulated error (--sim-error-rate)"))
			}
		}
		for j, tok := range sq.Tokens {
			writeToken(pool, layout, sq.Blocks, tok, sq.Pos+j)
		}
		m.tokens.Add(int64(len(sq.Tokens)))
		for _, idx := range sq.Logits {
			out := m.logits[row*m.cfg.Vocab : (row+1)*m.cfg.Vocab]
			m.fillLogits(out, sq, sq.Pos+idx)
			row++
		}
	}
	d := m.cfg.Time.StepTime(BatchOf(seqs))
	m.steps.Add(1)
	m.simNanos.Add(int64(d))
	if d > 0 {
		m.cfg.Sleep(m.scaled(d))
	}
	// The engine expects one logits slice per sequence: all its rows.
	res := make([][]float32, len(seqs))
	row = 0
	for i := range seqs {
		if n := len(seqs[i].Logits); n > 0 {
			res[i] = m.logits[row*m.cfg.Vocab : (row+n)*m.cfg.Vocab]
			row += n
		}
	}
	if errs != nil {
		return res, errs
	}
	return res, nil
}

func (m *Model) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / m.cfg.Speed)
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// contextLen is how many tokens up to and including a position pick the
// next token's logits.
const contextLen = 8

// fillLogits writes the logits for the token after position p: the base row
// rotated by a hash of the seed, p and the tokens at positions p-7..p over
// the choices, with EOS (if any) forced on or off.
func (m *Model) fillLogits(out []float32, sq *model.Seq, p int) {
	h := mix(m.cfg.Seed ^ uint64(p)*phi)
	for q := max(0, p-contextLen+1); q <= p; q++ {
		h = mix(h ^ uint64(uint32(tokenAt(sq, q))))
	}
	for v := range out {
		out[v] = -100
	}
	A := len(m.cfg.Choices)
	s := int(h % uint64(A))
	for j, id := range m.cfg.Choices {
		k := j + s
		if k >= A {
			k -= A
		}
		out[id] = m.base[k]
	}
	if len(m.cfg.EOS) == 0 {
		return
	}
	eos := m.cfg.EOS[0]
	endHere := m.cfg.MeanOutputLen > 0 && mix(h^0x656f73)%uint64(m.cfg.MeanOutputLen) == 0
	for _, id := range m.cfg.EOS {
		if int(id) < len(out) {
			out[id] = -100
		}
	}
	if endHere && int(eos) < len(out) {
		out[eos] = 1
	}
}

// tokenAt is the token at position p of sq: a new token, or history from
// Prompt and Output (0 when the caller did not provide them).
func tokenAt(sq *model.Seq, p int) int32 {
	if p >= sq.Pos && p < sq.Pos+len(sq.Tokens) {
		return sq.Tokens[p-sq.Pos]
	}
	if p < len(sq.Prompt)+len(sq.Output) {
		return sq.TokenAt(p)
	}
	return 0
}

func (m *Model) validate(seqs []model.Seq, pool []byte, l kvlayout.Layout) error {
	if want := m.KVLayoutOf(l.BlockSize, l.DType); l.BlockSize <= 0 || l != want || !l.DType.Valid() {
		return fmt.Errorf("sim: KV layout %+v does not match the simulated model's (%+v)", l, want)
	}
	if len(pool)%l.BlockBytes() != 0 {
		return fmt.Errorf("sim: KV pool of %d bytes is not a whole number of %d-byte blocks", len(pool), l.BlockBytes())
	}
	numBlocks := len(pool) / l.BlockBytes()
	if len(seqs) == 0 {
		return errors.New("sim: Forward needs at least one sequence")
	}
	for i := range seqs {
		sq := &seqs[i]
		end := sq.Pos + len(sq.Tokens)
		if len(sq.Tokens) == 0 || sq.Pos < 0 || end > m.cfg.MaxModelLen {
			return fmt.Errorf("sim: seq %d covers positions [%d, %d), outside [0, %d) or empty", i, sq.Pos, end, m.cfg.MaxModelLen)
		}
		need := (end + l.BlockSize - 1) / l.BlockSize
		if len(sq.Blocks) < need {
			return fmt.Errorf("sim: seq %d needs %d blocks, block table has %d", i, need, len(sq.Blocks))
		}
		for _, b := range sq.Blocks[:need] {
			if b < 0 || int(b) >= numBlocks {
				return fmt.Errorf("sim: seq %d uses block %d, outside the pool's %d", i, b, numBlocks)
			}
		}
		for _, id := range sq.Tokens {
			if id < 0 || int(id) >= m.cfg.Vocab {
				return fmt.Errorf("sim: seq %d has token id %d, outside the vocabulary of %d", i, id, m.cfg.Vocab)
			}
		}
		for _, idx := range sq.Logits {
			if idx < 0 || idx >= len(sq.Tokens) {
				return fmt.Errorf("sim: seq %d asks for logits of token %d of %d", i, idx, len(sq.Tokens))
			}
		}
		if sq.Prompt != nil && len(sq.Prompt)+len(sq.Output) < end {
			return fmt.Errorf("sim: seq %d has %d known tokens, fewer than its %d positions", i, len(sq.Prompt)+len(sq.Output), end)
		}
	}
	return nil
}

// CheckLoadedKV implements engine.KVChecker: it checks the pattern of
// positions [0, len(tokens)) after a KV load, after applying the KV faults
// (a failed load, a damaged byte, a delay).
func (m *Model) CheckLoadedKV(tokens, blocks []int32, pool []byte, l kvlayout.Layout) engine.LoadCheck {
	m.loads.Add(1)
	n := len(tokens)
	f := &m.cfg.Faults
	if n == 0 || (n+l.BlockSize-1)/l.BlockSize > len(blocks) {
		return engine.LoadCheck{}
	}
	if f.KVFailRate > 0 && m.rng.Float64() < f.KVFailRate {
		m.badLoads.Add(1)
		m.log.Warn("simulated KV transfer failure (--sim-kv-fail-rate)")
		return engine.LoadCheck{Bad: blocks[:(n+l.BlockSize-1)/l.BlockSize], Err: errors.New("simulated KV transfer failure (--sim-kv-fail-rate)")}
	}
	if f.KVCorruptRate > 0 && m.rng.Float64() < f.KVCorruptRate {
		// The block of the last loaded position always came over the wire:
		// a local prefix hit covers whole blocks before it.
		last := n - 1
		off := l.Offset(int(blocks[last/l.BlockSize]), m.rng.IntN(l.Layers), m.rng.IntN(2), last%l.BlockSize) * l.ElemBytes()
		pool[off] ^= 0x5a
		m.log.Warn("simulated KV corruption (--sim-kv-corrupt-rate)", "block", blocks[last/l.BlockSize])
	}
	m.checked.Add(int64(n))
	if perr := checkRange(pool, l, blocks, func(p int) int32 { return tokens[p] }, 0, n); perr != nil {
		m.badLoads.Add(1)
		return engine.LoadCheck{Bad: perr.Blocks, Err: perr}
	}
	return engine.LoadCheck{Delay: m.scaled(f.KVDelay)}
}
