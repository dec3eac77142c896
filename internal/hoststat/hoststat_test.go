package hoststat

import (
	"math"
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	const stat = "cpu  100 5 50 800 20 3 2 10 40 0\ncpu0 50 2 25 400 10 1 1 5 20 0\nintr 1\n"
	busy, total, ok := ParseStat(stat)
	if !ok || busy != 170 || total != 990 {
		t.Errorf("ParseStat = %d busy of %d (ok %v), want 170 of 990 (guest time is in user already)", busy, total, ok)
	}
	if _, _, ok := ParseStat("intr 1\n"); ok {
		t.Error("a file without the cpu line parsed")
	}
}

func TestParsePIDStatCountsFromTheLastParenthesis(t *testing.T) {
	// A command name with spaces and a ')' of its own.
	const stat = "4242 (tandem (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 123 45 0 0 20 0 9 0 100 1000 200 18446744073709551615"
	if ticks, ok := ParsePIDStat(stat); !ok || ticks != 168 {
		t.Errorf("ParsePIDStat = %d (ok %v), want utime 123 + stime 45", ticks, ok)
	}
	if _, ok := ParsePIDStat("4242 (short) S 1"); ok {
		t.Error("a truncated stat parsed")
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := ParseVmRSS("Name:\ttandem\nVmPeak:\t  100 kB\nVmRSS:\t   2048 kB\nThreads: 4\n")
	if err != nil || got != 2048<<10 {
		t.Errorf("got %d, %v; want 2 MiB", got, err)
	}
	if _, err := ParseVmRSS("Name:\tkthreadd\n"); err == nil {
		t.Error("no VmRSS line: want an error")
	}
	if b, err := RSS(os.Getpid()); err != nil || b <= 0 {
		t.Errorf("RSS of this process: %d, %v", b, err)
	}
}

func TestParseLoadAvg(t *testing.T) {
	if got, ok := ParseLoadAvg("1.50 0.75 0.25 2/345 6789\n"); !ok || got != [3]float64{1.5, 0.75, 0.25} {
		t.Errorf("ParseLoadAvg = %v (ok %v)", got, ok)
	}
	if _, ok := ParseLoadAvg("1.50 x 0.25"); ok {
		t.Error("a bad load average parsed")
	}
	if _, ok := ParseLoadAvg(""); ok {
		t.Error("an empty file parsed")
	}
}

func TestLoadStats(t *testing.T) {
	var st LoadStats
	var sum float64
	for _, v := range []float64{2, 1, 3} {
		st.add(v, &sum)
	}
	if st != (LoadStats{Min: 1, Mean: 2, Max: 3, Samples: 3}) {
		t.Errorf("stats %+v, want min 1, mean 2, max 3 of 3", st)
	}
	if got := (LoadStats{}).String(); got != "not available" {
		t.Errorf("no samples: %q", got)
	}
	if got := StartLoadSampler(time.Hour).Stop(); got.Samples != 2 && got.Samples != 0 {
		t.Errorf("a sampler stopped at once took %d samples, want the first and the last (or none without /proc)", got.Samples)
	}
}

func TestWatchWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	h := &Watch{procPID: 7, procName: "proxy", selfName: "bench"}
	h.prev = sample{at: t0, hostOK: true, procOK: true, procPID: 7}
	// Two seconds, 2 cores (200 jiffies a second): 50% then 100% busy;
	// the process uses 0.5 then 1.5 cores, this one 0.1 each second.
	h.add(sample{at: t0.Add(time.Second), busy: 100, total: 200, hostOK: true, proc: 50, procOK: true, procPID: 7, self: 10, load1: 1.5, loadKnown: true})
	h.add(sample{at: t0.Add(2 * time.Second), busy: 300, total: 400, hostOK: true, proc: 200, procOK: true, procPID: 7, self: 20, load1: 2.5, loadKnown: true})
	st := h.take()
	want := Stats{Seconds: 2, Busy: 0.75, BusyPeak: 1, Proc: 1, ProcPeak: 1.5, Self: 0.1, SelfPeak: 0.1, Load: 2.5}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"seconds", st.Seconds, want.Seconds}, {"busy", st.Busy, want.Busy}, {"busy peak", st.BusyPeak, want.BusyPeak},
		{"proc", st.Proc, want.Proc}, {"proc peak", st.ProcPeak, want.ProcPeak}, {"self", st.Self, want.Self},
		{"self peak", st.SelfPeak, want.SelfPeak}, {"load", st.Load, want.Load}} {
		if math.Abs(f.got-f.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if got, want := st.String(), "cores 75% busy (peak 100%), proxy 1.00 core (peak 1.50), bench 0.10 core (peak 0.10), load ≤ 2.5"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if st.Saturated() {
		t.Error("75% busy counted as saturated")
	}
	if !(Stats{Busy: 0.9}).Saturated() {
		t.Error("90% busy not counted as saturated")
	}
	if h.sums.wall != 0 || h.win != (Stats{}) {
		t.Error("take did not start a new window")
	}
	// A new process's counters do not subtract from the old one's.
	h.add(sample{at: t0.Add(3 * time.Second), busy: 300, total: 600, hostOK: true, proc: 5, procOK: true, procPID: 8, self: 20})
	if h.sums.proc != 0 {
		t.Errorf("process CPU %v after a new process, want none counted", h.sums.proc)
	}
}
