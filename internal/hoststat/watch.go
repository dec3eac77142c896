package hoststat

import (
	"fmt"
	"math"
	"os"
	"sync"
	"time"
)

// Stats is what the host did over a window: the mean busy fraction of the
// machine's cores (/proc/stat) and its highest one-period value, the mean
// CPU (in cores) of the watched process and of this one, their highest
// one-period values, and the highest 1-minute load average.
type Stats struct {
	Seconds  float64 `json:"seconds"`
	Busy     float64 `json:"cores_busy"`
	BusyPeak float64 `json:"cores_busy_peak"`
	Proc     float64 `json:"proc_cores"`
	ProcPeak float64 `json:"proc_cores_peak"`
	Self     float64 `json:"self_cores"`
	SelfPeak float64 `json:"self_cores_peak"`
	Load     float64 `json:"load1_max"`
	// ProcName and SelfName label the two processes in String.
	ProcName string `json:"-"`
	SelfName string `json:"-"`
}

// Saturated says the host was near its limit: its cores at least 85% busy
// on average over the window.
func (h Stats) Saturated() bool { return h.Busy >= 0.85 }

// Max is the larger of each of h's and o's values, over both windows.
func (h Stats) Max(o Stats) Stats {
	return Stats{Seconds: h.Seconds + o.Seconds, Busy: math.Max(h.Busy, o.Busy), BusyPeak: math.Max(h.BusyPeak, o.BusyPeak),
		Proc: math.Max(h.Proc, o.Proc), ProcPeak: math.Max(h.ProcPeak, o.ProcPeak), Self: math.Max(h.Self, o.Self),
		SelfPeak: math.Max(h.SelfPeak, o.SelfPeak), Load: math.Max(h.Load, o.Load),
		ProcName: cmpOr(h.ProcName, o.ProcName), SelfName: cmpOr(h.SelfName, o.SelfName)}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// String is the stats in a phrase, e.g. "cores 80% busy (peak 95%), proxy
// 0.40 core (peak 0.60), bench 0.10 core (peak 0.20), load ≤ 2.5".
func (h Stats) String() string {
	if h.Seconds == 0 {
		return "not measured"
	}
	return fmt.Sprintf("cores %.0f%% busy (peak %.0f%%), %s %.2f core (peak %.2f), %s %.2f core (peak %.2f), load ≤ %.1f",
		100*h.Busy, 100*h.BusyPeak, cmpOr(h.ProcName, "process"), h.Proc, h.ProcPeak, cmpOr(h.SelfName, "self"), h.Self, h.SelfPeak, h.Load)
}

// sample is one reading of the host's and two processes' CPU counters.
type sample struct {
	at                time.Time
	busy, total       uint64 // /proc/stat jiffies, all cores
	proc, self        uint64 // utime + stime ticks
	procOK            bool
	procPID           int
	load1             float64
	hostOK, loadKnown bool
}

// Watch samples the host, this process and one other process every period
// and sums the samples into windows that Mark ends.
type Watch struct {
	selfName string

	mu       sync.Mutex
	procName string
	procPID  int
	prev     sample
	win      Stats
	sums     struct{ busy, total, proc, self, wall float64 }
	done     chan struct{}
	wg       sync.WaitGroup
}

// StartWatch starts sampling every period; selfName labels this process in
// the stats (e.g. "bench", the load generator).
func StartWatch(period time.Duration, selfName string) *Watch {
	h := &Watch{selfName: selfName, done: make(chan struct{})}
	h.prev = h.read()
	h.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				h.mu.Lock()
				h.add(h.read())
				h.mu.Unlock()
			case <-h.done:
				return
			}
		}
	})
	return h
}

// Stop ends the sampling.
func (h *Watch) Stop() { close(h.done); h.wg.Wait() }

// SetProcess watches process pid, labelled name, from now on.
func (h *Watch) SetProcess(name string, pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.procName, h.procPID = name, pid
	h.prev = h.read()
}

// Mark ends the current window, returning its stats, and starts the next.
func (h *Watch) Mark() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.add(h.read())
	return h.take()
}

// take returns the window's stats and starts the next one.
func (h *Watch) take() Stats {
	st := h.win
	st.ProcName, st.SelfName = h.procName, h.selfName
	if s := h.sums; s.wall > 0 {
		st.Seconds = s.wall
		if s.total > 0 {
			st.Busy = s.busy / s.total
		}
		st.Proc, st.Self = s.proc/s.wall, s.self/s.wall
	}
	h.win, h.sums.busy, h.sums.total, h.sums.proc, h.sums.self, h.sums.wall = Stats{}, 0, 0, 0, 0, 0
	return st
}

// add folds the interval from the previous sample to s into the window.
func (h *Watch) add(s sample) {
	p := h.prev
	h.prev = s
	dt := s.at.Sub(p.at).Seconds()
	if dt <= 0 {
		return
	}
	h.sums.wall += dt
	if s.hostOK && p.hostOK && s.total > p.total {
		busy, total := float64(s.busy-p.busy), float64(s.total-p.total)
		h.sums.busy += busy
		h.sums.total += total
		h.win.BusyPeak = math.Max(h.win.BusyPeak, busy/total)
	}
	if s.procOK && p.procOK && s.procPID == p.procPID && s.proc >= p.proc {
		c := float64(s.proc-p.proc) / UserHZ
		h.sums.proc += c
		h.win.ProcPeak = math.Max(h.win.ProcPeak, c/dt)
	}
	if s.self >= p.self {
		c := float64(s.self-p.self) / UserHZ
		h.sums.self += c
		h.win.SelfPeak = math.Max(h.win.SelfPeak, c/dt)
	}
	if s.loadKnown {
		h.win.Load = math.Max(h.win.Load, s.load1)
	}
}

func (h *Watch) read() sample {
	s := sample{at: time.Now(), procPID: h.procPID}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy, s.total, s.hostOK = ParseStat(string(b))
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		s.self, _ = ParsePIDStat(string(b))
	}
	if h.procPID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.procPID)); err == nil {
			s.proc, s.procOK = ParsePIDStat(string(b))
		}
	}
	var load [3]float64
	load, s.loadKnown = LoadAvg()
	s.load1 = load[0]
	return s
}
