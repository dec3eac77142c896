package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// HasChatTemplate reports whether the model in dir has a chat template (in
// tokenizer_config.json or chat_template.jinja, or tokenizer.chat_template
// of a GGUF file), i.e. whether /v1/chat/completions can work with it.
func HasChatTemplate(dir string) bool {
	if gguf.IsFile(dir) {
		f, err := gguf.Open(dir)
		if err != nil {
			return false
		}
		defer f.Close()
		s, _, _ := f.Str("tokenizer.chat_template")
		return s != ""
	}
	if _, err := os.Stat(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return false
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return false
	}
	s := string(cfg.ChatTemplate)
	return s != "" && s != "null" && s != `""` && s != "[]"
}

// checkModelDir fails early, with advice, when dir cannot be a model.
func checkModelDir(dir string) error {
	if gguf.IsFile(dir) {
		return nil
	}
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return fmt.Errorf("--model %s is a file but not a GGUF file: give a GGUF file or a Hugging Face Llama or Qwen2 directory (config.json, *.safetensors, tokenizer.json)", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--model %s has no config.json: give a Hugging Face Llama or Qwen2 directory (config.json, *.safetensors, tokenizer.json) or a GGUF file", dir)
		}
		return fmt.Errorf("--model %s: %w", dir, err)
	}
	return nil
}
