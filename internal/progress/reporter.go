package progress

import "sync"

// Reporter turns a lower layer's progress callback, func(done, total
// int64) with running totals, into a stage: the first report opens it, the
// later ones move it, and the one that reaches the total (or Done) ends it. Its methods are safe for concurrent use; a nil
// *Reporter (from a Display that shows nothing) does nothing.
type Reporter struct {
	d    *Display
	name string
	unit Unit

	mu    sync.Mutex
	stage *Stage
	ended bool
}

// Reporter returns a Reporter for a stage named name counting unit (nil
// when the Display shows nothing).
func (d *Display) Reporter(name string, unit Unit) *Reporter {
	if d == nil || d.opts.Off {
		return nil
	}
	return &Reporter{d: d, name: name, unit: unit}
}

// Report is the callback: done of total so far.
func (r *Reporter) Report(done, total int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	if r.stage == nil {
		r.stage = r.d.Start(r.name, total, r.unit)
	}
	r.stage.SetTotal(total)
	r.stage.Set(done)
	if total > 0 && done >= total {
		r.ended = true // the work is complete: its final line now
		r.stage.Done()
	}
}

// Func is Report as a func value, nil for a nil Reporter (so a lower layer
// that checks its callback for nil skips the work of reporting).
func (r *Reporter) Func() func(done, total int64) {
	if r == nil {
		return nil
	}
	return r.Report
}

// Done ends the stage, if a report opened one.
func (r *Reporter) Done() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	r.stage.Done()
}
