package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// SampleText is tokenized to find token ids that are ordinary text for the
// server's tokenizer, whatever its vocabulary.
const SampleText = `Once upon a time, in a small town by the sea, there lived a girl named
Lily who loved to read books about stars, ships and faraway lands. Every
morning she walked to the harbor, watched the fishermen mend their nets and
asked them questions: why is the water blue, where do the birds go in winter,
how many fish live in the ocean? The old captain laughed and told her stories
of storms, islands, whales and treasure. One day a strange boat arrived with
red sails, and a tall man stepped onto the dock carrying a wooden box.`

// VocabPool is [10, min(vocab, 1000)): ids below 10 are often special
// tokens.
func VocabPool(vocab int) []int32 {
	lo, hi := int32(10), int32(min(vocab, 1000))
	if hi <= lo {
		lo = 0
	}
	return idRange(lo, hi)
}

// DefaultPoolLow and DefaultPoolHigh bound the pool used when nothing can
// tokenize (no /tokenize on any target, no local tokenizer, no --vocab):
// [32, 288) avoids the special tokens that some vocabularies put first
// (SmolLM2: 0–16, Llama: 0–2) and fits any vocabulary of 288 ids or more.
const (
	DefaultPoolLow  = 32
	DefaultPoolHigh = 288
)

// DefaultPool is [DefaultPoolLow, DefaultPoolHigh).
func DefaultPool() []int32 { return idRange(DefaultPoolLow, DefaultPoolHigh) }

func idRange(lo, hi int32) []int32 {
	pool := make([]int32, 0, max(hi-lo, 0))
	for id := lo; id < hi; id++ {
		pool = append(pool, id)
	}
	return pool
}

// TextPool is the sorted distinct ids of SampleText's tokens, ids.
func TextPool(ids []int32) ([]int32, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) == 0 {
		return nil, errors.New("the sample text tokenized to no tokens")
	}
	return ids, nil
}

// TokenPool returns the ids prompts are drawn from: VocabPool(vocab) when
// vocab > 0, else the distinct ids of SampleText as the server at c
// tokenizes it (POST /tokenize).
func TokenPool(ctx context.Context, c *Client, model string, vocab int) ([]int32, error) {
	if vocab > 0 {
		return VocabPool(vocab), nil
	}
	ids, err := c.Tokenize(ctx, model, SampleText)
	if err != nil {
		return nil, fmt.Errorf("finding prompt token ids through /tokenize (pass --vocab to choose ids without it): %w", err)
	}
	return TextPool(ids)
}

// Prompts returns n prompts of length tokens drawn uniformly from pool, a
// pure function of seed and stream. Different streams give unrelated
// prompts: each concurrency level of a sweep uses its own, so a server's
// prefix cache cannot carry one level's prompts into the next.
func Prompts(seed, stream uint64, n, tokens int, pool []int32) [][]int32 {
	r := rand.New(rand.NewPCG(seed, 0x62656e6368^stream)) // "bench"
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, tokens)
		for j := range p {
			p[j] = pool[r.IntN(len(pool))]
		}
		out[i] = p
	}
	return out
}

// Arrivals returns the start offsets of n requests of a Poisson process of
// the given rate per second (exponential gaps), a pure function of seed. The
// first request starts at 0.
func Arrivals(seed uint64, n int, rate float64) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0x6172726976616c)) // "arrival"
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += r.ExpFloat64() / rate
	}
	return out
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ParseConcurrencies parses a comma-separated list such as "1,4,16".
func ParseConcurrencies(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		var n int
		if _, err := fmt.Sscanf(f, "%d", &n); err != nil || fmt.Sprint(n) != f || n < 1 {
			return nil, fmt.Errorf("bad concurrency %q in %q: want positive integers separated by commas", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}
