package soak

import (
	"fmt"
	"time"
)

// RSSSample is one reading of an engine's resident memory.
type RSSSample struct {
	At    time.Duration `json:"at_ns"` // since the start of the soak
	Bytes int64         `json:"bytes"`
}

// Life is one incarnation of an engine: its process from start to kill (a
// restart is a new Life, since its memory starts over).
type Life struct {
	Engine  string      `json:"engine"`
	PID     int         `json:"pid"`
	Samples []RSSSample `json:"samples"`
}

// Growth compares the second half of the samples against the first: the
// first half's peak is the baseline (after warm-up the pool and caches are
// touched), and growth is how far the second half's peak rose above it.
// A leak grows without bound; a warm engine's peak holds. ok is false with
// fewer than four samples.
func (l *Life) Growth() (baseline, growth int64, ok bool) {
	n := len(l.Samples)
	if n < 4 {
		return 0, 0, false
	}
	for _, s := range l.Samples[:n/2] {
		baseline = max(baseline, s.Bytes)
	}
	var late int64
	for _, s := range l.Samples[n/2:] {
		late = max(late, s.Bytes)
	}
	return baseline, late - baseline, true
}

// Stats returns the first, last and largest sample.
func (l *Life) Stats() (first, last, peak int64) {
	if len(l.Samples) == 0 {
		return 0, 0, 0
	}
	first, last = l.Samples[0].Bytes, l.Samples[len(l.Samples)-1].Bytes
	for _, s := range l.Samples {
		peak = max(peak, s.Bytes)
	}
	return first, last, peak
}

// RSSLimit is the growth a Life may show: Fraction of its baseline, and
// never less than Slack bytes (a small engine's allocator rounds in MiBs).
type RSSLimit struct {
	Fraction float64
	Slack    int64
}

// Check says why l grew too much, or "" when it did not.
func (lim RSSLimit) Check(l *Life) string {
	base, growth, ok := l.Growth()
	if !ok {
		return ""
	}
	allowed := max(int64(lim.Fraction*float64(base)), lim.Slack)
	if growth > allowed {
		return fmt.Sprintf("%s (pid %d) RSS grew %.1f MiB over its first half's peak %.1f MiB (allowed %.1f MiB)",
			l.Engine, l.PID, mib(growth), mib(base), mib(allowed))
	}
	return ""
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
