package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestFollowKVEventsFlags: --kv-events and --kv-events-pattern make the
// precise prefix index and hook it to the pool's changes, and refuse what
// they cannot follow.
func TestFollowKVEventsFlags(t *testing.T) {
	dir := t.TempDir()
	if _, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: 512}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	tests := []struct {
		name    string
		args    []string
		tok     *tokenizer.Tokenizer
		wantErr string
	}{
		{"a pattern needs the tokenizer", []string{"--kv-events-pattern", "tcp://{host}:5557", "--model-fingerprint", "fp"}, nil, "need --model"},
		{"a pattern needs the fingerprint", []string{"--kv-events-pattern", "tcp://{host}:5557"}, tok, "--model-fingerprint"},
		{"a bad pattern", []string{"--kv-events-pattern", "udp://{host}:5557", "--model-fingerprint", "fp"}, tok, "--kv-events-pattern"},
		{"a bad explicit entry", []string{"--kv-events", "tcp://10.0.0.7:5557", "--model-fingerprint", "fp"}, tok, "want DECODE_URL="},
		{"a pattern", []string{"--kv-events-pattern", "tcp://{host}:{port+1000};tcp://{host}:{port+1001}", "--model-fingerprint", "fp"}, tok, ""},
		{"vLLM's pickle hashes", []string{"--kv-events-pattern", "tcp://{host}:5557", "--model-fingerprint", "vllm:sha256"}, tok, "sha256_cbor"},
		{"vLLM's CBOR hashes", []string{"--kv-events-pattern", "tcp://{host}:5557", "--model-fingerprint", "vllm:sha256_cbor:42"}, tok, ""},
		{"explicit and a pattern", []string{"--kv-events", "http://127.0.0.1:8101=tcp://127.0.0.1:5557", "--kv-events-pattern", "tcp://{host}:{port+1000}", "--model-fingerprint", "fp"}, tok, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseProxyFlags(append([]string{"--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8101,http://127.0.0.1:8102"}, tt.args...))
			if err != nil {
				t.Fatal(err)
			}
			cfg := f.cfg
			cfg.Tokenizer = tt.tok
			idx, err := followKVEvents(f, &cfg, quiet)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer idx.Close()
			if cfg.PrefixIndex == nil || cfg.BlockHasher == nil || cfg.BackendsChanged == nil {
				t.Fatalf("config not wired: index %v, hasher %v, changes %v", cfg.PrefixIndex != nil, cfg.BlockHasher != nil, cfg.BackendsChanged != nil)
			}
			for _, d := range []string{"http://127.0.0.1:8101", "http://127.0.0.1:8102"} {
				if _, followed := idx.Stats(d); !followed {
					t.Errorf("decode %s is not followed", d)
				}
			}
			cfg.BackendsChanged("decode", []string{"http://127.0.0.1:8103"}, []string{"http://127.0.0.1:8102"})
			if _, followed := idx.Stats("http://127.0.0.1:8103"); !followed {
				t.Error("a decode added at run time is not followed")
			}
			if _, followed := idx.Stats("http://127.0.0.1:8102"); followed {
				t.Error("a decode removed at run time is still followed")
			}
		})
	}
}
