package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// Config describes a benchmark run.
type Config struct {
	// URL is the server's root, for example "http://127.0.0.1:8000".
	URL string `json:"url"`
	// Model is the model name; empty means the first of /v1/models.
	Model string `json:"model"`
	// Concurrencies are the levels to run, one after another. In a closed
	// loop a level is the number of requests in flight; with Rate it caps
	// them (0: no cap).
	Concurrencies []int `json:"concurrencies"`
	// Requests is the number of requests per level.
	Requests int `json:"requests"`
	// PromptTokens and MaxTokens are the exact prompt and output lengths.
	PromptTokens int `json:"prompt_tokens"`
	MaxTokens    int `json:"max_tokens"`
	// Rate is the mean request arrival rate per second of a Poisson
	// process; 0 means a closed loop.
	Rate float64 `json:"rate"`
	// Seed fixes the prompts and arrival times. Each level of a sweep gets
	// its own prompts, so prefix caching does not favour later levels.
	Seed uint64 `json:"seed"`
	// Timeout bounds each request, start to end of stream.
	Timeout time.Duration `json:"timeout_ns"`
	// Vocab, when > 0, draws prompt ids from [10, min(Vocab, 1000)); when 0
	// the ids are those of a fixed English text through /tokenize.
	Vocab int `json:"vocab,omitempty"`
}

func (c *Config) check() error {
	switch {
	case c.URL == "":
		return errors.New("--url is required")
	case len(c.Concurrencies) == 0:
		return errors.New("no concurrency given")
	case c.Requests < 1:
		return fmt.Errorf("--requests must be at least 1, got %d", c.Requests)
	case c.PromptTokens < 1:
		return fmt.Errorf("--prompt-tokens must be at least 1, got %d", c.PromptTokens)
	case c.MaxTokens < 1:
		return fmt.Errorf("--max-tokens must be at least 1, got %d", c.MaxTokens)
	case c.Rate < 0:
		return fmt.Errorf("--rate must be >= 0, got %v", c.Rate)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %v", c.Timeout)
	}
	for _, n := range c.Concurrencies {
		if n < 0 || (n == 0 && c.Rate == 0) {
			return fmt.Errorf("concurrency %d: must be at least 1 (or 0 with --rate for no cap)", n)
		}
	}
	return nil
}

// sampleText is tokenized to find token ids that are ordinary text for the
// server's tokenizer, whatever its vocabulary.
const sampleText = `Once upon a time, in a small town by the sea, there lived a girl named
Lily who loved to read books about stars, ships and faraway lands. Every
morning she walked to the harbor, watched the fishermen mend their nets and
asked them questions: why is the water blue, where do the birds go in winter,
how many fish live in the ocean? The old captain laughed and told her stories
of storms, islands, whales and treasure. One day a strange boat arrived with
red sails, and a tall man stepped onto the dock carrying a wooden box.`

// TokenPool returns the ids prompts are drawn from: [10, min(vocab, 1000))
// when vocab > 0 (ids below 10 are often special tokens), else the distinct
// ids of a fixed English text as the server tokenizes it.
func TokenPool(ctx context.Context, c *Client, model string, vocab int) ([]int32, error) {
	if vocab > 0 {
		lo, hi := int32(10), int32(min(vocab, 1000))
		if hi <= lo {
			lo = 0
		}
		pool := make([]int32, 0, hi-lo)
		for id := lo; id < hi; id++ {
			pool = append(pool, id)
		}
		return pool, nil
	}
	ids, err := c.Tokenize(ctx, model, sampleText)
	if err != nil {
		return nil, fmt.Errorf("finding prompt token ids through /tokenize (pass --vocab to choose ids without it): %w", err)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) == 0 {
		return nil, errors.New("/tokenize returned no tokens; pass --vocab")
	}
	return ids, nil
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

// Setup resolves the model name and the prompt token pool, and checks the
// requested lengths against the server's context length when it reports one.
func Setup(ctx context.Context, c *Client, cfg *Config) (model string, pool []int32, err error) {
	models, err := c.Models(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("listing models at %s: %w", c.BaseURL, err)
	}
	model = cfg.Model
	var info *ModelInfo
	for i := range models {
		if model == "" || models[i].ID == model {
			info = &models[i]
			break
		}
	}
	switch {
	case info != nil:
		model = info.ID
	case model == "":
		return "", nil, fmt.Errorf("%s/v1/models lists no models", c.BaseURL)
	default:
		return "", nil, fmt.Errorf("model %q is not served at %s", model, c.BaseURL)
	}
	if info.MaxModelLen > 0 && cfg.PromptTokens+cfg.MaxTokens > info.MaxModelLen {
		return "", nil, fmt.Errorf("--prompt-tokens %d + --max-tokens %d exceed the model's context of %d tokens",
			cfg.PromptTokens, cfg.MaxTokens, info.MaxModelLen)
	}
	pool, err = TokenPool(ctx, c, model, cfg.Vocab)
	return model, pool, err
}

// probeStream is the prompt stream of the probe request, apart from every
// level's.
const probeStream = 1<<64 - 1

// RunAll runs every concurrency level of cfg in turn after one probe request
// that fails fast on a misconfiguration, and returns one Report per level.
// It stops early, returning the reports so far, when ctx is cancelled.
func RunAll(ctx context.Context, cfg Config) ([]*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	conns := slices.Max(cfg.Concurrencies)
	if conns == 0 { // Poisson arrivals without a cap
		conns = cfg.Requests
	}
	c := NewClient(cfg.URL, conns)
	model, pool, err := Setup(ctx, c, &cfg)
	if err != nil {
		return nil, err
	}
	cfg.Model = model

	probePrompt := Prompts(cfg.Seed, probeStream, 1, cfg.PromptTokens, pool)[0]
	pctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	probe := c.Stream(pctx, CompletionRequest{Model: model, Prompt: probePrompt, MaxTokens: min(cfg.MaxTokens, 2), IgnoreEOS: true})
	cancel()
	if probe.Err != nil {
		return nil, fmt.Errorf("probe request failed, not starting the benchmark: %w", probe.Err)
	}

	var reports []*Report
	for i, conc := range cfg.Concurrencies {
		if ctx.Err() != nil {
			return reports, ctx.Err()
		}
		prompts := Prompts(cfg.Seed, uint64(i), cfg.Requests, cfg.PromptTokens, pool)
		reports = append(reports, runLevel(ctx, c, cfg, conc, prompts))
	}
	return reports, ctx.Err()
}

// runLevel sends all prompts at one concurrency level.
func runLevel(ctx context.Context, c *Client, cfg Config, conc int, prompts [][]int32) *Report {
	outcomes := make([]Outcome, len(prompts))
	var sem chan struct{}
	if conc > 0 {
		sem = make(chan struct{}, conc)
	}
	var arrivals []time.Duration
	if cfg.Rate > 0 {
		arrivals = Arrivals(cfg.Seed, len(prompts), cfg.Rate)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range prompts {
		if arrivals != nil {
			if !sleepUntil(ctx, start.Add(arrivals[i])) {
				outcomes[i].Err = ctx.Err()
				continue
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				outcomes[i].Err = ctx.Err()
				continue
			}
		}
		wg.Go(func() {
			if sem != nil {
				defer func() { <-sem }()
			}
			rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			outcomes[i] = c.Stream(rctx, CompletionRequest{
				Model: cfg.Model, Prompt: p, MaxTokens: cfg.MaxTokens, IgnoreEOS: true,
			})
		})
	}
	wg.Wait()
	return NewReport(conc, cfg, time.Since(start), outcomes)
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
