package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/hugemem"
)

// Kernel choice by measurement. CPUID says which kernel sets a CPU can run,
// not which is fastest on it: on one Intel Xeon the plain avx512 set
// prefilled bf16 17–29% faster than avx512bf16, on a Zen 5 the other way
// round. Calibrate times every set the CPU can run on a few representative
// products (a few milliseconds each) and keeps the fastest.
//
// Two families are chosen, independently:
//
//   - the kernel set (ISA): f32, f16 and bf16 weights, attention and the
//     element-wise kernels. Sets differ in their results (each is batch
//     invariant on its own): two engines that chose differently still
//     exchange KV (the same model's, rounded otherwise), and the decode's
//     log says that its outputs are not bit-identical to a colocated run
//     (kvxfer.Info.Kernels; TANDEM_KERNELS pins one set). To keep
//     identical machines choosing alike, a set replaces CPUID's choice
//     only when it is clearly faster (setMargin).
//   - the quantized kernels (QuantKernels): their results are the same bit
//     for bit, so the fastest wins outright and nothing else depends on it.
//     Products with one activation row (a lone sequence's decode token:
//     the weights streamed once) and those with several (prefill, batched
//     decode: arithmetic on panels) are chosen apart (DecodeQuantKernels),
//     each by its own workloads, decode's streamed from memory (see
//     timeQuants): on one Zen 4 VM the AVX2 row kernels, reading eight
//     rows side by side, streamed Q8_0 weights 18% faster than the
//     AVX512-VNNI ones, which prefilled 2.3 times as fast as AVX2's; on
//     another, with the weights in huge pages, the VNNI rows streamed
//     every format 2–75% faster.

// setMargin is how much faster (geometric mean of the time ratios) a kernel
// set must be than CPUID's choice to replace it: timing noise between two
// runs on one machine is a few percent, so a choice within it could differ
// between identical machines.
const setMargin = 0.08

// Workload is one timed product of the calibration: m activation rows times
// an n×k weight matrix of one dtype.
type Workload struct {
	Name    string
	DType   DType
	M, N, K int
}

// FLOPs is the workload's arithmetic: two per multiply-add.
func (w Workload) FLOPs() float64 { return 2 * float64(w.M) * float64(w.N) * float64(w.K) }

// setWorkloads time the kernel sets: bf16 prefill and decode (the two
// paths the issue found ordered differently by CPU) and f32 decode (the
// attention and norm kernels' family), at llama-1b's width. The decode
// matrices (8 MB) are larger than a core's L2, so they time the stream
// through the outer caches rather than the arithmetic.
var setWorkloads = []Workload{
	{Name: "bf16 prefill", DType: BF16, M: 32, N: 256, K: 2048},
	{Name: "bf16 decode", DType: BF16, M: 1, N: 2048, K: 2048},
	{Name: "f32 decode", DType: F32, M: 1, N: 1024, K: 2048},
}

// quantWorkloads time the quantized kernels: those with one activation
// row choose DecodeQuantKernels, each its format's, the others
// QuantKernels (a Q8_0 and a Q4_K product, the blocks of 32 and the
// K-quants, whose kernels differ: the AMX ones most). Each format decodes apart because the kernels' order of
// the work differs by format: on a Zen 4 the AVX2 row kernels streamed
// Q8_0 and Q4_K faster than the AVX512-VNNI ones, and Q6_K ~35% slower.
// Each format decodes two shapes of equal bytes, a projection from the
// hidden size (K = 2048) and a down projection (K = 8192): on a Zen 4 the
// AVX2 and VNNI rows tied on Q4_K at the first and the VNNI rows were 25%
// faster at the second, as they were on whole models. The decode
// workloads' matrices (1–9 MB) are copied into a ring past the last-level
// cache (decodeRing).
var quantWorkloads = []Workload{
	{Name: "q8_0 prefill", DType: Q8_0, M: 32, N: 256, K: 2048},
	{Name: "q4_k prefill", DType: Q4_K, M: 32, N: 256, K: 2048},
	{Name: "q8_0 decode", DType: Q8_0, M: 1, N: 4096, K: 2048},
	{Name: "q4_0 decode", DType: Q4_0, M: 1, N: 4096, K: 2048},
	{Name: "q5_0 decode", DType: Q5_0, M: 1, N: 4096, K: 2048},
	{Name: "q4_k decode", DType: Q4_K, M: 1, N: 4096, K: 2048},
	{Name: "q5_k decode", DType: Q5_K, M: 1, N: 4096, K: 2048},
	{Name: "q6_k decode", DType: Q6_K, M: 1, N: 4096, K: 2048},
	{Name: "q8_0 decode down", DType: Q8_0, M: 1, N: 1024, K: 8192},
	{Name: "q4_0 decode down", DType: Q4_0, M: 1, N: 1024, K: 8192},
	{Name: "q5_0 decode down", DType: Q5_0, M: 1, N: 1024, K: 8192},
	{Name: "q4_k decode down", DType: Q4_K, M: 1, N: 1024, K: 8192},
	{Name: "q5_k decode down", DType: Q5_K, M: 1, N: 1024, K: 8192},
	{Name: "q6_k decode down", DType: Q6_K, M: 1, N: 1024, K: 8192},
}

// Timing is one candidate's best time on each workload of its family, in
// the family's workload order; fewer times than workloads when it was
// pruned as far slower than the preferred candidate (see timeTurns).
type Timing struct {
	Name  string
	Times []time.Duration
}

// Calibration is what Calibrate chose and why.
type Calibration struct {
	// Set is the kernel set chosen (ISA's value afterwards), Default the
	// one CPUID picks, Quant the quantized kernels chosen for products
	// with several activation rows and QuantDecode those for one row, per
	// format in DecodeQuantKernels' form ("avx2,q6_k=avx512vnni").
	Set, Default, Quant, QuantDecode string
	// Source is "measured", "cache" (an earlier measurement on this CPU
	// model and build) or "override" (TANDEM_KERNELS).
	Source string
	// Reason says in one sentence why Set and Quant were chosen.
	Reason string
	// SetTimes and QuantTimes are the measurements behind the choice, in
	// the order of SetWorkloads and QuantWorkloads (empty for an override).
	SetTimes, QuantTimes []Timing
	// SetWorkloads and QuantWorkloads are the workloads timed.
	SetWorkloads, QuantWorkloads []Workload
}

// Measure times run, a product of workload w with candidate cand, and
// returns its duration. The default (wallClock) runs it a few times and
// returns the fastest; tests pass fake timers to check the decisions.
type Measure func(cand string, w Workload, run func()) time.Duration

// CalibrateConfig configures Calibrate.
type CalibrateConfig struct {
	// Override is TANDEM_KERNELS: "" to calibrate, "cpuid" for CPUID's
	// choice without measuring, or "SET", "SET/QUANT" (e.g.
	// "avx512/avx2") or "SET/QUANT/DECODEQUANT" to force a kernel set and
	// optionally the quantized kernels, for every product or apart for
	// products with one activation row; DECODEQUANT may name kernels per
	// format as DecodeQuantKernels does ("avx2,q6_k=avx512vnni").
	Override string
	// CacheDir, if set, holds the result per CPU model and build, so
	// that later starts reuse it (see cacheKey).
	CacheDir string
	// BuildID identifies the Tandem build: a new build calibrates again.
	BuildID string
	// Measure times the candidates; nil means wallClock.
	Measure Measure
}

// Calibrate chooses the kernel set and quantized kernels (see the comment
// at the top of this file), makes them active and returns the choice. Call
// it at start-up, before any kernel runs and before a model computes its
// fingerprint (which names the set). A cache that cannot be read or written
// is not an error: Calibrate measures and goes on.
func Calibrate(cfg CalibrateConfig) (Calibration, error) {
	def := defaultSet()
	c := Calibration{Default: def.name, SetWorkloads: setWorkloads, QuantWorkloads: quantWorkloads}
	if cfg.Override != "" {
		return c, applyOverride(&c, def, cfg.Override)
	}
	key := cacheKey(cfg.BuildID)
	if cfg.CacheDir != "" {
		defer lockCalibration(cfg.CacheDir)()
		if cached, ok := loadCalibration(cfg.CacheDir, key); ok {
			if err := apply(cached.Set, cached.Quant, cached.QuantDecode); err == nil {
				cached.Source = "cache"
				return cached, nil
			}
		}
	}
	measure := cfg.Measure
	if measure == nil {
		measure = wallClock
	}
	// A family with one candidate needs no measurement (the pure-Go
	// kernels where there is no assembly).
	c.Set, c.Quant, c.QuantDecode = def.name, def.qmmName, def.qmmName
	setWhy := fmt.Sprintf("kernel set %s (the only one)", def.name)
	quantWhy := fmt.Sprintf("quantized kernels %s (the only ones)", def.qmmName)
	if len(ISAs()) > 1 {
		c.SetTimes = timeSets(measure)
		c.Set, setWhy = chooseSet(def.name, c.SetTimes)
	}
	if len(availQuantNames()) > 1 {
		c.QuantTimes = timeQuants(measure)
		c.Quant, c.QuantDecode, quantWhy = chooseQuant(quantWorkloads, c.QuantTimes)
	}
	c.Source = "measured"
	c.Reason = setWhy + "; " + quantWhy
	if err := apply(c.Set, c.Quant, c.QuantDecode); err != nil {
		return c, err
	}
	if cfg.CacheDir != "" {
		storeCalibration(cfg.CacheDir, key, c)
	}
	return c, nil
}

// applyOverride applies TANDEM_KERNELS.
func applyOverride(c *Calibration, def *kernelSet, v string) error {
	c.Source = "override"
	set, quant, hasQuant := strings.Cut(v, "/")
	quant, row, hasRow := strings.Cut(quant, "/")
	if set == "cpuid" {
		set = def.name
	}
	if !hasQuant {
		ks, err := findSet(set)
		if err != nil {
			return fmt.Errorf("TANDEM_KERNELS=%q: %w; unset it to calibrate, or set it to \"cpuid\"", v, err)
		}
		quant = ks.qmmName
	}
	if !hasRow {
		row = quant
	}
	if err := apply(set, quant, row); err != nil {
		return fmt.Errorf("TANDEM_KERNELS=%q: %w; unset it to calibrate, or set it to \"cpuid\"", v, err)
	}
	c.Set, c.Quant, c.QuantDecode = set, quant, row
	c.Reason = fmt.Sprintf("TANDEM_KERNELS=%s", v)
	return nil
}

// defaultSet is CPUID's choice: the first set this CPU can run.
func defaultSet() *kernelSet {
	for _, ks := range kernelSets {
		if ks.avail {
			return ks
		}
	}
	panic("tensor: no kernel set available") // the go set always is
}

// findSet returns the set named name if this CPU can run it.
func findSet(name string) (*kernelSet, error) {
	for _, ks := range kernelSets {
		if ks.name == name {
			if !ks.avail {
				return nil, fmt.Errorf("tensor: ISA %q is not supported by this CPU (supported: %v)", name, ISAs())
			}
			if ks.amxBF16 {
				if err := amxBF16SelfCheck(); err != nil {
					return nil, err
				}
			}
			return ks, nil
		}
	}
	return nil, fmt.Errorf("tensor: unknown ISA %q (supported: %v)", name, ISAs())
}

// apply makes the set named set active with the quantized kernels named
// quant, and row for products with one activation row ("" means quant).
func apply(set, quant, row string) error {
	ks, err := findSet(set)
	if err != nil {
		return err
	}
	if row == "" {
		row = quant
	}
	if ks, err = withQuants(ks, quant, row); err != nil {
		return err
	}
	active.Store(ks)
	return nil
}

// chooseSet returns the fastest set by the geometric mean of its time
// ratios to def's, keeping def unless the fastest beats it by setMargin,
// and says why.
func chooseSet(def string, times []Timing) (string, string) {
	var base []time.Duration
	for _, t := range times {
		if t.Name == def {
			base = t.Times
		}
	}
	best, bestScore := def, 1.0
	for _, t := range times {
		if s := ratioScore(t.Times, base); s < bestScore {
			best, bestScore = t.Name, s
		}
	}
	if best == def {
		return def, fmt.Sprintf("kernel set %s (CPUID's choice) is the fastest", def)
	}
	if bestScore > 1/(1+setMargin) {
		return def, fmt.Sprintf("kernel set %s kept (CPUID's choice): %s is only %.0f%% faster, under the %.0f%% margin", def, best, 100*(1/bestScore-1), 100*setMargin)
	}
	return best, fmt.Sprintf("kernel set %s: %.0f%% faster than CPUID's choice %s", best, 100*(1/bestScore-1), def)
}

// ratioScore is the geometric mean of ts[i]/base[i]; +Inf when they do not
// pair up or a time is not positive.
func ratioScore(ts, base []time.Duration) float64 {
	if len(ts) == 0 || len(ts) != len(base) {
		return math.Inf(1)
	}
	var sum float64
	for i := range ts {
		if ts[i] <= 0 || base[i] <= 0 {
			return math.Inf(1)
		}
		sum += math.Log(float64(ts[i]) / float64(base[i]))
	}
	return math.Exp(sum / float64(len(ts)))
}

// chooseQuant returns the quantized kernels with the least total time on
// the workloads ws with several activation rows, and for each format
// those with the least on its workloads with one (the first listed, the
// preferred, on a tie; the several rows' choice for a format with no such
// workload, the first single-row choice if ws has no workload with
// several) in DecodeQuantKernels' form, and says why.
func chooseQuant(ws []Workload, times []Timing) (quant, row, why string) {
	quant = fastestQuant(ws, times, func(w Workload) bool { return w.M > 1 })
	// The AMX kernels run one activation row as the AVX512-VNNI ones do:
	// not a choice for decode.
	var rowTimes []Timing
	for _, t := range times {
		if t.Name != "amx" {
			rowTimes = append(rowTimes, t)
		}
	}
	var names [numDTypes]string
	for d := range numDTypes {
		if d.Quantized() {
			names[d] = fastestQuant(ws, rowTimes, func(w Workload) bool { return w.M == 1 && w.DType == d })
			if quant == "" {
				quant = names[d]
			}
		}
	}
	rowDefault := quant
	if quant == "amx" {
		rowDefault = fastestQuant(ws, rowTimes, func(w Workload) bool { return w.M > 1 })
	}
	for d := range names {
		if DType(d).Quantized() && names[d] == "" {
			names[d] = rowDefault
		}
	}
	row = formatRowQuants(names)
	if row == quant {
		return quant, row, fmt.Sprintf("quantized kernels %s (fastest of %d, same results as the others)", quant, len(times))
	}
	return quant, row, fmt.Sprintf("quantized kernels %s, %s for decode's single rows (fastest of %d on each, same results as the others)", quant, row, len(times))
}

// fastestQuant returns the candidate with the least total time on the
// workloads of ws that pick selects, among those timed on all of them
// (the first on a tie); "" if pick selects none.
func fastestQuant(ws []Workload, times []Timing, pick func(Workload) bool) string {
	var idx []int
	for i, w := range ws {
		if pick(w) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return ""
	}
	best, bestTotal := "", time.Duration(math.MaxInt64)
	for _, t := range times {
		var total time.Duration
		for _, i := range idx {
			if i >= len(t.Times) || t.Times[i] <= 0 {
				total = math.MaxInt64 // pruned: not timed here
				break
			}
			total += t.Times[i]
		}
		if total < bestTotal {
			best, bestTotal = t.Name, total
		}
	}
	return best
}

// timeSets times every available kernel set on setWorkloads.
func timeSets(measure Measure) []Timing {
	p := NewPool(1)
	defer p.Close()
	data := newWorkloadData(setWorkloads)
	var sets []*kernelSet
	var names []string
	for _, ks := range kernelSets {
		if ks.avail && (!ks.amxBF16 || amxBF16SelfCheck() == nil) {
			sets, names = append(sets, ks), append(names, ks.name)
		}
	}
	return timeTurns(measure, names, setWorkloads, func(i int) (func(c int), int) {
		d := data[i]
		return func(c int) { p.matMul(sets[c], d.out, d.x, setWorkloads[i].M, d.w) }, 1
	})
}

// timeQuants times every available quantized kernel on quantWorkloads,
// under CPUID's kernel set (the activations' quantizer is the same for all),
// workload by workload. The products with one activation row (decode) run
// over a ring of copies of their matrix larger than the last-level cache
// (see decodeRing), the candidates taking turns decodeRounds times, each
// keeping its fastest: timed in the cache, as they were before, the
// kernels' order on a Zen 4 was the opposite of a model's decode from
// memory (docs/performance-log.md, 2026-12-06 08:00).
func timeQuants(measure Measure) []Timing {
	p := NewPool(1)
	defer p.Close()
	data := newWorkloadData(quantWorkloads)
	var sets []*kernelSet
	var names []string
	for _, q := range quantKernels {
		if !q.avail {
			continue
		}
		if ks, err := withQuant(defaultSet(), q.name); err == nil {
			sets, names = append(sets, ks), append(names, q.name)
		}
	}
	ring := &decodeRing{}
	defer ring.release()
	return timeTurns(measure, names, quantWorkloads, func(i int) (func(c int), int) {
		w, d := quantWorkloads[i], data[i]
		mats, turns := []*Mat{d.w}, 1
		if w.M == 1 {
			mats, turns = ring.fill(d.w), decodeRounds
		}
		return func(c int) {
			for _, m := range mats {
				p.matMul(sets[c], d.out, d.x, w.M, m)
			}
		}, turns
	})
}

// timeTurns times the candidates names (the preferred first) on the
// workloads ws, workload by workload: setup(i) returns the run of workload
// i with candidate c and how many turns each candidate takes there, the
// candidates alternating and each keeping its fastest. The preferred
// candidate is the yardstick: one more than pruneFactor times slower on a
// workload keeps that time and is timed on nothing more (its Times stay
// short, so it cannot be chosen), which keeps the pure-Go kernels from
// taking most of the calibration.
func timeTurns(measure Measure, names []string, ws []Workload, setup func(i int) (run func(c int), turns int)) []Timing {
	out := make([]Timing, len(names))
	for c := range names {
		out[c].Name = names[c]
	}
	pruned := make([]bool, len(names))
	for i, w := range ws {
		run, turns := setup(i)
		best := make([]time.Duration, len(names))
		for t := range turns {
			for c, name := range names {
				if pruned[c] {
					continue
				}
				d := measure(name, w, func() { run(c) })
				if t == 0 || d < best[c] {
					best[c] = d
				}
			}
		}
		for c := range names {
			if !pruned[c] {
				out[c].Times = append(out[c].Times, best[c])
				pruned[c] = c > 0 && best[c] > pruneFactor*best[0]
			}
		}
	}
	return out
}

// decodeRounds is how many turns each quantized candidate takes on a
// decode workload (its fastest kept): on a shared machine the memory
// bandwidth left to this process moves over seconds, and turns taken
// alternately see the same share.
const decodeRounds = 3

// decodeRing holds copies of a decode workload's matrix, back to back in
// huge pages as a loaded model's weights are, more bytes in all than the
// last-level cache holds (ringBytes), so that a pass over them streams the
// weights from memory as a token's pass over a model does.
type decodeRing struct {
	mem  []byte
	mats []*Mat
}

// fill returns copies of m filling the ring, m itself where the ring's
// memory cannot be had or cannot hold a copy.
func (r *decodeRing) fill(m *Mat) []*Mat {
	if r.mem == nil {
		mem, err := hugemem.Map(ringBytes())
		if err != nil {
			return []*Mat{m}
		}
		r.mem = mem
	}
	n := len(m.Q)
	stride := (n + 63) &^ 63
	r.mats = r.mats[:0]
	for off := 0; off+n <= len(r.mem); off += stride {
		c := *m
		c.Q = r.mem[off : off+n : off+n]
		copy(c.Q, m.Q)
		r.mats = append(r.mats, &c)
	}
	if len(r.mats) == 0 {
		return []*Mat{m}
	}
	return r.mats
}

// release unmaps the ring's memory.
func (r *decodeRing) release() {
	if r.mem != nil {
		_ = hugemem.Unmap(r.mem)
		r.mem, r.mats = nil, nil
	}
}

// ringBytes is the size of a decodeRing: twice the last-level cache (a
// cyclic pass over twice an LRU cache's size misses on every line), at
// least 64 MiB where the size is unknown or small, at most 256 MiB.
func ringBytes() int {
	return min(max(2*lastLevelCache(), 64<<20), 256<<20)
}

// lastLevelCache returns the size in bytes of CPU 0's outermost data or
// unified cache as Linux's sysfs describes it, 0 where it cannot say.
func lastLevelCache() int {
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	level, size := 0, 0
	for _, d := range dirs {
		read := func(f string) string {
			b, _ := os.ReadFile(filepath.Join(d, f))
			return strings.TrimSpace(string(b))
		}
		if read("type") == "Instruction" {
			continue
		}
		l, err := strconv.Atoi(read("level"))
		if err != nil || l < level {
			continue
		}
		if n := parseCacheSize(read("size")); n > 0 {
			level, size = l, n
		}
	}
	return size
}

// parseCacheSize parses sysfs's cache size ("32768K", "1M", "512"), 0 if
// it cannot.
func parseCacheSize(s string) int {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n * mult
}

// pruneFactor is how much slower than the preferred candidate on one
// workload a candidate may be and still be timed on the others.
const pruneFactor = 4

// workloadData is one workload's operands.
type workloadData struct {
	x, out []float32
	w      *Mat
}

// newWorkloadData makes random operands for each workload.
func newWorkloadData(ws []Workload) []workloadData {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]workloadData, len(ws))
	for i, w := range ws {
		x := make([]float32, w.M*w.K)
		for j := range x {
			x[j] = rng.Float32()*2 - 1
		}
		out[i] = workloadData{x: x, out: make([]float32, w.M*w.N), w: randomMat(rng, w.DType, w.N, w.K)}
	}
	return out
}

// randomMat returns an n×k matrix of dtype d with values in [-0.1, 0.1).
func randomMat(rng *rand.Rand, d DType, n, k int) *Mat {
	m := &Mat{DType: d, Rows: n, Cols: k}
	rows := n
	if d.Quantized() {
		// A few rows quantized and repeated: a K-quant's quantizer takes
		// far longer than the products timed.
		rows = min(n, 64)
	}
	src := make([]float32, rows*k)
	for i := range src {
		src[i] = (rng.Float32()*2 - 1) / 10
	}
	switch {
	case d == F32:
		m.F32 = src
	case d == BF16 || d == F16:
		m.U16 = make([]uint16, n*k)
		conv := F32ToBF16
		if d == F16 {
			conv = F32ToF16
		}
		for i, v := range src {
			m.U16[i] = conv(v)
		}
	default:
		q, err := QuantizeRows(d, src, rows, k)
		if err != nil {
			panic(fmt.Sprintf("tensor: calibration matrix: %v", err)) // shapes are ours and valid
		}
		m.Q = make([]byte, 0, len(q)/rows*n)
		for len(m.Q) < cap(m.Q) {
			m.Q = append(m.Q, q[:min(len(q), cap(m.Q)-len(m.Q))]...)
		}
	}
	return m
}

// wallClock runs run up to calibrationReps times, stopping early once
// calibrationBudget has passed after at least two runs, and returns the
// fastest (the first run warms the caches and the scratch buffers).
func wallClock(_ string, _ Workload, run func()) time.Duration {
	best := time.Duration(math.MaxInt64)
	start := time.Now()
	for i := 0; i < calibrationReps && (i < 2 || time.Since(start) < calibrationBudget); i++ {
		t := time.Now()
		run()
		best = min(best, time.Since(t))
	}
	return best
}

// calibrationReps and calibrationBudget bound wallClock: the fastest of a
// few runs, a few milliseconds per workload on the assembly kernels (the
// pure-Go set, far slower, stops after two). Ten rather than five: on a
// 2-core Zen 4 shared with other jobs, the fastest of five Q8_0 decode
// products sometimes still carried a neighbour's interference (314 µs
// against 200–207 in the other runs), enough to flip decode's choice of
// quantized kernels; five more runs cost ~20 ms.
const (
	calibrationReps   = 10
	calibrationBudget = 5 * time.Millisecond
)
