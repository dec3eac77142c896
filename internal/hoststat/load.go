package hoststat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ParseLoadAvg reads the 1-, 5- and 15-minute load averages of a
// /proc/loadavg text.
func ParseLoadAvg(s string) (load [3]float64, ok bool) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return load, false
	}
	for i := range load {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return load, false
		}
		load[i] = v
	}
	return load, true
}

// LoadAvg reads the 1-, 5- and 15-minute load averages from /proc/loadavg.
func LoadAvg() ([3]float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return [3]float64{}, false
	}
	return ParseLoadAvg(string(b))
}

// LoadAvgText is the load averages as the reports print them, e.g. "1.20
// 0.80 0.50 (1, 5, 15 min)", or "not available".
func LoadAvgText() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "not available"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "not available"
	}
	return strings.Join(f[:3], " ") + " (1, 5, 15 min)"
}

// LoadStats is the 1-minute load average sampled over a while.
type LoadStats struct {
	Min     float64 `json:"min"`
	Mean    float64 `json:"mean"`
	Max     float64 `json:"max"`
	Samples int     `json:"samples"`
}

// String is the stats in a phrase, or "not available" without samples.
func (l LoadStats) String() string {
	if l.Samples == 0 {
		return "not available"
	}
	return fmt.Sprintf("min %.2f, mean %.2f, max %.2f (%d samples)", l.Min, l.Mean, l.Max, l.Samples)
}

// add folds one sample into l; sum is the running total for the mean.
func (l *LoadStats) add(v float64, sum *float64) {
	if l.Samples == 0 || v < l.Min {
		l.Min = v
	}
	l.Max = max(l.Max, v)
	*sum += v
	l.Samples++
	l.Mean = *sum / float64(l.Samples)
}

// LoadSampler samples the 1-minute load average in the background.
type LoadSampler struct {
	done  chan struct{}
	stats chan LoadStats
}

// StartLoadSampler samples the load average now and every period until
// Stop.
func StartLoadSampler(period time.Duration) *LoadSampler {
	ls := &LoadSampler{done: make(chan struct{}), stats: make(chan LoadStats, 1)}
	go func() {
		var st LoadStats
		var sum float64
		sample := func() {
			if v, ok := LoadAvg(); ok {
				st.add(v[0], &sum)
			}
		}
		sample()
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				sample()
			case <-ls.done:
				sample()
				ls.stats <- st
				return
			}
		}
	}()
	return ls
}

// Stop takes a last sample, ends the sampling and returns the stats.
func (ls *LoadSampler) Stop() LoadStats {
	close(ls.done)
	return <-ls.stats
}
