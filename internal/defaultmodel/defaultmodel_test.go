package defaultmodel

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestEmbeddedFilesAreTheSharedCopy keeps the embedded model from drifting
// from the shared test model that the golden tests check: every file but
// our chat template is the shared file, byte for byte, and nothing else
// (no golden files) is embedded.
func TestEmbeddedFilesAreTheSharedCopy(t *testing.T) {
	hf := testmodels.Stories260K(t)
	shared := map[string]string{
		"config.json":           filepath.Join(hf, "config.json"),
		"model.safetensors":     filepath.Join(hf, "model.safetensors"),
		"tokenizer.json":        filepath.Join(hf, "tokenizer.json"),
		"tokenizer_config.json": filepath.Join(hf, "tokenizer_config.json"),
		NoticeFile:              filepath.Join(hf, "..", "NOTICE.md"),
	}
	entries, err := fs.ReadDir(Files(), ".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{NoticeFile, "chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("embedded files (-want +got):\n%s", diff)
	}
	for name, path := range shared {
		t.Run(name+" is the shared file", func(t *testing.T) {
			w, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			g, err := fs.ReadFile(Files(), name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(w, g) {
				t.Errorf("embedded %s (%d bytes) differs from %s (%d bytes): copy it again", name, len(g), path, len(w))
			}
		})
	}
	if n := string(Notice()); !strings.Contains(n, "MIT License") || !strings.Contains(n, "Permission is hereby granted") {
		t.Error("Notice() lacks the MIT license text")
	}
}

func TestInstall(t *testing.T) {
	t.Run("an empty dir means the user cache", func(t *testing.T) {
		cache := t.TempDir()
		t.Setenv("XDG_CACHE_HOME", cache)
		dir, err := Install("")
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(cache, "tandem", "models", Name); dir != want {
			t.Errorf("Install(\"\") = %s, want %s", dir, want)
		}
		if err := Verify(dir); err != nil {
			t.Error(err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("model directory mode %v (%v), want 0755", fi.Mode(), err)
		}
	})

	t.Run("a complete copy is written once and left alone", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "m")
		if _, err := Install(dir); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Stat(filepath.Join(dir, "model.safetensors"))
		if _, err := Install(dir); err != nil {
			t.Fatal(err)
		}
		after, _ := os.Stat(filepath.Join(dir, "model.safetensors"))
		if !os.SameFile(before, after) {
			t.Error("a second Install rewrote a complete copy")
		}
		checkNoLeftovers(t, filepath.Dir(dir))
	})

	damage := []struct {
		name   string
		damage func(dir string)
	}{
		{"a truncated weight file is rewritten", func(dir string) {
			os.Truncate(filepath.Join(dir, "model.safetensors"), 100)
		}},
		{"a changed config is rewritten", func(dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{}`), 0o644)
		}},
		{"a missing file is restored", func(dir string) {
			os.Remove(filepath.Join(dir, "tokenizer.json"))
		}},
		{"a stray file is removed", func(dir string) {
			os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"temperature":2}`), 0o644)
		}},
		{"an empty directory is filled", func(dir string) {
			os.RemoveAll(dir)
			os.Mkdir(dir, 0o755)
		}},
	}
	for _, tt := range damage {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			if _, err := Install(dir); err != nil {
				t.Fatal(err)
			}
			tt.damage(dir)
			if Verify(dir) == nil {
				t.Fatal("Verify accepted the damaged copy")
			}
			if _, err := Install(dir); err != nil {
				t.Fatal(err)
			}
			if err := Verify(dir); err != nil {
				t.Error(err)
			}
			checkNoLeftovers(t, filepath.Dir(dir))
		})
	}
}

// checkNoLeftovers fails if Install left temporary directories in parent.
func checkNoLeftovers(t *testing.T, parent string) {
	t.Helper()
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.Name() != "m" {
			t.Errorf("Install left %s behind", e.Name())
		}
	}
}

func TestChatTemplate(t *testing.T) {
	dir, err := Install(filepath.Join(t.TempDir(), Name))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	type msg = tokenizer.Message
	tests := []struct {
		name      string
		msgs      []msg
		genPrompt bool
		want      string
	}{
		{"a user message is a paragraph and the answer the next one", []msg{{Role: "user", Content: "Tell me a story."}}, true, "<s>Tell me a story.\n"},
		{"system messages are left out and contents trimmed", []msg{{Role: "system", Content: "Be kind."}, {Role: "user", Content: "  Once upon a time \n"}}, true, "<s>Once upon a time\n"},
		{"a conversation is one paragraph per message", []msg{{Role: "user", Content: "Hi."}, {Role: "assistant", Content: "Tom ran."}, {Role: "user", Content: "Why?"}}, true, "<s>Hi.\nTom ran.\nWhy?\n"},
		{"without the generation prompt the last message is continued", []msg{{Role: "user", Content: "Once upon a time"}}, false, "<s>Once upon a time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(tt.msgs, tt.genPrompt)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("rendered %q, want %q", got, tt.want)
			}
		})
	}
	// Rendered and encoded as the chat API does (no added specials), a
	// message is the same prompt as the completion of its text.
	chat, _ := tok.ApplyChatTemplate([]msg{{Role: "user", Content: "Once upon a time"}}, false)
	if diff := cmp.Diff(tok.Encode("Once upon a time", true), tok.Encode(chat, false)); diff != "" {
		t.Errorf("chat prompt ids differ from the completion's (-completion +chat):\n%s", diff)
	}
}

func TestDescribe(t *testing.T) {
	line := Describe("/c/stories260K")
	for _, want := range []string{"260K-parameter", "TinyStories", "children's stories", "--model DIR", "/c/stories260K/NOTICE.md"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "\n") {
		t.Errorf("%q is more than one line", line)
	}
}
