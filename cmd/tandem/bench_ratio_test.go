package main

import (
	"math"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
)

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	const stat = "cpu  100 5 50 800 20 3 2 10 40 0\ncpu0 50 2 25 400 10 1 1 5 20 0\nintr 1\n"
	busy, total, ok := parseProcStat(stat)
	if !ok || busy != 170 || total != 990 {
		t.Errorf("parseProcStat = %d busy of %d (ok %v), want 170 of 990 (guest time is in user already)", busy, total, ok)
	}
	if _, _, ok := parseProcStat("intr 1\n"); ok {
		t.Error("a file without the cpu line parsed")
	}
}

func TestParsePIDStatCountsFromTheLastParenthesis(t *testing.T) {
	// A command name with spaces and a ')' of its own.
	const stat = "4242 (tandem (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 123 45 0 0 20 0 9 0 100 1000 200 18446744073709551615"
	if ticks, ok := parsePIDStat(stat); !ok || ticks != 168 {
		t.Errorf("parsePIDStat = %d (ok %v), want utime 123 + stime 45", ticks, ok)
	}
	if _, ok := parsePIDStat("4242 (short) S 1"); ok {
		t.Error("a truncated stat parsed")
	}
}

func TestHostWatchWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	h := &hostWatch{proxyPID: 7}
	h.prev = cpuSample{at: t0, busy: 0, total: 0, hostOK: true, proxy: 0, proxyOK: true, proxyPID: 7}
	// Two seconds, 2 cores (200 jiffies a second): 50% then 100% busy;
	// the proxy uses 0.5 then 1.5 cores, this process 0.1 each second.
	h.add(cpuSample{at: t0.Add(time.Second), busy: 100, total: 200, hostOK: true, proxy: 50, proxyOK: true, proxyPID: 7, self: 10, load1: 1.5, loadKnown: true})
	h.add(cpuSample{at: t0.Add(2 * time.Second), busy: 300, total: 400, hostOK: true, proxy: 200, proxyOK: true, proxyPID: 7, self: 20, load1: 2.5, loadKnown: true})
	st := h.win
	s := h.sums
	st.Seconds, st.Busy, st.Proxy, st.Self = s.wall, s.busy/s.total, s.proxy/s.wall, s.self/s.wall
	want := hostStats{Seconds: 2, Busy: 0.75, BusyPeak: 1, Proxy: 1, ProxyPeak: 1.5, Self: 0.1, SelfPeak: 0.1, Load: 2.5}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"seconds", st.Seconds, want.Seconds}, {"busy", st.Busy, want.Busy}, {"busy peak", st.BusyPeak, want.BusyPeak},
		{"proxy", st.Proxy, want.Proxy}, {"proxy peak", st.ProxyPeak, want.ProxyPeak}, {"self", st.Self, want.Self},
		{"self peak", st.SelfPeak, want.SelfPeak}, {"load", st.Load, want.Load}} {
		if math.Abs(f.got-f.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if st.saturated() {
		t.Error("75% busy counted as saturated")
	}
	if !(hostStats{Busy: 0.9}).saturated() {
		t.Error("90% busy not counted as saturated")
	}
	// A new proxy's counters do not subtract from the old one's.
	h.add(cpuSample{at: t0.Add(3 * time.Second), busy: 300, total: 600, hostOK: true, proxy: 5, proxyOK: true, proxyPID: 8, self: 20})
	if h.sums.proxy != 2 {
		t.Errorf("proxy CPU %v after a new proxy, want the old 2 core-seconds", h.sums.proxy)
	}
}

func TestScaleCheckScalesEveryRateOnce(t *testing.T) {
	m := &bench.PDModel{Workload: "chat", PrefillRate: 2, DecodeRate: 2}
	pts := []bench.RatioPoint{
		{P: 4, D: 4, Predicted: 8, Measured: 6, FirstMiss: 7, Bound: "search", Points: []bench.SearchPoint{{Rate: 6, Goodput: 5.5}}},
		{P: 5, D: 3, Predicted: 6, Measured: 4, FirstMiss: 5, Bound: "search"},
	}
	c := scaleCheck(bench.NewRatioCheck(m, 8, pts), 0.5)
	if c.Predicted.Goodput != 4 || c.Curve[3].Goodput != 4 || c.Splits[0].Measured != 3 || c.Splits[0].Predicted != 4 ||
		c.Splits[0].Points[0].Rate != 3 || c.Best.Measured != 3 || c.Best.Points[0].Rate != 3 || c.PredictedMeasured != 3 {
		t.Errorf("scaled check %+v", c)
	}
	if pts[0].Points[0].Rate != 6 {
		t.Error("scaling changed the caller's points")
	}
}
