package tokenizer

import (
	"path/filepath"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// benchParagraph is ordinary English prose for measuring encode speed.
const benchParagraph = `The old lighthouse keeper climbed the spiral stairs every evening at dusk, counting each of the one hundred and twelve steps as his father had taught him. At the top, he polished the great lens until it shone, checked the oil, and lit the lamp. Ships passing in the night never saw him, but they trusted his light to guide them safely past the rocks. In fifty-three years he had never missed a single night, not during the storm of 1987, not when the power failed, and not when his own boat was lost. "A light that works most nights," he liked to say, "is a light that nobody can trust."`

func BenchmarkEncode(b *testing.B) {
	for _, name := range []string{"llama3-style.json", "qwen2-style.json", "gpt2-style.json"} {
		b.Run(name, func(b *testing.B) {
			tok, err := LoadFile(filepath.Join(testmodels.TokenizerFixtures(b), name))
			if err != nil {
				b.Fatal(err)
			}
			benchEncode(b, tok)
		})
	}
	b.Run("stories260K", func(b *testing.B) {
		tok, err := Load(testmodels.Stories260K(b))
		if err != nil {
			b.Fatal(err)
		}
		benchEncode(b, tok)
	})
	// The SentencePiece model (spm.go): stories260K's tok512 as a GGUF
	// vocabulary.
	b.Run("stories260K-gguf", func(b *testing.B) {
		tok, err := LoadGGUF(writeGGUF(b, tok512KV(b)))
		if err != nil {
			b.Fatal(err)
		}
		benchEncode(b, tok)
	})
}

func benchEncode(b *testing.B, tok *Tokenizer) {
	n := len(tok.Encode(benchParagraph, false))
	b.SetBytes(int64(len(benchParagraph)))
	b.ResetTimer()
	for b.Loop() {
		tok.Encode(benchParagraph, false)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkDecode(b *testing.B) {
	tok, err := LoadFile(filepath.Join(testmodels.TokenizerFixtures(b), "llama3-style.json"))
	if err != nil {
		b.Fatal(err)
	}
	ids := tok.Encode(benchParagraph, false)
	b.ResetTimer()
	for b.Loop() {
		tok.Decode(ids, false)
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkBPEWordCache measures what the per-word cache saves: the BPE
// step alone over the paragraph's pre-tokenized words, with and without it.
func BenchmarkBPEWordCache(b *testing.B) {
	tok, err := LoadFile(filepath.Join(testmodels.TokenizerFixtures(b), "llama3-style.json"))
	if err != nil {
		b.Fatal(err)
	}
	words := tok.preTok([]string{benchParagraph}, true)
	ids := make([]int32, 0, 1024)
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			ids = ids[:0]
			for _, w := range words {
				ids = tok.model.encode(w, ids)
			}
		}
	})
	b.Run("uncached", func(b *testing.B) {
		for b.Loop() {
			ids = ids[:0]
			for _, w := range words {
				ids = tok.model.(*bpe).mergeWord(w, ids)
			}
		}
	})
}
