package progress

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Unit is what a stage counts.
type Unit struct {
	kind unitKind
	noun string
}

type unitKind int

const (
	bytesKind unitKind = iota
	itemsKind
	timeKind
)

// Bytes counts bytes (read, written, converted).
var Bytes = Unit{kind: bytesKind}

// Time makes a stage's progress its own running time against its planned
// duration (a soak that runs for --duration): Add is not needed.
var Time = Unit{kind: timeKind}

// Items counts things named by noun ("requests", "tensors").
func Items(noun string) Unit { return Unit{kind: itemsKind, noun: noun} }

// Stage is one phase of a command's work, shown until Done. Add and the
// counters' Add may be called from any number of goroutines; every method
// of a nil *Stage (a Display that is off) does nothing.
type Stage struct {
	d     *Display
	name  string
	unit  Unit
	start time.Time
	total atomic.Int64
	done  atomic.Int64

	// Under d.mu:
	counters []*Counter
	samples  []sample // the moving window, oldest first
	lastLine time.Time
	lastKey  string
	shown    bool
}

// Counter is a further count shown beside a stage's own (tensors beside
// bytes, failed and in flight beside requests done).
type Counter struct {
	label string
	total int64
	warn  bool
	gauge bool // shown while the stage runs, not in its final line
	n     atomic.Int64
}

type sample struct {
	at   time.Time
	done int64
}

// Add counts n more units done.
func (s *Stage) Add(n int64) {
	if s != nil {
		s.done.Add(n)
	}
}

// Set sets the count to n, for a caller that reports running totals.
func (s *Stage) Set(n int64) {
	if s != nil {
		s.done.Store(n)
	}
}

// SetTotal changes the stage's total (when it becomes known late).
func (s *Stage) SetTotal(n int64) {
	if s != nil {
		s.total.Store(n)
	}
}

// Counter adds a count labelled label, of total (0: no total), shown after
// the stage's own.
func (s *Stage) Counter(label string, total int64) *Counter {
	return s.counter(&Counter{label: label, total: total})
}

// Warning adds a count labelled label ("failed") shown only once it is not
// zero, in red on a colour terminal.
func (s *Stage) Warning(label string) *Counter {
	return s.counter(&Counter{label: label, warn: true})
}

// Gauge adds a count labelled label ("in flight") shown while the stage
// runs but not in its final line.
func (s *Stage) Gauge(label string) *Counter {
	return s.counter(&Counter{label: label, gauge: true})
}

func (s *Stage) counter(c *Counter) *Counter {
	if s == nil {
		return nil
	}
	s.d.mu.Lock()
	s.counters = append(s.counters, c)
	s.d.mu.Unlock()
	return c
}

// Add counts n more (n may be negative: a gauge of requests in flight).
func (c *Counter) Add(n int64) {
	if c != nil {
		c.n.Add(n)
	}
}

// Set sets the count to n.
func (c *Counter) Set(n int64) {
	if c != nil {
		c.n.Store(n)
	}
}

// Done ends the stage and writes its final line (left on screen on a
// terminal). Only the first call counts.
func (s *Stage) Done() {
	if s != nil {
		s.d.finish(s)
	}
}

// value is the units done at now: the count, or for a Time stage its
// running time (at most its total).
func (s *Stage) value(now time.Time) int64 {
	if s.unit.kind == timeKind {
		v := int64(now.Sub(s.start))
		if t := s.total.Load(); t > 0 {
			v = min(v, t)
		}
		return v
	}
	return s.done.Load()
}

// sample records the count at now in the moving window (d.mu held).
func (s *Stage) sample(now time.Time) {
	if len(s.samples) == 0 {
		s.samples = append(s.samples, sample{s.start, 0})
	}
	s.samples = append(s.samples, sample{now, s.value(now)})
	w := s.d.opts.Window
	i := 0
	for i+1 < len(s.samples)-1 && !s.samples[i+1].at.After(now.Add(-w)) {
		i++
	}
	s.samples = s.samples[i:]
}

// rate is units per second over the moving window (over the whole stage
// before the first sample), 0 when nothing moved.
func (s *Stage) rate(now time.Time) float64 {
	from := sample{s.start, 0}
	if len(s.samples) > 0 {
		from = s.samples[0]
	}
	dt := now.Sub(from.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return max(0, float64(s.value(now)-from.done)/dt)
}

// eta is the time left at the window's rate; ok is false when it cannot
// be told (no total, or nothing done lately).
func (s *Stage) eta(now time.Time) (time.Duration, bool) {
	total, v := s.total.Load(), s.value(now)
	if total <= 0 || v >= total {
		return 0, false
	}
	if s.unit.kind == timeKind {
		return time.Duration(total - v), true
	}
	r := s.rate(now)
	if r <= 0 {
		return 0, false
	}
	return time.Duration(float64(total-v) / r * float64(time.Second)), true
}

// countsKey is the counts as text: a plain line is written only when it
// changed (or after a long while).
func (s *Stage) countsKey() string {
	var b strings.Builder
	if s.unit.kind != timeKind {
		b.WriteString(strconv.FormatInt(s.done.Load(), 10))
	}
	for _, c := range s.counters {
		fmt.Fprintf(&b, " %d", c.n.Load())
	}
	return b.String()
}

// amount is "done/total unit", or "done unit" without a total.
func (s *Stage) amount(now time.Time) string {
	v, total := s.value(now), s.total.Load()
	switch s.unit.kind {
	case bytesKind:
		if total > 0 {
			return formatBytesOf(v, total)
		}
		return formatBytesOf(v, v)
	case timeKind:
		if total > 0 {
			return formatDuration(time.Duration(v)) + "/" + formatDuration(time.Duration(total))
		}
		return formatDuration(time.Duration(v))
	}
	if total > 0 {
		return fmt.Sprintf("%d/%d %s", v, total, s.unit.noun)
	}
	return fmt.Sprintf("%d %s", v, s.unit.noun)
}

// counterSegments are the counters' pieces: "120/272 tensors", "3 failed"
// (warnings only when not zero, gauges not in the final line).
func (s *Stage) counterSegments(final bool) []segment {
	var out []segment
	for _, c := range s.counters {
		n := c.n.Load()
		switch {
		case c.warn && n == 0, c.gauge && final:
			continue
		case c.total > 0:
			out = append(out, segment{text: fmt.Sprintf("%d/%d %s", n, c.total, c.label)})
		default:
			out = append(out, segment{text: fmt.Sprintf("%d %s", n, c.label), warn: c.warn})
		}
	}
	return out
}

// rateText is the rate with its unit ("45.0 MiB/s", "1.9 requests/s", or
// short "1.9/s"), "" for a Time stage or no rate.
func (s *Stage) rateText(r float64, short bool) string {
	switch {
	case s.unit.kind == timeKind || r <= 0:
		return ""
	case s.unit.kind == bytesKind:
		return formatBytesOf(int64(r), int64(r)) + "/s"
	case short:
		return fmt.Sprintf("%.1f/s", r)
	}
	return fmt.Sprintf("%.1f %s/s", r, s.unit.noun)
}

// percent is the share done, -1 without a total.
func (s *Stage) percent(now time.Time) int {
	total := s.total.Load()
	if total <= 0 {
		return -1
	}
	return int(min(100, max(0, s.value(now)*100/total)))
}

// barWidth is the most characters inside a terminal line's bar; a bar
// that would have fewer than minBar is left out.
const (
	barWidth = 20
	minBar   = 8
)

// terminalSegments are s's pieces of the redrawn line, width columns at
// most where it can (the bar narrows, then goes; the rate is last, the
// first piece to be cut):
// "name [=====>     ]  35%  1.05/2.50 GiB  120/272 tensors  23s  ETA 32s  45.0 MiB/s".
func (s *Stage) terminalSegments(now time.Time, width int) []segment {
	parts := []segment{{text: s.amount(now)}}
	parts = append(parts, s.counterSegments(false)...)
	parts = append(parts, segment{text: formatDuration(now.Sub(s.start))})
	if eta, ok := s.eta(now); ok {
		parts = append(parts, segment{text: "ETA " + formatDuration(eta)})
	}
	if r := s.rateText(s.rate(now), true); r != "" {
		parts = append(parts, segment{text: r})
	}
	var rest []segment
	for _, p := range parts {
		rest = append(rest, segment{text: "  "}, p)
	}
	segs := []segment{{text: s.name}}
	if pct := s.percent(now); pct >= 0 {
		const frame = len(" [] 100%")
		if w := min(barWidth, width-s.widest()-frame); w >= minBar {
			fill := pct * w / 100
			bar := strings.Repeat("=", fill)
			if fill < w {
				bar += ">" + strings.Repeat(" ", w-fill-1)
			}
			segs = append(segs, segment{text: fmt.Sprintf(" [%s] %3d%%", bar, pct)})
		} else {
			segs = append(segs, segment{text: fmt.Sprintf("  %d%%", pct)})
		}
	}
	return append(segs, rest...)
}

// widest is the most columns s's redrawn line takes without its bar: the
// longest its counts, times and rate grow to, so that the bar's width does
// not change from one redraw to the next as the numbers do.
func (s *Stage) widest() int {
	total := s.total.Load()
	var amount string
	switch s.unit.kind {
	case bytesKind:
		amount = formatBytesOf(max(total-1, 0), total)
	case timeKind:
		amount = formatDuration(time.Duration(total)) + "/" + formatDuration(time.Duration(total))
	default:
		amount = fmt.Sprintf("%d/%d %s", total, total, s.unit.noun)
	}
	const (
		times  = len("  59m59s  ETA 59m59s")
		digits = 5 // of a count without a total
	)
	n := len([]rune(s.name)) + 2 + len([]rune(amount)) + times
	for _, c := range s.counters {
		if c.total > 0 {
			n += 2 + len([]rune(fmt.Sprintf("%d/%d %s", c.total, c.total, c.label)))
		} else {
			n += 2 + digits + 1 + len([]rune(c.label))
		}
	}
	switch s.unit.kind {
	case bytesKind:
		n += len("  999.9 MiB/s")
	case itemsKind:
		n += len("  9999.9/s")
	}
	return n
}

// plainSegments are s's plain line:
// "name: 35%, 1.05/2.50 GiB, 120/272 tensors, 23s elapsed, ETA 32s, 45.0 MiB/s".
func (s *Stage) plainSegments(now time.Time) []segment {
	var parts []segment
	if pct := s.percent(now); pct >= 0 {
		parts = append(parts, segment{text: fmt.Sprintf("%d%%", pct)})
	}
	parts = append(parts, segment{text: s.amount(now)})
	parts = append(parts, s.counterSegments(false)...)
	parts = append(parts, segment{text: formatDuration(now.Sub(s.start)) + " elapsed"})
	if eta, ok := s.eta(now); ok {
		parts = append(parts, segment{text: "ETA " + formatDuration(eta)})
	}
	if r := s.rateText(s.rate(now), false); r != "" {
		parts = append(parts, segment{text: r})
	}
	return joinSegments(s.name+": ", parts)
}

// finalSegments are s's last line: "name: 2.50/2.50 GiB, 272/272 tensors
// in 55s (45.5 MiB/s)"; the rate is the whole stage's.
func (s *Stage) finalSegments(now time.Time) []segment {
	var parts []segment
	if s.unit.kind != timeKind {
		parts = append(parts, segment{text: s.amount(now)})
	}
	parts = append(parts, s.counterSegments(true)...)
	d := now.Sub(s.start)
	tail := " in " + formatDuration(d)
	if d > 0 && s.unit.kind != timeKind {
		if r := s.rateText(float64(s.done.Load())/d.Seconds(), false); r != "" {
			tail += " (" + r + ")"
		}
	}
	segs := joinSegments(s.name+": ", parts)
	return append(segs, segment{text: tail})
}

// joinSegments is head then parts separated by ", ".
func joinSegments(head string, parts []segment) []segment {
	segs := []segment{{text: head}}
	for i, p := range parts {
		if i > 0 {
			segs = append(segs, segment{text: ", "})
		}
		segs = append(segs, p)
	}
	return segs
}
