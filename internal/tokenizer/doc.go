// Package tokenizer turns text into token ids and back for Hugging Face
// models, reading the model's tokenizer.json (and tokenizer_config.json) the
// way the Rust `tokenizers` library does, so that prompts tokenize to exactly
// the ids a vLLM server would feed the same model.
//
// Supported: the BPE model, both byte-level (GPT-2, Llama-3, Qwen2 style:
// ByteLevel and regex Split pre-tokenizers, NFC normalizer, ByteLevel decoder)
// and SentencePiece style (Prepend/Replace normalizers or the Metaspace
// pre-tokenizer, byte_fallback, and the Replace/ByteFallback/Fuse/Strip
// decoders); added and special tokens matched literally in the text
// (leftmost-longest, honouring lstrip, rstrip, single_word and normalized);
// TemplateProcessing post-processors and add_bos_token/add_eos_token; an
// incremental detokenizer for streaming (StreamDecoder); Jinja chat
// templates; a bounded encoder that refuses a text longer than the model's
// context after encoding little more than a context's worth of it
// (EncodeBounded); and a writer for small self-contained tokenizers used
// by random-weight test models (WriteFixture).
//
// Unsupported model types (WordPiece, Unigram, WordLevel) and unknown
// normalizer, pre-tokenizer, post-processor or decoder types are rejected by
// Load with an error naming the component, rather than tokenizing subtly
// differently from the reference.
//
// A Tokenizer is immutable after Load and safe for concurrent use by any
// number of goroutines; a StreamDecoder belongs to one request and is not.
package tokenizer
