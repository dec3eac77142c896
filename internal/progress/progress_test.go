package progress

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// work adds one item every 100ms, 50ms off the tick, n times.
func work(s *Stage, n int) {
	time.Sleep(50 * time.Millisecond)
	for range n {
		s.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

func TestPlainLinesEveryPeriodWithRateAndETA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Every: 5 * time.Second})
		s := d.Start("work", 100, Items("items"))
		failed := s.Warning("failed")
		work(s, 100)
		failed.Add(2)
		s.Done()
		want := "work: 50%, 50/100 items, 5.0s elapsed, ETA 5.0s, 10.0 items/s\n" +
			"work: 100/100 items, 2 failed in 10s (10.0 items/s)\n"
		if got := out.String(); got != want {
			t.Errorf("output:\n%s\nwant:\n%s", got, want)
		}
	})
}

func TestPlainStageWithoutMovementIsQuietButAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Every: time.Second})
		s := d.Start("stuck", 10, Items("items"))
		s.Add(1)
		time.Sleep(30*time.Second + time.Millisecond)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		// One line when the count moved (1s), then one at 12 periods
		// without movement (13s) and another (25s).
		if len(lines) != 3 {
			t.Errorf("%d lines in 30s of no movement, want 3:\n%s", len(lines), out.String())
		}
		s.Done()
	})
}

func TestTerminalRedrawsInPlaceAndLeavesTheFinalLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Terminal: true, Width: func() int { return 120 }})
		s := d.Start("quantize", 4<<20, Bytes)
		tensors := s.Counter("tensors", 4)
		time.Sleep(50 * time.Millisecond)
		for range 4 {
			time.Sleep(time.Second)
			s.Add(1 << 20)
			tensors.Add(1)
			if tensors.n.Load() == 2 {
				time.Sleep(200 * time.Millisecond) // past the redraw at 2.2s
				got := out.String()
				if strings.Contains(got, "\n") {
					t.Fatalf("a newline before the stage ended: %q", got)
				}
				last := got[strings.LastIndex(got, "\r")+1:]
				want := "quantize [==========>         ]  50%  2.0/4.0 MiB  2/4 tensors  2.2s  ETA 2.2s  930.9 KiB/s\x1b[K"
				if last != want {
					t.Errorf("line on screen:\n%q\nwant\n%q", last, want)
				}
			}
		}
		s.Done()
		got := out.String()
		if !strings.HasSuffix(got, "\r\x1b[Kquantize: 4.0 MiB, 4/4 tensors in 4.2s (963.8 KiB/s)\n") {
			t.Errorf("final line: %q", got[max(0, len(got)-120):])
		}
		if n := strings.Count(got, "\n"); n != 1 {
			t.Errorf("%d newlines, want 1 (the final line)", n)
		}
	})
}

func TestTerminalLineIsCutToTheWidth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Terminal: true, Width: func() int { return 30 }})
		s := d.Start("a-long-stage-name", 100, Items("requests"))
		s.Add(10)
		time.Sleep(250 * time.Millisecond)
		got := out.String()
		line := strings.TrimSuffix(got[strings.LastIndex(got, "\r")+1:], "\x1b[K")
		if len([]rune(line)) != 29 {
			t.Errorf("line %q is %d characters, want 29 (width 30 less one)", line, len([]rune(line)))
		}
		s.Done()
	})
}

func TestWriterLiftsTheLineOffTheScreen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Terminal: true})
		s := d.Start("load", 10, Items("files"))
		s.Add(3)
		time.Sleep(250 * time.Millisecond)
		before := len(out.String())
		fmt.Fprintf(d.Writer(), "warning: something\n")
		got := out.String()[before:]
		if !strings.HasPrefix(got, "\r\x1b[Kwarning: something\n\rload [") {
			t.Errorf("after a log line: %q, want the line erased, the text, then the line redrawn", got)
		}
		s.Done()
	})
}

func TestColourOnlyForWarningsAndOnlyWhenAsked(t *testing.T) {
	for _, color := range []bool{false, true} {
		t.Run(fmt.Sprintf("color=%v", color), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out testutil.SyncBuffer
				d := NewWriter(&out, Options{Terminal: true, Color: color})
				s := d.Start("bench", 10, Items("requests"))
				s.Warning("failed").Add(1)
				s.Done()
				if got := strings.Contains(out.String(), "\x1b[31m1 failed\x1b[0m"); got != color {
					t.Errorf("red failures: %v, want %v: %q", got, color, out.String())
				}
			})
		})
	}
}

func TestStagesShorterThanTheDelayShowNothing(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		t.Run(fmt.Sprintf("terminal=%v", terminal), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out testutil.SyncBuffer
				d := NewWriter(&out, Options{Terminal: terminal, Delay: 2 * time.Second})
				s := d.Start("quick", 10, Bytes)
				time.Sleep(time.Second)
				s.Add(10)
				s.Done()
				if out.String() != "" {
					t.Errorf("a quick stage wrote %q", out.String())
				}
				s = d.Start("slow", 10, Bytes)
				time.Sleep(3 * time.Second)
				s.Done()
				if !strings.Contains(out.String(), "slow: 0/10 B in 3.0s\n") {
					t.Errorf("a slow stage wrote %q", out.String())
				}
			})
		})
	}
}

func TestETAFollowsTheMovingWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Window: 10 * time.Second})
		s := d.Start("work", 1000, Items("items"))
		// 50/s for 10s, then 5/s: the window forgets the fast start.
		time.Sleep(50 * time.Millisecond)
		for range 100 {
			s.Add(5)
			time.Sleep(100 * time.Millisecond)
		}
		for range 200 {
			s.Add(1)
			time.Sleep(200 * time.Millisecond)
		}
		d.mu.Lock()
		now := time.Now()
		r := s.rate(now)
		eta, ok := s.eta(now)
		d.mu.Unlock()
		if r < 4.5 || r > 5.5 {
			t.Errorf("rate %.2f/s after 40s of 5/s, want about 5 (the window's, not the whole run's %.1f)", r, 700/50.05)
		}
		if !ok || eta < 55*time.Second || eta > 65*time.Second {
			t.Errorf("ETA %v (known %v) with 300 left at 5/s, want about 60s", eta, ok)
		}
		s.Done()
	})
}

func TestTimeStagesCountTheirOwnRunningTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Every: 10 * time.Second})
		s := d.Start("soak", int64(time.Minute), Time)
		done := s.Counter("done", 0)
		time.Sleep(500 * time.Millisecond)
		for range 60 {
			done.Add(1)
			time.Sleep(time.Second)
		}
		s.Done()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 6 {
			t.Fatalf("%d lines, want 5 periodic and the final:\n%s", len(lines), out.String())
		}
		if want := "soak: 50%, 30s/1m00s, 30 done, 30s elapsed, ETA 30s"; lines[2] != want {
			t.Errorf("line 3 %q, want %q", lines[2], want)
		}
		if want := "soak: 60 done in 1m00s"; lines[5] != want {
			t.Errorf("final %q, want %q", lines[5], want)
		}
	})
}

func TestConcurrentAddsAllCount(t *testing.T) {
	var out testutil.SyncBuffer
	d := NewWriter(&out, Options{Terminal: true})
	s := d.Start("requests", 8000, Items("requests"))
	failed := s.Warning("failed")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				s.Add(1)
				if i%100 == 0 {
					failed.Add(1)
				}
				if i%250 == 0 {
					fmt.Fprintln(d.Writer(), "a log line")
				}
			}
		})
	}
	wg.Wait()
	s.Done()
	got := out.String()
	if !strings.Contains(got, "requests: 8000/8000 requests, 80 failed in ") {
		t.Errorf("final line missing or wrong: %q", got[max(0, len(got)-200):])
	}
}

func TestNilDisplayAndStagesDoNothing(t *testing.T) {
	var d *Display
	s := d.Start("x", 1, Bytes)
	s.Add(1)
	s.SetTotal(2)
	s.Counter("c", 0).Add(1)
	s.Warning("w").Add(1)
	s.Done()
	if _, err := d.Writer().Write([]byte("x")); err != nil {
		t.Error(err)
	}
	var out bytes.Buffer
	off := NewWriter(&out, Options{Off: true})
	if off.Start("x", 1, Bytes) != nil {
		t.Error("an Off display started a stage")
	}
	fmt.Fprint(off.Writer(), "log\n")
	if out.String() != "log\n" {
		t.Errorf("an Off display's writer wrote %q, want the text as is", out.String())
	}
}

func TestFlagsResolveAgainstTerminalAndEnvironment(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	tests := []struct {
		name     string
		args     []string
		terminal bool
		env      func(string) string
		want     Options
	}{
		{"auto on a terminal redraws in colour", nil, true, env("TERM", "xterm"), Options{Terminal: true, Color: true}},
		{"auto off a terminal writes plain lines", nil, false, env(), Options{}},
		{"NO_COLOR takes the colour away", nil, true, env("NO_COLOR", "1"), Options{Terminal: true}},
		{"TERM=dumb gets plain lines", nil, true, env("TERM", "dumb"), Options{}},
		{"always redraws off a terminal", []string{"--progress=always"}, false, env(), Options{Terminal: true, Color: true}},
		{"plain writes lines on a terminal", []string{"--progress", "plain"}, true, env(), Options{}},
		{"never shows nothing", []string{"--progress=never"}, true, env(), Options{Off: true}},
		{"quiet is never", []string{"--quiet"}, true, env(), Options{Off: true}},
		{"a duration is the plain period", []string{"--progress", "10s"}, false, env(), Options{Every: 10 * time.Second}},
		{"a zero duration is never", []string{"--progress", "0"}, false, env(), Options{Off: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f Flags
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			f.Register(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got := f.options(tc.terminal, tc.env)
			got.Width = nil
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("options %+v, want %+v", got, tc.want)
			}
		})
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	(&Flags{}).Register(fs)
	if err := fs.Parse([]string{"--progress=sometimes"}); err == nil || !strings.Contains(err.Error(), "want auto, always, plain or never") {
		t.Errorf("--progress=sometimes: %v, want an error naming the modes", err)
	}
}

func TestFilesAndDevNullAreNoTerminals(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for _, x := range []*os.File{f, null} {
		if IsTerminal(x) {
			t.Errorf("%s counts as a terminal", x.Name())
		}
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{formatBytesOf(512, 512), "512 B"},
		{formatBytesOf(3<<19, 4<<20), "1.5/4.0 MiB"},
		{formatBytesOf(1<<30+1<<29, 5<<30), "1.50/5.00 GiB"},
		{formatDuration(2500 * time.Millisecond), "2.5s"},
		{formatDuration(59 * time.Second), "59s"},
		{formatDuration(65 * time.Second), "1m05s"},
		{formatDuration(2*time.Hour + 3*time.Minute), "2h03m"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestReporterOpensAStageOnTheFirstReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Every: time.Second})
		r := d.Reporter("loading", Bytes)
		report := r.Func()
		time.Sleep(time.Second) // not counted: the stage opens on the first report
		report(0, 4<<20)
		for i := range 4 {
			time.Sleep(400 * time.Millisecond)
			report(int64(i+1)<<20, 4<<20)
		}
		r.Done()
		r.Report(1, 1) // after Done: ignored
		want := "loading: 50%, 2.0/4.0 MiB, 1.0s elapsed, ETA 1.0s, 2.0 MiB/s\nloading: 4.0 MiB in 1.6s (2.5 MiB/s)\n"
		if got := out.String(); got != want {
			t.Errorf("output:\n%q\nwant\n%q", got, want)
		}
	})
	var off *Display
	if f := off.Reporter("x", Bytes).Func(); f != nil {
		t.Error("a nil Display's reporter gave a callback")
	}
	if f := NewWriter(io.Discard, Options{Off: true}).Reporter("x", Bytes).Func(); f != nil {
		t.Error("an Off Display's reporter gave a callback")
	}
}

func TestGaugesShowWhileRunningOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Every: time.Second})
		s := d.Start("bench", 10, Items("requests"))
		inflight := s.Gauge("in flight")
		inflight.Add(3)
		s.Add(1)
		time.Sleep(1500 * time.Millisecond)
		inflight.Add(-3)
		s.Done()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "3 in flight") || strings.Contains(lines[1], "in flight") {
			t.Errorf("want the gauge in the running line only:\n%s", out.String())
		}
	})
}

// TestTerminalLineNarrowsTheBarBeforeCutting: the bar takes what the line
// leaves at the widest its numbers grow to (so it keeps one width as they
// change), and goes when that is too little.
func TestTerminalLineNarrowsTheBarBeforeCutting(t *testing.T) {
	for _, tc := range []struct {
		width int
		want  string
	}{
		{120, "writing smollm2-135m (bf16) [=====>              ]  25%  64.0/256.0 MiB  1.0s  ETA 3.0s  64.0 MiB/s"},
		{100, "writing smollm2-135m (bf16) [===>          ]  25%  64.0/256.0 MiB  1.0s  ETA 3.0s  64.0 MiB/s"},
		{90, "writing smollm2-135m (bf16)  25%  64.0/256.0 MiB  1.0s  ETA 3.0s  64.0 MiB/s"},
		{80, "writing smollm2-135m (bf16)  25%  64.0/256.0 MiB  1.0s  ETA 3.0s  64.0 MiB/s"},
		{40, "writing smollm2-135m (bf16)  25%  64.0/"},
	} {
		t.Run(fmt.Sprint(tc.width), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out testutil.SyncBuffer
				d := NewWriter(&out, Options{Terminal: true, Width: func() int { return tc.width }})
				s := d.Start("writing smollm2-135m (bf16)", 256<<20, Bytes)
				time.Sleep(900 * time.Millisecond)
				s.Add(64 << 20)
				time.Sleep(150 * time.Millisecond) // past the redraw at 1s
				got := out.String()
				line := strings.TrimSuffix(got[strings.LastIndex(got, "\r")+1:], "\x1b[K")
				if line != tc.want {
					t.Errorf("width %d:\n%q\nwant\n%q", tc.width, line, tc.want)
				}
				s.Done()
			})
		})
	}
}

func TestAnOpenLogLineHoldsTheProgressBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Terminal: true})
		s := d.Start("load", 10, Items("files"))
		time.Sleep(250 * time.Millisecond)
		fmt.Fprint(d.Writer(), "checking...")
		mark := len(out.String())
		s.Add(5)
		time.Sleep(time.Second)
		if got := out.String()[mark:]; got != "" {
			t.Errorf("progress written into an open line: %q", got)
		}
		fmt.Fprint(d.Writer(), " ok\n")
		if got := out.String()[mark:]; !strings.HasPrefix(got, " ok\n\rload  50%") && !strings.HasPrefix(got, " ok\n\rload [") {
			t.Errorf("after the line ended: %q, want it redrawn", got)
		}
		fmt.Fprint(d.Writer(), "half")
		s.Done()
		if got := out.String(); !strings.HasSuffix(got, "half\nload: 5/10 files in 1.2s (4.0 files/s)\n") {
			t.Errorf("final line after an open one: %q", got[max(0, len(got)-80):])
		}
	})
}

func TestTheBarKeepsItsWidthAsTheNumbersGrow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.SyncBuffer
		d := NewWriter(&out, Options{Terminal: true, Width: func() int { return 120 }})
		s := d.Start("bench", 1000, Items("requests"))
		failed, inflight := s.Warning("failed"), s.Gauge("in flight")
		for i := range 50 {
			s.Add(int64(i * i / 3))
			inflight.Set(int64(i % 17))
			if i == 30 {
				failed.Add(12)
			}
			time.Sleep(200 * time.Millisecond)
		}
		s.Done()
		ends := map[int]int{}
		for l := range strings.SplitSeq(out.String(), "\r") {
			if i := strings.Index(l, "]"); i > 0 {
				ends[i]++
			}
		}
		if len(ends) != 1 {
			t.Errorf("the bar ends at columns %v, want one column", ends)
		}
	})
}
