package sample

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// stopResult is what a whole generation looks like through a StopChecker.
type stopResult struct {
	Text    string
	Stopped bool
	Matched string
}

// runStop pushes pieces and checks that no text after a stop is emitted and
// that Flush completes the text.
func runStop(t *testing.T, c *StopChecker, pieces []string) stopResult {
	t.Helper()
	var b strings.Builder
	var r stopResult
	for _, p := range pieces {
		emit, stopped, matched := c.Push(p)
		if r.Stopped && emit != "" {
			t.Fatalf("emitted %q after stopping", emit)
		}
		b.WriteString(emit)
		if stopped {
			r.Stopped, r.Matched = true, matched
		}
	}
	b.WriteString(c.Flush())
	r.Text = b.String()
	return r
}

// splits returns every way to cut s into two and three pieces, plus one piece
// per byte.
func splits(s string) [][]string {
	out := [][]string{{s}}
	for i := 0; i <= len(s); i++ {
		out = append(out, []string{s[:i], s[i:]})
		for j := i; j <= len(s); j++ {
			out = append(out, []string{s[:i], s[i:j], s[j:]})
		}
	}
	var bytes []string
	for i := range len(s) {
		bytes = append(bytes, s[i:i+1])
	}
	return append(out, bytes)
}

func TestStopCheckerAcrossEverySplit(t *testing.T) {
	tests := []struct {
		name        string
		stop        []string
		includeStop bool
		text        string
		want        stopResult
	}{
		{"no stop strings pass text through", nil, false, "hello world", stopResult{Text: "hello world"}},
		{"text without a stop is all emitted", []string{"STOP"}, false, "a STO b ST", stopResult{Text: "a STO b ST"}},
		{"stop in the middle truncates", []string{"STOP"}, false, "abc STOP def", stopResult{"abc ", true, "STOP"}},
		{"includeStop keeps the stop string", []string{"STOP"}, true, "abc STOP def", stopResult{"abc STOP", true, "STOP"}},
		{"stop at the start", []string{"ab"}, false, "abab", stopResult{"", true, "ab"}},
		{"a false start then the stop", []string{"aab"}, false, "xaaab!", stopResult{"xa", true, "aab"}},
		{"the stop completed first wins", []string{"world", "lo"}, false, "hello world", stopResult{"hel", true, "lo"}},
		{"a shorter stop inside a longer one completes first", []string{"abc", "b"}, false, "xabcd", stopResult{"xa", true, "b"}},
		{"a prefix stop completes before its extension", []string{"abc", "ab"}, true, "xabcd", stopResult{"xab", true, "ab"}},
		{"of two stops ending together the longer wins", []string{"b", "ab"}, false, "xab", stopResult{"x", true, "ab"}},
		{"multi-byte text and stop", []string{"é!"}, false, "café! non", stopResult{"caf", true, "é!"}},
		{"newline stop", []string{"\n\n"}, false, "line one\nline two\n\nthree", stopResult{"line one\nline two", true, "\n\n"}},
		{"a stop prefix at the end is flushed", []string{"END"}, false, "the EN", stopResult{Text: "the EN"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range splits(tc.text) {
				got := runStop(t, NewStopChecker(tc.stop, tc.includeStop), pieces)
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("pieces %q (-want +got):\n%s", pieces, diff)
				}
			}
		})
	}
}

func TestStopCheckerHoldsBackOnlyPossibleStarts(t *testing.T) {
	c := NewStopChecker([]string{"</s>", "###"}, false)
	steps := []struct {
		push, emit string
	}{
		{"Hello <", "Hello "},
		{"b>", "<b>"},
		{" #", " "},
		{"#", ""},
		{"x</", "##x"},
		{"s", ""},
		{"x", "</sx"},
	}
	for i, s := range steps {
		emit, stopped, _ := c.Push(s.push)
		if emit != s.emit || stopped {
			t.Fatalf("step %d Push(%q) = %q, %v; want %q, false", i, s.push, emit, stopped, s.emit)
		}
	}
	if got := c.Flush(); got != "" {
		t.Errorf("Flush = %q, want empty", got)
	}
}

func TestStopCheckerAfterStop(t *testing.T) {
	c := NewStopChecker([]string{"x"}, false)
	c.Push("axb")
	emit, stopped, matched := c.Push("more")
	if emit != "" || !stopped || matched != "x" {
		t.Errorf("Push after stop = %q, %v, %q; want \"\", true, \"x\"", emit, stopped, matched)
	}
	if got := c.Flush(); got != "" {
		t.Errorf("Flush after stop = %q", got)
	}
	if ok, m := c.Stopped(); !ok || m != "x" {
		t.Errorf("Stopped = %v, %q", ok, m)
	}
}

// FuzzStopChecker checks that how text is split into pieces never changes
// what is emitted, and that the result agrees with a search of the whole
// text.
func FuzzStopChecker(f *testing.F) {
	f.Add("hello world\n\nbye", "\n\n", "wor", 3, 9, false)
	f.Add("aaab", "aab", "b", 1, 2, true)
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, cut1, cut2 int, include bool) {
		stops := []string{stop1, stop2}
		whole := runStop(t, NewStopChecker(stops, include), []string{text})
		i := min(max(cut1, 0), len(text))
		j := min(max(cut2, i), len(text))
		split := runStop(t, NewStopChecker(stops, include), []string{text[:i], text[i:j], text[j:]})
		if whole != split {
			t.Fatalf("whole %+v, split at %d,%d %+v", whole, i, j, split)
		}
		// Reference: the byte-wise first completed match; on a tie the
		// longer stop (then the first listed).
		at, which := -1, ""
	scan:
		for end := 1; end <= len(text); end++ {
			for start := 0; start < end; start++ {
				for _, s := range stops {
					if s != "" && text[start:end] == s {
						at, which = start, s
						break scan
					}
				}
			}
		}
		want := stopResult{Text: text}
		if at >= 0 {
			want = stopResult{Text: text[:at], Stopped: true, Matched: which}
			if include {
				want.Text += which
			}
		}
		if whole != want {
			t.Fatalf("got %+v, want %+v", whole, want)
		}
	})
}
