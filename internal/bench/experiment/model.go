package experiment

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/progress"
)

// Model returns the directory of a random-weight model of shape in the
// user cache (…/tandem/models/SHAPE-DTYPE), creating it the first time as
// `tandem model init` does and saying so on w. It is written beside its
// final place and renamed, so an interrupted run leaves no half model.
func Model(w io.Writer, shape, dtype string) (string, error) {
	return ModelProgress(w, nil, shape, dtype)
}

// ModelProgress is Model showing the weights written on d.
func ModelProgress(w io.Writer, d *progress.Display, shape, dtype string) (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory for the model (set XDG_CACHE_HOME or pass --model): %w", err)
	}
	dir := filepath.Join(c, "tandem", "models", shape+"-"+dtype)
	if exists(filepath.Join(dir, "model.safetensors")) && exists(filepath.Join(dir, "config.json")) && bench.IsTokenizerDir(dir) {
		fmt.Fprintf(w, "experiment: model %s (random weights, shape %s %s)\n", dir, shape, dtype)
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".partial-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	fmt.Fprintf(w, "experiment: no --model: creating a random-weight %s (%s) model in %s (once; pass --model DIR for another)\n", shape, dtype, dir)
	r := d.Reporter("writing "+shape+" ("+dtype+")", progress.Bytes)
	_, err = modelinit.InitProgress(tmp, shape, dtype, 0, r.Func())
	r.Done()
	if err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
