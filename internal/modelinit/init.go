package modelinit

import (
	"fmt"
	"os"

	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// tinyTokenizerVocab is the vocabulary the tiny shape asks of the
// tokenizer fixture; the model takes whatever size the fixture reports.
const tinyTokenizerVocab = 4096

// Init writes a complete random-weight model of a named shape into dir:
// a byte-level BPE tokenizer with a ChatML chat template
// (tokenizer.WriteFixture), then config.json, generation_config.json and
// model.safetensors. BOS and EOS come from the tokenizer so that generation
// stops where the chat template says. It returns the Spec written.
func Init(dir, shape, dtype string, seed uint64) (Spec, error) {
	return InitProgress(dir, shape, dtype, seed, nil)
}

// InitProgress is Init telling progress (when not nil) the bytes of weights
// written so far and in all (see WriteProgress).
func InitProgress(dir, shape, dtype string, seed uint64, progress func(written, total int64)) (Spec, error) {
	spec, err := Shape(shape, dtype)
	if err != nil {
		return Spec{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Spec{}, fmt.Errorf("modelinit: %w", err)
	}
	want := spec.Vocab
	if want == 0 {
		want = tinyTokenizerVocab
	}
	fx, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: want, ChatTemplate: true})
	if err != nil {
		return Spec{}, fmt.Errorf("modelinit: writing the tokenizer: %w", err)
	}
	if spec.Vocab == 0 {
		spec.Vocab = fx.VocabSize
	}
	spec.BOS, spec.EOS = fx.BOS, fx.EOS
	if err := WriteProgress(dir, spec, seed, progress); err != nil {
		return Spec{}, err
	}
	return spec, nil
}
