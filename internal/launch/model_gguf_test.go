package launch

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf"
)

func writeGGUF(t *testing.T, kv ...gguf.KV) string {
	t.Helper()
	var buf bytes.Buffer
	w, err := gguf.NewWriter(&buf, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestModelMayBeAGGUFFile: `tandem up --model FILE.gguf` passes the early
// check, and the chat template is found in the file's metadata.
func TestModelMayBeAGGUFFile(t *testing.T) {
	plain := writeGGUF(t, gguf.KV{Key: "general.architecture", Value: gguf.StringValue("llama")})
	chat := writeGGUF(t, gguf.KV{Key: "tokenizer.chat_template", Value: gguf.StringValue("{{ messages }}")})
	for _, p := range []string{plain, chat} {
		if err := checkModelDir(p); err != nil {
			t.Errorf("checkModelDir(%s): %v", p, err)
		}
	}
	if HasChatTemplate(plain) || !HasChatTemplate(chat) {
		t.Errorf("HasChatTemplate: %t for a file without one, %t for one with", HasChatTemplate(plain), HasChatTemplate(chat))
	}
	notGGUF := filepath.Join(t.TempDir(), "x.gguf")
	if err := os.WriteFile(notGGUF, []byte("not gguf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkModelDir(notGGUF); err == nil || !strings.Contains(err.Error(), "is a file but not a GGUF file") {
		t.Errorf("checkModelDir(not a GGUF file): %v", err)
	}
}
