package up

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// TinyShape is the random-weight model `tandem up` makes when no --model is
// given.
const TinyShape = "tiny"

// DefaultTinyDir is where that model is cached:
// os.UserCacheDir()/tandem/models/tiny.
func DefaultTinyDir() (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory for the tiny model (set XDG_CACHE_HOME or pass --model): %w", err)
	}
	return filepath.Join(c, "tandem", "models", TinyShape), nil
}

// EnsureTinyModel makes the random-weight tiny model in dir by running
// `exe model init --shape tiny --dtype f32 --out TMP` and renaming TMP to
// dir, unless dir already holds a model. The rename makes creation atomic:
// a run interrupted half-way leaves no half-written model behind, and two
// runs racing both end with a complete one.
func EnsureTinyModel(ctx context.Context, exe, dir string, out *output) error {
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("creating the model cache %s: %w", parent, err)
	}
	tmp, err := os.MkdirTemp(parent, TinyShape+".partial-")
	if err != nil {
		return fmt.Errorf("creating the model cache: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	logs := newLineRelay("model", out)
	cmd := exec.CommandContext(ctx, exe, "model", "init", "--shape", TinyShape, "--dtype", "f32", "--out", tmp)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	logs.Flush()
	if err != nil {
		return fmt.Errorf("making the tiny model with `%s model init`: %w", exe, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "config.json")); statErr == nil {
			return nil // another run made it first
		}
		return fmt.Errorf("moving the tiny model into %s: %w", dir, err)
	}
	return nil
}

// HasChatTemplate reports whether the model in dir has a chat template (in
// tokenizer_config.json or chat_template.jinja), i.e. whether
// /v1/chat/completions can work with it.
func HasChatTemplate(dir string) bool {
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
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--model %s has no config.json: give a Hugging Face Llama or Qwen2 directory (config.json, *.safetensors, tokenizer.json)", dir)
		}
		return fmt.Errorf("--model %s: %w", dir, err)
	}
	return nil
}
