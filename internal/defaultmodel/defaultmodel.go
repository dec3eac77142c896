package defaultmodel

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// Name is the default model's name: its cache directory's base name and so
// the name the API serves it under.
const Name = "stories260K"

// NoticeFile is the file, in the model directory, with the model's
// provenance and license.
const NoticeFile = "NOTICE.md"

//go:embed stories260K
var embedded embed.FS

// Files returns the embedded model directory: config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json,
// chat_template.jinja and NOTICE.md.
func Files() fs.FS {
	sub, err := fs.Sub(embedded, Name)
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// Notice returns the model's provenance and license text.
func Notice() []byte {
	b, err := fs.ReadFile(Files(), NoticeFile)
	if err != nil {
		panic(err)
	}
	return b
}

// CacheDir is where Install writes the model unless told otherwise:
// os.UserCacheDir()/tandem/models/stories260K ($XDG_CACHE_HOME or ~/.cache
// on Linux).
func CacheDir() (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory for the default model (set XDG_CACHE_HOME or pass --model): %w", err)
	}
	return filepath.Join(c, "tandem", "models", Name), nil
}

// Install makes dir ("" means CacheDir()) hold exactly the embedded files
// and returns it. A directory that already does is left alone, so the model
// is written once; one with other content (a stale or damaged copy, a stray
// file) is replaced. The files are written to a temporary directory beside
// dir and renamed into place, so no reader ever sees a half-written model
// and two processes racing both end with a complete one.
func Install(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = CacheDir(); err != nil {
			return "", err
		}
	}
	if Verify(dir) == nil {
		return dir, nil
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("creating the model cache %s: %w", parent, err)
	}
	tmp, err := os.MkdirTemp(parent, Name+".partial-")
	if err != nil {
		return "", fmt.Errorf("creating the model cache: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := writeFiles(tmp); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp makes it 0700
		return "", err
	}
	if os.Rename(tmp, dir) == nil {
		return dir, nil
	}
	// dir exists: a stale copy, or a complete one another process just
	// renamed into place.
	if Verify(dir) == nil {
		return dir, nil
	}
	// Move the stale copy aside, put ours in its place, then delete the old
	// one. (Into a fresh directory: renaming onto an empty directory is not
	// allowed on every file system.)
	trash, err := os.MkdirTemp(parent, Name+".stale-")
	if err != nil {
		return "", fmt.Errorf("replacing the stale default model in %s: %w", dir, err)
	}
	defer os.RemoveAll(trash)
	if err := os.Rename(dir, filepath.Join(trash, "old")); err != nil {
		return "", fmt.Errorf("replacing the stale default model in %s (remove it, or pass --model): %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if Verify(dir) == nil {
			return dir, nil // another process won the race
		}
		return "", fmt.Errorf("moving the default model into %s: %w", dir, err)
	}
	return dir, nil
}

// Verify returns nil if dir holds exactly the embedded files, and otherwise
// an error naming the first difference.
func Verify(dir string) error {
	files := Files()
	want, err := fs.ReadDir(files, ".")
	if err != nil {
		return err
	}
	got, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	names := func(es []fs.DirEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	if w, g := names(want), names(got); !slices.Equal(w, g) {
		return fmt.Errorf("%s holds %q, want %q", dir, g, w)
	}
	for _, e := range want {
		w, err := fs.ReadFile(files, e.Name())
		if err != nil {
			return err
		}
		g, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if !bytes.Equal(w, g) {
			return fmt.Errorf("%s differs from the embedded copy", filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

func writeFiles(dir string) error {
	return fs.WalkDir(Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Files(), path)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(dir, path), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("writing the default model: %w", err)
		}
		_, err = f.Write(b)
		// Synced before the rename publishes it, so a crash cannot leave a
		// complete-looking directory with empty files.
		err = errors.Join(err, f.Sync(), f.Close())
		if err != nil {
			return fmt.Errorf("writing the default model: %w", err)
		}
		return nil
	})
}

// Describe is the line to print when the default model is used from dir:
// what it is, what to expect, where its license is and how to serve a real
// model instead.
func Describe(dir string) string {
	return fmt.Sprintf("No --model given: serving %s, a 260K-parameter model trained on TinyStories, so expect short children's stories "+
		"(MIT license: %s). For a real model pass --model DIR, a Hugging Face Llama, Mistral or Qwen2 directory.",
		Name, filepath.Join(dir, NoticeFile))
}
