package model

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// GenerationConfig holds the defaults of generation_config.json. A nil
// field was absent from the file.
type GenerationConfig struct {
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
	MaxNewTokens      *int
	DoSample          *bool
	EOS               []int32
}

// LoadGenerationConfig reads dir/generation_config.json. A missing file
// yields an empty GenerationConfig. For a GGUF file it holds only the
// end-of-generation ids of the tokenizer metadata.
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	if gguf.IsFile(dir) {
		_, g, err := LoadGGUFConfig(dir)
		return g, err
	}
	path := filepath.Join(dir, "generation_config.json")
	if _, err := os.Stat(path); os.IsNotExist(err) {
		return &GenerationConfig{}, nil
	}
	f, err := readFields(path)
	if err != nil {
		return nil, err
	}
	return f.generationConfig()
}

// ParseGenerationConfig validates the contents of a generation_config.json.
func ParseGenerationConfig(data []byte) (*GenerationConfig, error) {
	f, err := parseFields("generation_config.json", data)
	if err != nil {
		return nil, err
	}
	return f.generationConfig()
}

func (f *fields) generationConfig() (*GenerationConfig, error) {
	g := &GenerationConfig{}
	floats := []struct {
		dst  **float64
		name string
		ok   func(float64) bool
		want string
	}{
		{&g.Temperature, "temperature", func(v float64) bool { return v >= 0 }, "a non-negative number"},
		{&g.TopP, "top_p", func(v float64) bool { return v > 0 && v <= 1 }, "a number in (0, 1]"},
		{&g.MinP, "min_p", func(v float64) bool { return v >= 0 && v <= 1 }, "a number in [0, 1]"},
		{&g.RepetitionPenalty, "repetition_penalty", func(v float64) bool { return v > 0 }, "a positive number"},
	}
	for _, fl := range floats {
		if !f.has(fl.name) {
			continue
		}
		v, err := f.floatField(fl.name, 0)
		if err != nil {
			return nil, err
		}
		if !fl.ok(v) {
			return nil, f.typeErr(fl.name, fl.want)
		}
		*fl.dst = &v
	}
	ints := []struct {
		dst  **int
		name string
		min  int
	}{
		{&g.TopK, "top_k", 0},
		{&g.MaxNewTokens, "max_new_tokens", 1},
	}
	for _, fi := range ints {
		if !f.has(fi.name) {
			continue
		}
		v, err := f.intField(fi.name, 0, false)
		if err != nil {
			return nil, err
		}
		if v < fi.min {
			return nil, f.typeErr(fi.name, fmt.Sprintf("an integer >= %d", fi.min))
		}
		*fi.dst = &v
	}
	if f.has("do_sample") {
		v, err := f.boolField("do_sample", false)
		if err != nil {
			return nil, err
		}
		g.DoSample = &v
	}
	var err error
	if g.EOS, err = f.idsField("eos_token_id"); err != nil {
		return nil, err
	}
	return g, nil
}
