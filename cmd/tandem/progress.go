package main

import (
	"path/filepath"
	"time"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// loadDelay hides the progress of model loads that end sooner: a small
// model loads in well under it, and a bar flashing by says nothing.
const loadDelay = 2 * time.Second

// loadModel loads the model at dir (a directory or a GGUF file) showing the
// bytes read on d.
func loadModel(dir string, pool *tensor.Pool, d *progress.Display) (*model.Model, error) {
	r := d.Reporter("loading "+filepath.Base(filepath.Clean(dir)), progress.Bytes)
	defer r.Done()
	return model.LoadWith(dir, pool, model.LoadOptions{Progress: r.Func()})
}

// quantizeProgress shows a conversion's two stages on a Display: reading
// the checkpoint, then writing the tensors (bytes, with a tensor count).
type quantizeProgress struct {
	d       *progress.Display
	name    string
	read    *progress.Reporter
	stage   *progress.Stage
	tensors *progress.Counter
}

// newQuantizeProgress returns the stages of converting the checkpoint
// called name to enc, nil when d shows nothing.
func newQuantizeProgress(d *progress.Display, name, enc string) *quantizeProgress {
	if !d.Shows() {
		return nil
	}
	return &quantizeProgress{d: d, name: "quantizing to " + enc, read: d.Reporter("reading "+name, progress.Bytes)}
}

// options sets opts' progress callbacks.
func (q *quantizeProgress) options(opts *model.GGUFOptions) {
	if q != nil {
		opts.ReadProgress, opts.Progress = q.read.Func(), q.convert
	}
}

// convert is model.GGUFOptions.Progress: the first report ends the read.
func (q *quantizeProgress) convert(p model.GGUFProgress) {
	if q.stage == nil {
		q.read.Done()
		q.stage = q.d.Start(q.name, p.TotalBytes, progress.Bytes)
		q.tensors = q.stage.Counter("tensors", int64(p.TotalTensors))
	}
	q.stage.Set(p.Bytes)
	q.tensors.Set(int64(p.Tensors))
}

// done ends whichever stage is open.
func (q *quantizeProgress) done() {
	if q != nil {
		q.read.Done()
		q.stage.Done()
	}
}
