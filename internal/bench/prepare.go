package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// WorkloadSource is what Prepare builds a plan's workload from: the
// workload's Spec, and where its prompt ids come from.
type WorkloadSource struct {
	Spec workload.Spec
	// Vocab > 0 draws prompt ids from [10, min(Vocab, 1000)) instead of
	// tokenizing a sample text.
	Vocab int
	// Tokenizer is a model directory whose tokenizer makes the prompt ids
	// when no target serves /tokenize (default: the plan's Model when it
	// is a model directory).
	Tokenizer string
}

// Prepare resolves the plan's model name, the context limit and the prompt
// token pool, and builds its workload from src (whose Spec.MaxContext it
// may fill in). Nothing here needs more than /v1/completions of the
// targets:
//   - the model name is p.Model, or the first of /v1/models (of the first
//     target that answers); a p.Model that is a directory with a tokenizer
//     (a model directory) names the model as /v1/models lists it (its path
//     or base name) or, without /v1/models, by its base name, tandem serve's
//     default --served-model-name;
//   - prompt ids are [10, Vocab) with Vocab, else the distinct ids of a
//     sample text as the first target with /tokenize tokenizes it, else as
//     the tokenizer of src.Tokenizer (or of a model directory) does, else
//     DefaultPool, with a warning (a proxy, vLLM's toy proxy among them,
//     need not serve /tokenize);
//   - a multi-turn answer goes back into the next turn as the tokens of its
//     target's /tokenize, else of the local tokenizer, else as as many
//     stand-in tokens.
func Prepare(ctx context.Context, p *Plan, src *WorkloadSource, log io.Writer) error {
	client := func(t Target, conns int) *Client {
		c := NewClient(t.URL, conns)
		c.APIKey = p.APIKey
		return c
	}
	tokDir := src.Tokenizer
	modelDir := ""
	if p.Model != "" && IsTokenizerDir(p.Model) {
		modelDir = p.Model
		tokDir = cmp.Or(tokDir, modelDir)
	}
	var listed []ModelInfo
	var listErr error
	for _, t := range p.Targets {
		models, err := client(t, 1).Models(ctx)
		if err == nil && len(models) > 0 {
			listed = models
			break
		}
		listErr = cmp.Or(err, fmt.Errorf("%s/v1/models lists no models", t.URL))
	}
	switch {
	case modelDir != "":
		base := filepath.Base(filepath.Clean(modelDir))
		p.Model = base
		for _, m := range listed {
			if m.ID == modelDir || m.ID == filepath.Clean(modelDir) || m.ID == base {
				p.Model = m.ID
				break
			}
		}
	case p.Model == "" && len(listed) == 0:
		return fmt.Errorf("listing models (give --model to skip this): %w", listErr)
	case p.Model == "":
		p.Model = listed[0].ID
	}
	for _, m := range listed {
		if m.ID == p.Model && src.Spec.MaxContext == 0 {
			src.Spec.MaxContext = m.MaxModelLen
		}
	}

	var local *tokenizer.Tokenizer
	if tokDir != "" {
		tok, err := tokenizer.Load(tokDir)
		if err != nil {
			return fmt.Errorf("loading the tokenizer of %s: %w", tokDir, err)
		}
		local = tok
	}
	serverTok := map[string]*Client{}
	var pool []int32
	if src.Vocab > 0 {
		pool = VocabPool(src.Vocab)
	} else {
		for _, t := range p.Targets {
			c := client(t, 4)
			ids, err := c.Tokenize(ctx, p.Model, SampleText)
			if err != nil || len(ids) == 0 {
				continue
			}
			serverTok[t.Name] = c
			if pool == nil {
				pool, _ = TextPool(ids)
				fmt.Fprintf(log, "prompt token ids: the %d distinct ids of a sample text as %s's /tokenize tokenizes it\n", len(pool), t.Name)
			}
		}
		if pool == nil && local != nil {
			var err error
			if pool, err = TextPool(local.Encode(SampleText, false)); err != nil {
				return fmt.Errorf("the tokenizer of %s: %w", tokDir, err)
			}
			fmt.Fprintf(log, "prompt token ids: the %d distinct ids of a sample text as the tokenizer of %s tokenizes it (no target serves /tokenize)\n", len(pool), tokDir)
		}
		if pool == nil {
			pool = DefaultPool()
			fmt.Fprintf(log, "warning: no target serves /tokenize and no tokenizer was given: prompt ids are %d..%d, valid for a vocabulary of at least %d tokens but not known to be ordinary text; pass --tokenizer DIR (the model's directory) or --vocab N\n",
				DefaultPoolLow, DefaultPoolHigh-1, DefaultPoolHigh)
		}
	}
	p.Pool = pool
	if len(serverTok) > 0 || local != nil {
		p.Tokenize = func(ctx context.Context, t Target, text string) ([]int32, error) {
			if c, ok := serverTok[t.Name]; ok {
				return c.Tokenize(ctx, p.Model, text)
			}
			if local != nil {
				return local.Encode(text, false), nil
			}
			return nil, errors.New("no tokenizer for this target")
		}
	}
	w, err := src.Spec.Build(pool)
	if err != nil {
		return err
	}
	p.Workload = w
	return nil
}

// IsTokenizerDir says whether dir is a directory holding a tokenizer.json.
func IsTokenizerDir(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, "tokenizer.json"))
	return err == nil && st.Mode().IsRegular()
}

// WriteJSONFile writes v to the file at path as WriteJSON does.
func WriteJSONFile(path string, v any) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteJSON(f, v); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
