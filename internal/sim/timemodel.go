package sim

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/tandem-serve/tandem/internal/model"
)

// Batch is the shape of one step, as a time model sees it: the prompt
// chunks (where each starts and how long it is) and the single-token
// sequences (decodes, and a decode engine's recomputed last prompt token)
// with their total context.
type Batch struct {
	// PrefillTokens counts the new tokens of sequences that run more than
	// one token.
	PrefillTokens int
	// Chunks are those sequences, one each: Len new tokens from position
	// Pos. A chunk after position 0 (the second chunk of a chunked prompt,
	// or a prompt after a prefix-cache hit or pulled blocks) also attends
	// to the Pos tokens before it. A Batch without Chunks costs its prompt
	// tokens as chunks from position 0.
	Chunks []Chunk
	// Decodes counts sequences that run one token; DecodeContext sums
	// their context lengths (position + 1).
	Decodes, DecodeContext int
}

// Chunk is one sequence's new tokens in a step: Len of them from position
// Pos.
type Chunk struct {
	Pos, Len int
}

// BatchOf classifies the sequences of a forward pass.
func BatchOf(seqs []model.Seq) Batch {
	var b Batch
	for i := range seqs {
		if n := len(seqs[i].Tokens); n > 1 {
			b.PrefillTokens += n
			b.Chunks = append(b.Chunks, Chunk{Pos: seqs[i].Pos, Len: n})
		} else {
			b.Decodes++
			b.DecodeContext += seqs[i].Pos + 1
		}
	}
	return b
}

// TimeModel says how long a step takes.
type TimeModel interface {
	StepTime(Batch) time.Duration
}

// Knobs is the simple time model of --sim-ttft, --sim-itl and
// --sim-prefill-per-token: a step that runs prompt tokens costs TTFT plus
// PrefillPerToken for each, a step that runs decodes costs ITL, and a step
// with both costs the sum. A lone request then sees a time to first token
// of TTFT + PrefillPerToken·prompt and ITL between tokens, whatever the
// batch; queueing and batching still come from the real scheduler.
type Knobs struct {
	TTFT, ITL, PrefillPerToken time.Duration
}

// StepTime implements TimeModel.
func (k Knobs) StepTime(b Batch) time.Duration {
	var t time.Duration
	if b.PrefillTokens > 0 {
		t += k.TTFT + time.Duration(b.PrefillTokens)*k.PrefillPerToken
	}
	if b.Decodes > 0 {
		t += k.ITL
	}
	return t
}

// Profile is what `tandem profile` measured: the real forward pass's time
// over a grid of step shapes on one machine. It is a TimeModel that
// interpolates that grid (see StepTime).
type Profile struct {
	Version int `json:"version"`
	// Model, Fingerprint, DType and KVDType identify what was measured;
	// Machine, Threads and Created where and when.
	Model       string `json:"model"`
	Fingerprint string `json:"fingerprint"`
	DType       string `json:"dtype"`
	KVDType     string `json:"kv_dtype"`
	Machine     string `json:"machine"`
	Threads     int    `json:"threads"`
	Created     string `json:"created"`
	// Prefill is one sequence's prompt of Tokens tokens from position 0.
	Prefill []PrefillPoint `json:"prefill"`
	// Decode is Batch sequences of one token each at context Context.
	Decode []DecodePoint `json:"decode"`

	prefillX, prefillY []float64   // tokens, seconds; sorted by tokens
	rows               []decodeRow // by batch size, each sorted by context
	rowX, rowY         []float64   // batch sizes; scratch for DecodeSeconds
}

// PrefillPoint is one measured prompt step.
type PrefillPoint struct {
	Tokens  int     `json:"tokens"`
	Seconds float64 `json:"seconds"`
}

// DecodePoint is one measured decode step.
type DecodePoint struct {
	Batch   int     `json:"batch"`
	Context int     `json:"context"`
	Seconds float64 `json:"seconds"`
}

type decodeRow struct {
	batch      int
	ctx, secs  []float64
	minContext float64
}

// ProfileVersion is the version of the profile format this code writes.
const ProfileVersion = 1

//go:embed profiles/default.json
var defaultProfile []byte

// DefaultProfile is the profile `--simulate` uses without a file: a
// 135M-parameter Llama (smollm2-135m's shape, bf16) measured on a 2-core
// AMD EPYC VM with `tandem profile` (see docs/performance.md).
func DefaultProfile() *Profile {
	p, err := ParseProfile(defaultProfile)
	if err != nil {
		panic(err) // the embedded file is tested
	}
	return p
}

// LoadProfile reads a profile written by `tandem profile`.
func LoadProfile(path string) (*Profile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: reading the profile: %w", err)
	}
	p, err := ParseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", path, err)
	}
	return p, nil
}

// ParseProfile validates a profile and prepares it for interpolation.
func ParseProfile(b []byte) (*Profile, error) {
	var p Profile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("not a tandem profile: %w", err)
	}
	if err := p.prepare(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Marshal returns the profile as indented JSON.
func (p *Profile) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	return append(b, '\n'), err
}

func (p *Profile) prepare() error {
	if p.Version != ProfileVersion {
		return fmt.Errorf("profile version %d, this tandem reads version %d: run tandem profile again", p.Version, ProfileVersion)
	}
	if len(p.Prefill) == 0 || len(p.Decode) == 0 {
		return errors.New("the profile needs prefill and decode measurements")
	}
	pre := slices.Clone(p.Prefill)
	for _, pt := range pre {
		if pt.Tokens < 1 || !(pt.Seconds > 0) || math.IsInf(pt.Seconds, 0) {
			return fmt.Errorf("prefill point %+v: want tokens ≥ 1 and a positive time", pt)
		}
	}
	slices.SortFunc(pre, func(a, b PrefillPoint) int { return a.Tokens - b.Tokens })
	p.prefillX, p.prefillY = nil, nil
	for i, pt := range pre {
		if i > 0 && pt.Tokens == pre[i-1].Tokens {
			return fmt.Errorf("prefill measured twice at %d tokens", pt.Tokens)
		}
		p.prefillX = append(p.prefillX, float64(pt.Tokens))
		p.prefillY = append(p.prefillY, pt.Seconds)
	}
	byBatch := map[int]*decodeRow{}
	for _, pt := range p.Decode {
		if pt.Batch < 1 || pt.Context < 1 || !(pt.Seconds > 0) || math.IsInf(pt.Seconds, 0) {
			return fmt.Errorf("decode point %+v: want batch ≥ 1, context ≥ 1 and a positive time", pt)
		}
		r := byBatch[pt.Batch]
		if r == nil {
			r = &decodeRow{batch: pt.Batch}
			byBatch[pt.Batch] = r
		}
		r.ctx = append(r.ctx, float64(pt.Context))
		r.secs = append(r.secs, pt.Seconds)
	}
	p.rows = p.rows[:0]
	for _, r := range byBatch {
		idx := make([]int, len(r.ctx))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return int(r.ctx[a] - r.ctx[b]) })
		ctx, secs := make([]float64, len(idx)), make([]float64, len(idx))
		for i, j := range idx {
			ctx[i], secs[i] = r.ctx[j], r.secs[j]
			if i > 0 && ctx[i] == ctx[i-1] {
				return fmt.Errorf("decode measured twice at batch %d, context %v", r.batch, ctx[i])
			}
		}
		r.ctx, r.secs, r.minContext = ctx, secs, ctx[0]
		p.rows = append(p.rows, *r)
	}
	slices.SortFunc(p.rows, func(a, b decodeRow) int { return a.batch - b.batch })
	p.rowX, p.rowY = make([]float64, len(p.rows)), make([]float64, len(p.rows))
	for i, r := range p.rows {
		p.rowX[i] = float64(r.batch)
	}
	return nil
}

// interp is the piecewise-linear function through (xs, ys) at x, extended
// beyond the ends along the first and last segments (never below a tenth
// of the nearest measured value, so extrapolation cannot reach zero). One
// point is a constant.
func interp(xs, ys []float64, x float64) float64 {
	n := len(xs)
	if n == 1 {
		return ys[0]
	}
	i := 1
	for i < n-1 && x > xs[i] {
		i++
	}
	x0, x1, y0, y1 := xs[i-1], xs[i], ys[i-1], ys[i]
	y := y0 + (y1-y0)*(x-x0)/(x1-x0)
	switch {
	case x < xs[0]:
		return max(y, ys[0]/10)
	case x > xs[n-1]:
		return max(y, ys[n-1]/10)
	}
	return y
}

// PrefillSeconds is the interpolated time of a prompt step of n tokens.
func (p *Profile) PrefillSeconds(n int) float64 {
	return interp(p.prefillX, p.prefillY, float64(n))
}

// DecodeSeconds is the interpolated time of a decode step of batch
// sequences at mean context ctx: along the context within each measured
// batch size, then across batch sizes. Not safe for concurrent use (one
// engine's step loop calls it).
func (p *Profile) DecodeSeconds(batch int, ctx float64) float64 {
	for i, r := range p.rows {
		p.rowY[i] = interp(r.ctx, r.secs, ctx)
	}
	return interp(p.rowX, p.rowY, float64(batch))
}

// StepTime implements TimeModel. A prompt step is the prefill curve at its
// token count, a decode step the decode grid at its batch size and mean
// context. A mixed step runs all its tokens through the weights at once,
// so it costs the prefill curve at prompt tokens plus decodes, plus what
// the decodes' attention costs beyond the smallest measured context. A
// prompt chunk that starts after position 0 adds what its attention over
// the earlier context costs (LaterChunkSeconds).
func (p *Profile) StepTime(b Batch) time.Duration {
	var s float64
	switch {
	case b.Decodes == 0 && b.PrefillTokens == 0:
		return 0
	case b.Decodes == 0:
		s = p.PrefillSeconds(b.PrefillTokens)
	default:
		ctx := float64(b.DecodeContext) / float64(b.Decodes)
		s = p.DecodeSeconds(b.Decodes, ctx)
		if b.PrefillTokens > 0 {
			attn := s - p.DecodeSeconds(b.Decodes, p.rows[0].minContext)
			s = p.PrefillSeconds(b.PrefillTokens+b.Decodes) + max(attn, 0)
		}
	}
	for _, c := range b.Chunks {
		s += p.LaterChunkSeconds(c)
	}
	return time.Duration(s * float64(time.Second))
}

// LaterChunkSeconds is what a prompt chunk costs beyond the same number of
// tokens from position 0: the attention of its tokens over the c.Pos
// tokens before it, which the profile's prefill rows (prompts from
// position 0) do not contain. It reads it off the prefill curve P: a chunk
// [p, p+c) costs the curve's increment P(p+c) − P(p) plus the curve's
// fixed per-step cost P(0), so
//
//	extra = P(p+c) − P(p) − P(c) + P(0),
//
// never below 0. Split P into a per-step, a linear and a quadratic part,
// α + βn + γn² (weights, and attention over n²/2 query-key pairs): the
// extra is then 2γ·p·c, exactly the attention of c queries over p earlier
// keys, and the chunks of one prompt sum to the one-shot P(n) plus α per
// extra step. That sum holds for any measured curve, smooth or not (the
// increments telescope, and the floor at 0 only adds), so chunking a
// prompt never costs less than prefilling it in one step, as on a real
// engine; a fit of γ from noisy rows would not guarantee it.
func (p *Profile) LaterChunkSeconds(c Chunk) float64 {
	if c.Pos <= 0 || c.Len <= 0 {
		return 0
	}
	extra := p.PrefillSeconds(c.Pos+c.Len) - p.PrefillSeconds(c.Pos) - p.PrefillSeconds(c.Len) + p.PrefillSeconds(0)
	return max(extra, 0)
}
