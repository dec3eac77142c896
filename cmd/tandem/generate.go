package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// generateBlockSize is the KV block size of the one-shot generator; the
// block table is simply 0, 1, 2, ... over a pool sized for the request.
const generateBlockSize = 16

// runGenerate implements "tandem generate": one prompt, tokens streamed to
// stdout, timings to stderr.
func runGenerate(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	dir := fs.String("model", "", "model directory (Hugging Face layout; default: the embedded stories260K story model)")
	prompt := fs.String("prompt", "", "prompt text")
	chat := fs.Bool("chat", false, "wrap the prompt as a user message with the model's chat template")
	maxTokens := fs.Int("max-tokens", 128, "maximum number of tokens to generate")
	temperature := fs.Float64("temperature", 0, "sampling temperature; 0 is greedy")
	seed := fs.Uint64("seed", 0, "sampling seed")
	threads := fs.Int("threads", runtime.NumCPU(), "compute threads")
	pf := progress.Flags{Delay: loadDelay}
	pf.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q (quote the --prompt)", fs.Args())
	case *maxTokens < 1:
		return fmt.Errorf("--max-tokens must be at least 1, got %d", *maxTokens)
	case *temperature < 0 || math.IsNaN(*temperature):
		return fmt.Errorf("--temperature must be >= 0, got %g", *temperature)
	case *threads < 1:
		return fmt.Errorf("--threads must be at least 1, got %d", *threads)
	}

	if *dir == "" {
		var err error
		if *dir, err = useDefaultModel(os.Stderr); err != nil {
			return err
		}
	}

	pool := tensor.NewPool(*threads)
	defer pool.Close()
	m, err := loadModel(*dir, pool, pf.New(os.Stderr))
	if err != nil {
		return err
	}
	defer m.Close()
	tok, err := tokenizer.Load(*dir)
	if err != nil {
		return err
	}
	text := *prompt
	if *chat {
		if text, err = tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: *prompt}}, true); err != nil {
			return fmt.Errorf("%w", err)
		}
	}
	ids := tok.Encode(text, !*chat)
	if len(ids) == 0 {
		bos, ok := tok.BOS()
		if !ok {
			return errors.New("the prompt is empty and the tokenizer has no BOS token to start from")
		}
		ids = []int32{bos}
	}
	room := m.MaxModelLen() - len(ids)
	if room < 1 {
		return fmt.Errorf("the prompt is %d tokens, the model takes at most %d", len(ids), m.MaxModelLen())
	}
	n := min(*maxTokens, room)
	eos := stopIDs(tok, m)

	layout := m.KVLayout(generateBlockSize)
	blocks := make([]int32, (len(ids)+n+generateBlockSize-1)/generateBlockSize)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	kv := make([]byte, len(blocks)*layout.BlockBytes())
	rng := rand.New(rand.NewPCG(*seed, 0x74616e64656d))
	out := bufio.NewWriter(os.Stdout)
	dec := tokenizer.NewDecoder(tok, true, ids)

	start := time.Now()
	logits, err := m.Forward([]model.Seq{{Tokens: ids, Blocks: blocks, Logits: []int{len(ids) - 1}}}, kv, layout)
	if err != nil {
		return err
	}
	prefill := time.Since(start)

	var decode time.Duration
	generated, steps := 0, 0
	pos := len(ids)
	for {
		next := sampleToken(logits[0], *temperature, rng)
		generated++
		if slices.Contains(eos, next) {
			break
		}
		out.WriteString(dec.Add(next))
		out.Flush()
		if generated == n {
			break
		}
		t0 := time.Now()
		logits, err = m.Forward([]model.Seq{{Tokens: []int32{next}, Pos: pos, Blocks: blocks, Logits: []int{0}}}, kv, layout)
		if err != nil {
			return err
		}
		decode += time.Since(t0)
		steps++
		pos++
	}
	out.WriteString(dec.Flush())
	out.WriteString("\n")
	if err := out.Flush(); err != nil {
		return fmt.Errorf("writing output: %w", err)
	}
	fmt.Fprintf(os.Stderr, "\nprompt:   %d tokens in %s (%.1f tok/s)\n", len(ids), prefill.Round(time.Microsecond), rate(len(ids), prefill))
	fmt.Fprintf(os.Stderr, "%d tokens, %d decode steps in %s (%.1f tok/s), %d threads\n", generated, steps, decode.Round(time.Microsecond), rate(steps, decode), *threads)
	return nil
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// stopIDs gathers end-of-sequence ids from the tokenizer, config.json and
// generation_config.json.
func stopIDs(tok *tokenizer.Tokenizer, m *model.Model) []int32 {
	ids := tok.EOS()
	ids = append(ids, m.Config().EOS...)
	ids = append(ids, m.GenerationConfig().EOS...)
	return ids
}

// sampleToken picks the argmax when temperature is 0 and otherwise draws
// from softmax(logits/temperature). (Serving uses internal/sample; this is
// the minimal sampler of the terminal tool.)
func sampleToken(logits []float32, temperature float64, rng *rand.Rand) int32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if temperature == 0 {
		return int32(best)
	}
	mx := float64(logits[best])
	var sum float64
	probs := make([]float64, len(logits))
	for i, v := range logits {
		probs[i] = math.Exp((float64(v) - mx) / temperature)
		sum += probs[i]
	}
	u := rng.Float64() * sum
	for i, p := range probs {
		u -= p
		if u < 0 {
			return int32(i)
		}
	}
	return int32(best)
}
