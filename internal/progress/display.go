package progress

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure a Display made with NewWriter (Flags.New fills them in
// from the flags, the terminal and the environment).
type Options struct {
	// Off shows nothing: Start returns nil stages, Writer is the
	// underlying writer.
	Off bool
	// Terminal redraws one line in place; otherwise plain lines.
	Terminal bool
	// Color marks warning counts (failures) in red on a terminal.
	Color bool
	// Width returns the terminal's columns (nil: 80); a redrawn line is
	// cut to fit, since a line that wraps cannot be redrawn in place.
	Width func() int
	// Every is the least time between a stage's plain lines (0:
	// DefaultEvery). A stage whose counts have not moved gets a line at
	// most every 12 periods, to show it is alive.
	Every time.Duration
	// Delay hides the stages that end sooner than it.
	Delay time.Duration
	// Window is the span of the moving window the rate and ETA are taken
	// over (0: 20s).
	Window time.Duration
}

// Display writes the progress of a command's stages to one writer (its
// stderr). Its methods are safe for concurrent use; a nil *Display shows
// nothing.
type Display struct {
	w    io.Writer
	opts Options
	tick time.Duration

	mu     sync.Mutex
	stages []*Stage // running, in the order they started
	drawn  string   // the line on screen (terminal), "" when none
	// partial is set while a Writer write has left its line open: no
	// progress is written until the line ends.
	partial bool
	stop    chan struct{} // closed to end the render loop; nil when none runs
}

// NewWriter returns a Display writing to w as o says.
func NewWriter(w io.Writer, o Options) *Display {
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.Window <= 0 {
		o.Window = 20 * time.Second
	}
	tick := time.Second
	if o.Terminal {
		tick = 200 * time.Millisecond
	}
	return &Display{w: w, opts: o, tick: tick}
}

// Shows reports whether d shows anything (it is not nil and not off).
func (d *Display) Shows() bool { return d != nil && !d.opts.Off }

// Start opens a stage named name of total units (0 when not known; for
// Time, the stage's planned duration in nanoseconds) and shows it until
// its Done.
func (d *Display) Start(name string, total int64, unit Unit) *Stage {
	if d == nil || d.opts.Off {
		return nil
	}
	s := &Stage{d: d, name: name, unit: unit, start: time.Now()}
	s.total.Store(total)
	s.lastLine = s.start
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stages = append(d.stages, s)
	if d.stop == nil {
		d.stop = make(chan struct{})
		go d.loop(d.stop)
	}
	return s
}

// Writer returns a writer for other stderr output while stages run: on a
// terminal it erases the progress line first and redraws it after each
// complete line written, so the two never share a line. With the Display
// off it is the underlying writer; a nil Display's discards.
func (d *Display) Writer() io.Writer {
	if d == nil {
		return io.Discard
	}
	if d.opts.Off {
		return d.w
	}
	return logWriter{d}
}

type logWriter struct{ d *Display }

func (l logWriter) Write(p []byte) (int, error) {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	d.erase()
	n, err := d.w.Write(p)
	if len(p) > 0 {
		d.partial = !bytes.HasSuffix(p, []byte("\n"))
	}
	if err == nil {
		d.redraw(time.Now())
	}
	return n, err
}

// loop renders the running stages every tick until stop is closed (when
// the last stage is done).
func (d *Display) loop(stop chan struct{}) {
	t := time.NewTicker(d.tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		d.mu.Lock()
		if d.stop != stop {
			d.mu.Unlock()
			return
		}
		now := time.Now()
		for _, s := range d.stages {
			s.sample(now)
		}
		if d.opts.Terminal {
			d.redraw(now)
		} else {
			for _, s := range d.stages {
				d.plainLine(s, now)
			}
		}
		d.mu.Unlock()
	}
}

// erase takes the redrawn line off the screen (d.mu held).
func (d *Display) erase() {
	if d.drawn != "" {
		io.WriteString(d.w, "\r\x1b[K")
		d.drawn = ""
	}
}

// redraw writes the running stages' line in place, in one write, when it
// differs from the one on screen (d.mu held).
func (d *Display) redraw(now time.Time) {
	if !d.opts.Terminal || d.partial {
		return
	}
	width := 80
	if d.opts.Width != nil {
		width = d.opts.Width()
	}
	width-- // a line that fills the last column wraps on some terminals
	var segs []segment
	for _, s := range d.stages {
		if now.Sub(s.start) < d.opts.Delay {
			continue
		}
		if len(segs) > 0 {
			segs = append(segs, segment{text: "  |  "})
		}
		segs = append(segs, s.terminalSegments(now, width)...)
	}
	if len(segs) == 0 {
		d.erase()
		return
	}
	line := render(segs, width, d.opts.Color)
	if line == d.drawn {
		return
	}
	io.WriteString(d.w, "\r"+line+"\x1b[K")
	d.drawn = line
}

// plainLine writes s's line if its period has passed and its counts moved
// (or a long while passed without) (d.mu held).
func (d *Display) plainLine(s *Stage, now time.Time) {
	if d.partial || now.Sub(s.start) < d.opts.Delay || now.Sub(s.lastLine) < d.opts.Every {
		return
	}
	if t := s.total.Load(); t > 0 && s.value(now) >= t {
		return // complete: the final line follows
	}
	key := s.countsKey()
	if key == s.lastKey && now.Sub(s.lastLine) < 12*d.opts.Every {
		return
	}
	s.lastLine, s.lastKey, s.shown = now, key, true
	io.WriteString(d.w, render(s.plainSegments(now), 0, false)+"\n")
}

// finish writes s's final line, if s was shown or ran for Delay, and takes
// it off the running stages.
func (d *Display) finish(s *Stage) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.Index(d.stages, s)
	if i < 0 {
		return // Done twice
	}
	d.stages = slices.Delete(d.stages, i, i+1)
	if len(d.stages) == 0 {
		close(d.stop)
		d.stop = nil
	}
	if !s.shown && now.Sub(s.start) < d.opts.Delay {
		if d.opts.Terminal {
			d.redraw(now)
		}
		return
	}
	d.erase()
	if d.partial {
		io.WriteString(d.w, "\n") // the final line starts a line of its own
		d.partial = false
	}
	io.WriteString(d.w, render(s.finalSegments(now), 0, d.opts.Color && d.opts.Terminal)+"\n")
	if d.opts.Terminal {
		d.redraw(now)
	}
}

// segment is a piece of a line; warn pieces are red with colour.
type segment struct {
	text string
	warn bool
}

// render joins segs, cut to width visible characters (0: no limit), with
// warn pieces in red when color is set.
func render(segs []segment, width int, color bool) string {
	var b strings.Builder
	left := width
	for _, g := range segs {
		text := g.text
		if width > 0 {
			r := []rune(text)
			if len(r) > left {
				text = string(r[:left])
			}
			left -= len([]rune(text))
		}
		if text == "" {
			continue
		}
		if g.warn && color {
			b.WriteString("\x1b[31m" + text + "\x1b[0m")
		} else {
			b.WriteString(text)
		}
		if width > 0 && left == 0 {
			break
		}
	}
	return b.String()
}
