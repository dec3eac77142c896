package tensor

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// restoreKernels puts the active kernels back after a test that calibrates.
func restoreKernels(t *testing.T) {
	prev := active.Load()
	t.Cleanup(func() { active.Store(prev) })
}

// fakeTimer returns a Measure that runs nothing and answers base scaled by
// the candidate's factor (1 when it has none), counting its calls.
func fakeTimer(factors map[string]float64, calls *int) Measure {
	return func(cand string, w Workload, _ func()) time.Duration {
		*calls++
		f, ok := factors[cand]
		if !ok {
			f = 1
		}
		return time.Duration(f * float64(time.Millisecond) * (1 + float64(w.M)/32))
	}
}

// quantTurns is how many times each quantized candidate is timed: once a
// workload, decodeRounds times on those with one activation row.
// timedCandidates is how many of a family's n candidates the calibration
// times: all, or none where there is only one (arm64's quantized kernels).
func timedCandidates(n int) int {
	if n == 1 {
		return 0
	}
	return n
}

func quantTurns() int {
	n := 0
	for _, w := range quantWorkloads {
		if w.M == 1 {
			n += decodeRounds
		} else {
			n++
		}
	}
	return n
}

func TestChooseSetKeepsCPUIDChoiceWithinMargin(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x*float64(time.Millisecond)))
		}
		return d
	}
	for _, tc := range []struct {
		name  string
		times []Timing
		want  string
	}{
		{"default fastest", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(2, 1.1, 1.5)}}, "a"},
		{"other 5% faster: kept", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(0.95, 0.95, 0.95)}}, "a"},
		{"other 25% faster: chosen", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(0.8, 0.8, 0.8)}}, "b"},
		// The geometric mean: much faster on one workload, a little slower
		// on the others still wins overall.
		{"mixed", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(0.5, 1.05, 1.05)}}, "b"},
		{"best of three", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(0.8, 0.8, 0.8)}, {"c", ms(0.6, 0.6, 0.6)}}, "c"},
		{"a missing time never wins", []Timing{{"a", ms(1, 1, 1)}, {"b", ms(0.1, 0)}}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := chooseSet("a", tc.times)
			if got != tc.want {
				t.Fatalf("chooseSet = %s (%s), want %s", got, why, tc.want)
			}
		})
	}
}

func TestChooseQuantTakesFastestAndPrefersFirstOnTie(t *testing.T) {
	d := time.Millisecond
	ws := []Workload{{Name: "prefill", DType: Q8_0, M: 32}, {Name: "decode", DType: Q8_0, M: 1}, {Name: "q6_k decode", DType: Q6_K, M: 1}}
	for _, tc := range []struct {
		name       string
		times      []Timing
		quant, row string
	}{
		{"one faster on all", []Timing{{"x", []time.Duration{2 * d, 2 * d, 2 * d}}, {"y", []time.Duration{d, d, d}}}, "y", "y"},
		{"a tie keeps the first", []Timing{{"x", []time.Duration{d, d, d}}, {"y", []time.Duration{d, d, d}}}, "x", "x"},
		// Formats without a workload of their own take the prefill's
		// choice.
		{"each faster on its own rows", []Timing{{"x", []time.Duration{d, 2 * d, 2 * d}}, {"y", []time.Duration{3 * d, d, d}}}, "x", "x,q8_0=y,q6_k=y"},
		{"one format's rows apart", []Timing{{"x", []time.Duration{d, d, 2 * d}}, {"y", []time.Duration{3 * d, 2 * d, d}}}, "x", "x,q6_k=y"},
		{"a pruned candidate is not chosen", []Timing{{"x", []time.Duration{d, 2 * d, 2 * d}}, {"y", []time.Duration{5 * d}}}, "x", "x"},
		// The AMX kernels run one row as the VNNI ones: never a decode
		// choice, however its times fall.
		{"amx prefills only", []Timing{{"x", []time.Duration{2 * d, 2 * d, 2 * d}}, {"amx", []time.Duration{d, d, d}}}, "amx", "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quant, row, why := chooseQuant(ws, tc.times)
			if quant != tc.quant || row != tc.row {
				t.Fatalf("chooseQuant = %s, %s (%s), want %s, %s", quant, row, why, tc.quant, tc.row)
			}
		})
	}
	// Workloads of one kind only choose for both.
	if quant, row, _ := chooseQuant(ws[:1], []Timing{{"x", []time.Duration{2 * d}}, {"y", []time.Duration{d}}}); quant != "y" || row != "y" {
		t.Fatalf("prefill workloads only: chose %s, %s; want y for both", quant, row)
	}
	if quant, row, _ := chooseQuant(ws[1:2], []Timing{{"x", []time.Duration{2 * d}}, {"y", []time.Duration{d}}}); quant != "y" || row != "y" {
		t.Fatalf("decode workloads only: chose %s, %s; want y for both", quant, row)
	}
}

// TestRowQuantsRoundTrip: DecodeQuantKernels' form names the kernels of
// most formats alone and the others by format, and reads back the same.
func TestRowQuantsRoundTrip(t *testing.T) {
	for _, tc := range []struct{ spec, def, want string }{
		{"a", "a", "a"},
		{"b", "a", "b"},
		{"q6_k=b", "a", "a,q6_k=b"},
		{"b,q6_k=a", "a", "b,q6_k=a"},
		{"q6_k=a,b", "a", "b,q6_k=a"}, // a bare name covers the formats not named, wherever it stands
		{"q8_0=b,q4_0=b,q5_0=b,q4_k=b", "a", "b,q6_k=a,q5_k=a"},
	} {
		names, err := parseRowQuants(tc.spec, tc.def)
		if err != nil {
			t.Fatalf("parseRowQuants(%q): %v", tc.spec, err)
		}
		if got := formatRowQuants(names); got != tc.want {
			t.Fatalf("parseRowQuants(%q, %q) written back = %q, want %q", tc.spec, tc.def, got, tc.want)
		}
	}
	for _, bad := range []string{"f32=a", "q9=a"} {
		if _, err := parseRowQuants(bad, "a"); err == nil {
			t.Fatalf("parseRowQuants(%q) accepted it", bad)
		}
	}
}

// installCountingQuants makes the quantized kernels "panels" and "rows"
// (the Go definition, each call reported to seen with its name) and "go",
// until t ends.
func installCountingQuants(t *testing.T, seen func(name string, a *qAct, w *Mat)) {
	quants := quantKernels
	t.Cleanup(func() { quantKernels = quants })
	counting := func(name string) quantKernel {
		return quantKernel{name: name, avail: true, fn: func(a *qAct, w *Mat, lo, hi int, out []float32) {
			seen(name, a, w)
			qmmGo(a, w, lo, hi, out)
		}}
	}
	quantKernels = []quantKernel{counting("panels"), counting("rows"), {name: "go", avail: true}}
}

// TestDecodeRowsRunTheirFormatsKernels: with one format's decode kernels
// chosen apart, a one-row product of that format runs them and another
// format's runs the rest's.
func TestDecodeRowsRunTheirFormatsKernels(t *testing.T) {
	restoreKernels(t)
	calls := map[string][]DType{}
	installCountingQuants(t, func(name string, _ *qAct, w *Mat) { calls[name] = append(calls[name], w.DType) })
	if _, err := Calibrate(CalibrateConfig{Override: ISAs()[0] + "/panels/rows,q6_k=panels"}); err != nil {
		t.Fatal(err)
	}
	if got := DecodeQuantKernels(); got != "rows,q6_k=panels" {
		t.Fatalf("DecodeQuantKernels = %q, want rows,q6_k=panels", got)
	}
	p := NewPool(1)
	defer p.Close()
	for _, dt := range []DType{Q8_0, Q6_K, Q4_K} {
		d := newWorkloadData([]Workload{{DType: dt, M: 1, N: 8, K: 256}})[0]
		p.MatMul(d.out, d.x, 1, d.w)
	}
	if !slices.Equal(calls["rows"], []DType{Q8_0, Q4_K}) || !slices.Equal(calls["panels"], []DType{Q6_K}) {
		t.Fatalf("one-row calls by format %v, want rows [q8_0 q4_k] and panels [q6_k]", calls)
	}
}

// TestDecodeRowsRunTheirOwnQuantKernels: with the quantized kernels chosen
// apart, a product with one activation row runs the decode choice and one
// with several the other.
func TestDecodeRowsRunTheirOwnQuantKernels(t *testing.T) {
	restoreKernels(t)
	calls := map[string][]int{}
	installCountingQuants(t, func(name string, a *qAct, _ *Mat) { calls[name] = append(calls[name], a.m) })
	if _, err := Calibrate(CalibrateConfig{Override: ISAs()[0] + "/panels/rows"}); err != nil {
		t.Fatal(err)
	}
	if QuantKernels() != "panels" || DecodeQuantKernels() != "rows" {
		t.Fatalf("quantized kernels %s, decode %s; want panels, rows", QuantKernels(), DecodeQuantKernels())
	}
	p := NewPool(1)
	defer p.Close()
	for _, m := range []int{1, 3} {
		d := newWorkloadData([]Workload{{DType: Q8_0, M: m, N: 8, K: 64}})[0]
		p.MatMul(d.out, d.x, m, d.w)
	}
	if !slices.Equal(calls["rows"], []int{1}) || !slices.Equal(calls["panels"], []int{3}) {
		t.Fatalf("calls by activation rows %v, want rows [1] and panels [3]", calls)
	}
	// One name for both runs it everywhere.
	if _, err := Calibrate(CalibrateConfig{Override: ISAs()[0] + "/rows"}); err != nil || QuantKernels() != "rows" || DecodeQuantKernels() != "rows" {
		t.Fatalf("override %s/rows: %v, quantized %s, decode %s", ISAs()[0], err, QuantKernels(), DecodeQuantKernels())
	}
}

// TestCalibrateFollowsTheTimer runs Calibrate with fake timers on the sets
// this CPU has: the set the timer makes clearly fastest becomes active.
func TestCalibrateFollowsTheTimer(t *testing.T) {
	restoreKernels(t)
	sets := ISAs()
	for _, want := range sets {
		factors := map[string]float64{want: 0.5}
		calls := 0
		c, err := Calibrate(CalibrateConfig{Measure: fakeTimer(factors, &calls)})
		if err != nil {
			t.Fatal(err)
		}
		if c.Set != want || ISA() != want || c.Source != "measured" {
			t.Fatalf("timer favouring %s: Calibrate chose %s (%s), ISA %s", want, c.Set, c.Source, ISA())
		}
		if wantCalls := timedCandidates(len(sets))*len(setWorkloads) + timedCandidates(len(availQuantNames()))*quantTurns(); calls != wantCalls {
			t.Fatalf("the timer was called %d times, want %d (every available candidate on every workload, decodeRounds turns on decode's)", calls, wantCalls)
		}
	}
	// A set only a little faster does not displace CPUID's choice.
	if len(sets) > 1 {
		calls := 0
		c, err := Calibrate(CalibrateConfig{Measure: fakeTimer(map[string]float64{sets[1]: 0.97}, &calls)})
		if err != nil {
			t.Fatal(err)
		}
		if c.Set != sets[0] {
			t.Fatalf("a 3%% faster %s displaced %s: %s", sets[1], sets[0], c.Reason)
		}
	}
	// The quantized kernels: the fastest wins whatever the margin.
	qs := availQuantNames()
	last := qs[len(qs)-1]
	calls := 0
	c, err := Calibrate(CalibrateConfig{Measure: fakeTimer(map[string]float64{last: 0.99}, &calls)})
	if err != nil {
		t.Fatal(err)
	}
	if c.Quant != last || QuantKernels() != last || c.QuantDecode != last || DecodeQuantKernels() != last {
		t.Fatalf("quantized kernels %s, decode %s (active %s, %s), want %s", c.Quant, c.QuantDecode, QuantKernels(), DecodeQuantKernels(), last)
	}
	// One faster on decode's single rows only is chosen for them alone.
	if len(qs) > 1 {
		first := qs[0]
		rowsFaster := func(cand string, w Workload, _ func()) time.Duration {
			if cand == last && w.M == 1 {
				return time.Millisecond / 2
			}
			return time.Millisecond
		}
		c, err := Calibrate(CalibrateConfig{Measure: rowsFaster})
		if err != nil {
			t.Fatal(err)
		}
		if c.Quant != first || c.QuantDecode != last || QuantKernels() != first || DecodeQuantKernels() != last {
			t.Fatalf("quantized kernels %s, decode %s (active %s, %s), want %s, %s", c.Quant, c.QuantDecode, QuantKernels(), DecodeQuantKernels(), first, last)
		}
	}
}

func TestCalibrateCachesPerBuild(t *testing.T) {
	restoreKernels(t)
	dir := t.TempDir()
	want := ISAs()[len(ISAs())-1]
	calls := 0
	first, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: "b1", Measure: fakeTimer(map[string]float64{want: 0.5}, &calls)})
	if err != nil || first.Set != want {
		t.Fatalf("first calibration: %+v, %v; want set %s", first, err, want)
	}
	// Same build: the cache answers, the timer is not consulted, even if
	// it would now choose otherwise.
	if err := SetISA(ISAs()[0]); err != nil {
		t.Fatal(err)
	}
	calls = 0
	second, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: "b1", Measure: fakeTimer(nil, &calls)})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 0 || second.Source != "cache" || second.Set != want || ISA() != want {
		t.Fatalf("second calibration: %d timer calls, source %s, set %s, ISA %s; want 0, cache, %s", calls, second.Source, second.Set, ISA(), want)
	}
	// A new build measures again.
	third, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: "b2", Measure: fakeTimer(nil, &calls)})
	if err != nil || third.Source != "measured" || calls == 0 {
		t.Fatalf("new build: source %s, %d calls, %v; want a measurement", third.Source, calls, err)
	}
	// A corrupt cache file is ignored, not an error.
	files, _ := filepath.Glob(filepath.Join(dir, "kernels-*.json"))
	if len(files) != 2 {
		t.Fatalf("cache files %v, want one per build", files)
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("{not json"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	calls = 0
	if c, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: "b1", Measure: fakeTimer(nil, &calls)}); err != nil || c.Source != "measured" {
		t.Fatalf("corrupt cache: %+v, %v; want a measurement", c, err)
	}
}

func TestCalibrationCacheIsBounded(t *testing.T) {
	restoreKernels(t)
	dir := t.TempDir()
	now := time.Now()
	put := func(name string, unused time.Duration) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-unused), now.Add(-unused)); err != nil {
			t.Fatal(err)
		}
	}
	recent := func(i int) string { return fmt.Sprintf("kernels-recent%02d.json", i) }
	check := func(when string, want ...string) {
		t.Helper()
		left, _ := filepath.Glob(filepath.Join(dir, "kernels-*.json"))
		for i, w := range want {
			want[i] = filepath.Join(dir, w)
		}
		slices.Sort(left)
		slices.Sort(want)
		if !slices.Equal(left, want) {
			t.Fatalf("%s, the cache holds %v, want %v", when, left, want)
		}
	}
	calibrate := func(build string) Calibration {
		t.Helper()
		calls := 0
		c, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: build, Measure: fakeTimer(nil, &calls)})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	b1 := filepath.Base(cachePath(dir, cacheKey("b1")))
	b2 := filepath.Base(cachePath(dir, cacheKey("b2")))

	// Other builds' files: 20 used within the last day, 3 unused for
	// over a month, and a file that is not the cache's.
	for i := range 20 {
		put(recent(i), time.Duration(i+1)*time.Hour)
	}
	for i := range 3 {
		put(fmt.Sprintf("kernels-old%d.json", i), cacheMaxAge+time.Duration(i+1)*time.Hour)
	}
	put("notes.json", 2*cacheMaxAge)
	calibrate("b1")
	want := []string{b1}
	for i := range 20 {
		want = append(want, recent(i))
	}
	check("after storing among 23 others", want...)
	if _, err := os.Stat(filepath.Join(dir, "notes.json")); err != nil {
		t.Fatalf("a file that is not the cache's went: %v", err)
	}

	// Past cacheMaxFiles, the least recently used go.
	for i := 20; i < 40; i++ {
		put(recent(i), time.Duration(i+1)*time.Hour)
	}
	calibrate("b2")
	want = []string{b2, b1} // b1 was written this test, the most recent
	for i := range cacheMaxFiles - 2 {
		want = append(want, recent(i))
	}
	check("after storing among 41 others", want...)

	// A hit marks its file used, so that it outlives others of its age.
	mine := filepath.Join(dir, b1)
	old := now.Add(-cacheMaxAge + time.Hour)
	if err := os.Chtimes(mine, old, old); err != nil {
		t.Fatal(err)
	}
	if c := calibrate("b1"); c.Source != "cache" {
		t.Fatalf("second start of b1: %+v; want the cache's answer", c)
	}
	if st, err := os.Stat(mine); err != nil || !st.ModTime().After(old.Add(time.Hour)) {
		t.Fatalf("the cache file read was not marked used: %v, %v", st, err)
	}
}

func TestCalibrateOverride(t *testing.T) {
	restoreKernels(t)
	never := func(string, Workload, func()) time.Duration { t.Fatal("an override measured"); return 0 }
	last := ISAs()[len(ISAs())-1]
	c, err := Calibrate(CalibrateConfig{Override: last, Measure: never})
	if err != nil || c.Set != last || ISA() != last || c.Source != "override" {
		t.Fatalf("override %s: %+v, %v, ISA %s", last, c, err, ISA())
	}
	if _, err := Calibrate(CalibrateConfig{Override: "cpuid", Measure: never}); err != nil || ISA() != ISAs()[0] {
		t.Fatalf("override cpuid: %v, ISA %s, want %s", err, ISA(), ISAs()[0])
	}
	if _, err := Calibrate(CalibrateConfig{Override: ISAs()[0] + "/go", Measure: never}); err != nil || QuantKernels() != "go" || DecodeQuantKernels() != "go" {
		t.Fatalf("override %s/go: %v, quantized %s, decode %s", ISAs()[0], err, QuantKernels(), DecodeQuantKernels())
	}
	qs := availQuantNames()
	c, err = Calibrate(CalibrateConfig{Override: ISAs()[0] + "/" + qs[0] + "/go", Measure: never})
	if err != nil || c.Quant != qs[0] || c.QuantDecode != "go" || QuantKernels() != qs[0] || DecodeQuantKernels() != "go" {
		t.Fatalf("override %s/%s/go: %+v, %v, quantized %s, decode %s", ISAs()[0], qs[0], c, err, QuantKernels(), DecodeQuantKernels())
	}
	for _, bad := range []string{"sse9", ISAs()[0] + "/sse9", ISAs()[0] + "/go/sse9"} {
		_, err := Calibrate(CalibrateConfig{Override: bad, Measure: never})
		if err == nil || !strings.Contains(err.Error(), "TANDEM_KERNELS") {
			t.Fatalf("override %q: error %v, want one naming TANDEM_KERNELS", bad, err)
		}
	}
}

// TestCalibrateMeasures runs the real measurement: it must choose a set
// this CPU runs, time every candidate and stay quick.
func TestCalibrateMeasures(t *testing.T) {
	if testing.Short() {
		t.Skip("times every kernel set")
	}
	restoreKernels(t)
	start := time.Now()
	c, err := Calibrate(CalibrateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ISAs(), c.Set) || len(c.SetTimes) != timedCandidates(len(ISAs())) || len(c.QuantTimes) != timedCandidates(len(availQuantNames())) {
		t.Fatalf("calibration %+v: want a set of %v and a time per candidate", c, ISAs())
	}
	for _, tm := range append(c.SetTimes, c.QuantTimes...) {
		for _, d := range tm.Times {
			if d <= 0 {
				t.Fatalf("%s: time %v", tm.Name, d)
			}
		}
	}
	t.Logf("%v: %s", time.Since(start), c.Summary())
}

// TestQuantKernelsAgreeBitForBit is what lets the calibration pick the
// quantized kernels freely: every one this CPU runs gives the same output.
func TestQuantKernelsAgreeBitForBit(t *testing.T) {
	p := NewPool(1)
	defer p.Close()
	for _, d := range []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
		for _, m := range []int{1, 3, 7} {
			data := newWorkloadData([]Workload{{DType: d, M: m, N: 24, K: 512}})[0]
			var want []float32
			for _, name := range availQuantNames() {
				ks, err := withQuant(active.Load(), name)
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(data.out))
				p.matMul(ks, out, data.x, m, data.w)
				if want == nil {
					want = out
					continue
				}
				for i := range out {
					if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s m=%d: %s gives %v at %d, %s gives %v", d, m, name, out[i], i, availQuantNames()[0], want[i])
					}
				}
			}
		}
	}
}

func TestCPUIdentityFromFirstProcessor(t *testing.T) {
	info := "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC 7B12\nstepping\t: 0\nmicrocode\t: 0x1000065\n\nprocessor\t: 1\nvendor_id\t: Other\n"
	got := cpuIdentityFrom(info)
	want := "vendor_id=AuthenticAMD,cpu family=23,model=49,stepping=0,microcode=0x1000065,model name=AMD EPYC 7B12"
	if got != want {
		t.Fatalf("cpuIdentityFrom = %q, want %q", got, want)
	}
}

func TestFormatHintSpeaksOnlyWhenQ8IsMuchFaster(t *testing.T) {
	c := Calibration{Set: "s", Quant: "q", SetWorkloads: setWorkloads, QuantWorkloads: quantWorkloads,
		SetTimes:   []Timing{{"s", []time.Duration{4 * time.Millisecond, time.Millisecond, time.Millisecond}}},
		QuantTimes: []Timing{{"q", []time.Duration{time.Millisecond, time.Millisecond}}}}
	if h := c.FormatHint(); !strings.Contains(h, "4.0x") {
		t.Fatalf("hint %q, want one saying 4.0x", h)
	}
	c.QuantTimes[0].Times[0] = 3 * time.Millisecond
	if h := c.FormatHint(); h != "" {
		t.Fatalf("hint %q at 1.3x, want none", h)
	}
}

// TestConcurrentCalibrationsShareOneMeasurement: engines starting together
// on one machine with one cache measure once and agree.
func TestConcurrentCalibrationsShareOneMeasurement(t *testing.T) {
	restoreKernels(t)
	dir := t.TempDir()
	var mu sync.Mutex // the fake timer's call counter is not concurrency safe
	calls := 0
	timer := fakeTimer(nil, &calls)
	measure := func(cand string, w Workload, run func()) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return timer(cand, w, run)
	}
	first := make(chan Calibration, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			c, err := Calibrate(CalibrateConfig{CacheDir: dir, BuildID: "b", Measure: measure})
			if err != nil {
				t.Error(err)
			}
			first <- c
		})
	}
	wg.Wait()
	close(first)
	measured := 0
	for c := range first {
		if c.Source == "measured" {
			measured++
		}
	}
	if measured != 1 {
		t.Fatalf("%d of 4 concurrent calibrations measured, want 1 (the others read its cache)", measured)
	}
}

// TestCalibrateMeasuresNothingWithOneCandidate: where only the pure-Go
// kernels run (no assembly for the architecture), there is nothing to
// choose and nothing is timed.
func TestCalibrateMeasuresNothingWithOneCandidate(t *testing.T) {
	restoreKernels(t)
	sets, quants := kernelSets, quantKernels
	t.Cleanup(func() { kernelSets, quantKernels = sets, quants })
	kernelSets, quantKernels = []*kernelSet{genericSet()}, []quantKernel{{name: "go", avail: true}}
	never := func(string, Workload, func()) time.Duration { t.Fatal("a single candidate was timed"); return 0 }
	c, err := Calibrate(CalibrateConfig{Measure: never})
	if err != nil || c.Set != "go" || c.Quant != "go" || ISA() != "go" {
		t.Fatalf("Calibrate = %+v, %v; want go and go", c, err)
	}
}

// TestCalibratePrunesFarSlowerCandidates: a candidate ten times slower than
// the preferred one on the first workload is not timed on the others, and
// is not chosen.
func TestCalibratePrunesFarSlowerCandidates(t *testing.T) {
	restoreKernels(t)
	if len(ISAs()) < 2 {
		t.Skip("one kernel set on this CPU")
	}
	slow := ISAs()[1]
	perCand := map[string]int{}
	measure := func(cand string, w Workload, run func()) time.Duration {
		if w.DType.Quantized() {
			return time.Millisecond // the quantized family: not under test
		}
		perCand[cand]++
		if cand == slow {
			return 10 * time.Millisecond
		}
		return time.Millisecond
	}
	c, err := Calibrate(CalibrateConfig{Measure: measure})
	if err != nil {
		t.Fatal(err)
	}
	if c.Set != ISAs()[0] || perCand[slow] != 1 || perCand[ISAs()[0]] != len(setWorkloads) {
		t.Fatalf("chose %s; timed %v; want %s chosen, %s timed once", c.Set, perCand, ISAs()[0], slow)
	}
}

// TestDecodeWorkloadsTakeTurnsOverARingPastTheCache: the quantized
// candidates are timed on a decode workload alternately, decodeRounds turns
// each, each keeping its fastest, over more bytes of weights than the
// last-level cache holds.
func TestDecodeWorkloadsTakeTurnsOverARingPastTheCache(t *testing.T) {
	restoreKernels(t)
	qs := availQuantNames()
	if len(qs) < 2 {
		t.Skip("one quantized kernel family on this CPU")
	}
	var order []string
	turn := map[string]int{}
	measure := func(cand string, w Workload, run func()) time.Duration {
		if !w.DType.Quantized() {
			return time.Millisecond
		}
		if w.Name == "q4_k decode" {
			order = append(order, cand)
			if turn[cand]++; turn[cand] == 1 && cand == qs[1] {
				// Its first turn was disturbed: its fastest decides.
				return 10 * time.Millisecond
			}
		}
		if cand == qs[1] && w.M == 1 {
			return time.Millisecond / 2
		}
		return time.Millisecond
	}
	c, err := Calibrate(CalibrateConfig{Measure: measure})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for range decodeRounds {
		want = append(want, qs...)
	}
	if !slices.Equal(order, want) {
		t.Errorf("q4_k decode timed in the order %v, want %v (turns in alternation)", order, want)
	}
	if got := DecodeQuantKernels(); got != qs[1] {
		t.Errorf("decode's kernels %s (%s), want %s, the fastest of its turns", got, c.Reason, qs[1])
	}
	// The ring: copies of the workload's matrix filling more than the
	// last-level cache.
	var r decodeRing
	defer r.release()
	m := randomMat(rand.New(rand.NewPCG(1, 1)), Q8_0, 64, 2048)
	mats := r.fill(m)
	total := 0
	for _, c := range mats {
		if !bytes.Equal(c.Q, m.Q) || c.Rows != m.Rows || c.Cols != m.Cols {
			t.Fatal("a ring copy differs from the matrix")
		}
		total += len(c.Q)
	}
	if llc := lastLevelCache(); total < min(2*llc, 256<<20)-len(m.Q) || total < 64<<20-len(m.Q) {
		t.Errorf("the ring holds %d bytes; the last-level cache is %d", total, llc)
	}
}

func TestParseCacheSize(t *testing.T) {
	for in, want := range map[string]int{"32768K": 32 << 20, "1M": 1 << 20, "512": 512, "": 0, "12X": 0, "-1K": 0} {
		if got := parseCacheSize(in); got != want {
			t.Errorf("parseCacheSize(%q) = %d, want %d", in, got, want)
		}
	}
}
