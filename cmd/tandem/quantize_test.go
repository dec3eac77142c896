package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestServeGGUF converts stories260K with `tandem model quantize` and
// serves the GGUF file over HTTP: the f32 file must answer exactly as the
// checkpoint directory does, the Q8_0 one must answer.
func TestServeGGUF(t *testing.T) {
	dir := t.TempDir()
	f32 := filepath.Join(dir, "stories-f32.gguf")
	q8 := filepath.Join(dir, "stories-q8_0.gguf")
	captureStdout(t, func() error {
		return runModelQuantize([]string{testmodels.Stories260K(t), "--type", "f32", "--out", f32})
	})
	out := captureStdout(t, func() error {
		return runModelQuantize([]string{"--type", "q8_0", "--out", q8, "--threads", "1", testmodels.Stories260K(t)})
	})
	if !strings.Contains(out, "Q8_0 ×") || !strings.Contains(out, "wrote "+q8) {
		t.Errorf("quantize printed %q", out)
	}
	body := `{"model":"m","prompt":"Once upon a time","max_tokens":24,"temperature":0}`
	want := ""
	for _, m := range []struct{ name, model string }{{"checkpoint", testmodels.Stories260K(t)}, {"f32 GGUF", f32}, {"Q8_0 GGUF", q8}} {
		url := startEngine(t, "--model", m.model, "--served-model-name", "m", "--kv-port", "0")
		code, _, text := completion(t, url, body, nil)
		if code != http.StatusOK || text == "" {
			t.Fatalf("%s: status %d, %q", m.name, code, text)
		}
		switch m.name {
		case "checkpoint":
			want = text
		case "f32 GGUF":
			if text != want {
				t.Errorf("f32 GGUF answered %q, the checkpoint %q", text, want)
			}
		}
		t.Logf("%s: %q", m.name, text)
		code, raw := postJSON(t, url+"/tokenize", `{"model":"m","prompt":"Once upon a time"}`, nil)
		if code != http.StatusOK || !strings.Contains(raw, `"tokens":[1,403,407,261,378]`) {
			t.Errorf("%s: tokenize: %d %s", m.name, code, raw)
		}
	}
}

func TestModelQuantizeRejects(t *testing.T) {
	stories := testmodels.Stories260K(t)
	out := filepath.Join(t.TempDir(), "x.gguf")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--type", "q8_0", "--out", out}, "give the Hugging Face model directory"},
		{[]string{stories, "--out", out}, "--type is required"},
		{[]string{stories, "--type", "q3_k", "--out", out}, `unknown --type "q3_k"`},
		{[]string{stories, "--type", "q8_0"}, "--out FILE.gguf is required"},
		{[]string{out, "--type", "q8_0", "--out", out}, "is not a model directory"},
		{[]string{stories, "extra", "--type", "q8_0", "--out", out}, "unexpected arguments"},
	} {
		err := runModelQuantize(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("quantize %q: error %v, want %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed quantize left a file")
	}
}

func TestModelInitAndInspectGGUF(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.gguf")
	out := captureStdout(t, func() error {
		return runModelInit([]string{"--shape", "tiny", "--dtype", "q8_0", "--out", path})
	})
	if !strings.Contains(out, "wrote tiny (q8_0") || !gguf.IsFile(path) {
		t.Fatalf("init printed %q", out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("init left %d entries in %s, want the file only", len(entries), dir)
	}
	out = captureStdout(t, func() error { return runModelInspect([]string{path}) })
	for _, want := range []string{"file:            " + path, "dtype:           q8_0", "format:          GGUF v3", "tokenizer:       gpt2, pre-tokenizer llama-bpe", "chat template:   yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	if err := runModelInit([]string{"--shape", "tiny", "--dtype", "q4_k_m", "--out", filepath.Join(dir, "d")}); err == nil || !strings.Contains(err.Error(), "give --out FILE.gguf") {
		t.Errorf("init q4_k_m into a directory: %v", err)
	}
}
