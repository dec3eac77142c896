package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// benchModelFlags are `tandem bench model`'s flags: the shape of the
// decoder layers whose linear layers are timed, the formats and the load.
type benchModelFlags struct {
	threads, layers, hidden, kv, ffn, vocab, tokens, reps, readMiB int
	formats                                                        string
}

// runBenchModel is `tandem bench model`: what this machine's CPU gets from
// Tandem's kernels per weight format, beside its measured limits.
func runBenchModel(args []string) error {
	fs := flag.NewFlagSet("bench model", flag.ContinueOnError)
	var f benchModelFlags
	fs.IntVar(&f.threads, "threads", runtime.NumCPU(), "compute threads")
	fs.IntVar(&f.layers, "layers", 2, "decoder layers timed by decode (their weights must not fit in the caches)")
	fs.IntVar(&f.hidden, "hidden", 2048, "hidden size (llama-1b: 2048)")
	fs.IntVar(&f.kv, "kv", 512, "K and V projection rows (llama-1b: 512)")
	fs.IntVar(&f.ffn, "ffn", 8192, "MLP intermediate size (llama-1b: 8192)")
	fs.IntVar(&f.vocab, "vocab", 128256, "vocabulary, for the model-equivalent token rates (llama-1b: 128256)")
	fs.IntVar(&f.tokens, "tokens", 128, "prompt tokens of the prefill")
	fs.IntVar(&f.reps, "reps", 5, "timed repetitions of each measurement (the median is shown)")
	fs.IntVar(&f.readMiB, "read-mib", 256, "MiB scanned by the stream read that measures the read limit")
	fs.StringVar(&f.formats, "formats", "bf16,f32,q8_0,q4_k,q6_k", "weight formats, comma-separated (f32, bf16, f16, q8_0, q4_0, q5_0, q4_k, q5_k, q6_k)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench model [flags]\n\n"+
			"Times Tandem's CPU kernels on this machine for each weight format, on the linear layers\n"+
			"of a decoder (llama-1b's by default, random weights): decode (one token; its weights\n"+
			"streamed from memory) as GB/s and %% of the read limit (the fastest stream read of\n"+
			"several stream counts and prefetch distances; the plain Go scans shown beside it),\n"+
			"that read timed again alternately with each format's decode, pass by pass, so that a\n"+
			"machine shared with other work moves both alike, and\n"+
			"prefill (--tokens rows) as GFLOP/s and %% of the arithmetic peak of the instruction its\n"+
			"kernels multiply with (f32 FMA, bf16 dot VDPBF16PS, or the int8 dot of the quantized\n"+
			"kernels; each measured by a register-only loop on every thread at once, a multiply-add\n"+
			"counted as 2 operations), with the token rates they give a whole model of that shape.\n"+
			"The f32 MatMul's rate in cache is shown beside the peaks. The kernels are chosen as\n"+
			"`tandem serve` chooses them (calibration; %s overrides), and the weights are laid out as\n"+
			"a loaded model's: in huge pages, the quantized formats as the kernels' panels where they read them\n"+
			"(TANDEM_PANELS=0 keeps ggml's rows, to compare).\n\n", tensor.KernelsEnv)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.threads < 1 || f.layers < 1 || f.hidden < 256 || f.hidden%256 != 0 || f.kv%256 != 0 || f.kv < 256 || f.ffn%256 != 0 || f.ffn < 256 || f.tokens < 1 || f.reps < 1 || f.readMiB < 1 {
		return fmt.Errorf("--threads, --layers, --tokens, --reps and --read-mib must be positive and --hidden, --kv and --ffn positive multiples of 256 (the K-quants' block)")
	}
	var dts []tensor.DType
	for s := range strings.SplitSeq(f.formats, ",") {
		dt, err := tensor.ParseDType(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--formats: %w", err)
		}
		dts = append(dts, dt)
	}
	cal, err := tensor.Calibrate(tensor.EnvCalibrateConfig())
	if err != nil {
		return fmt.Errorf("choosing the CPU kernels: %w", err)
	}
	return benchModel(os.Stdout, f, dts, cal)
}

// benchModel measures and prints the table.
func benchModel(w io.Writer, f benchModelFlags, dts []tensor.DType, cal tensor.Calibration) error {
	p := tensor.NewPool(f.threads)
	defer p.Close()
	clock := "wall clock"
	if f.threads == 1 && useThreadCPU() {
		defer func() { benchClock = wallClock }()
		clock = "this thread's CPU time (one thread: the kernels' speed on a shared machine)"
	}
	fmt.Fprintf(w, "CPU: %s\nkernels: %s, quantized %s (%s); %s; timed by %s\n", machine(), cal.Set, cal.QuantText(), cal.Source, amxText(), clock)
	read, err := streamRead(p, f.readMiB, f.reps)
	if err != nil {
		return err
	}
	defer hugemem.Unmap(read.mem)
	fmt.Fprintf(w, "read limit (stream read of %d MiB, %d threads): %s\n", f.readMiB, f.threads, read)
	fmt.Fprintf(w, "memory: %s\n", pagesText(read.mem))
	peaks := arithPeaks(p, f.reps)
	printPeaks(w, peaks, f.threads)
	fmt.Fprintf(w, "f32 MatMul in cache (%s kernels, 32×128×256 per thread, %d threads): %.0f GFLOP/s\n", tensor.ISA(), f.threads, inCacheMatMul(p, f.reps)/1e9)
	fmt.Fprintf(w, "shape: hidden %d, kv %d, ffn %d; decode over %d layers' weights, prefill %d tokens over one layer; median of %d\n\n",
		f.hidden, f.kv, f.ffn, f.layers, f.tokens, f.reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "format\tdecode GB/s\tread beside GB/s\t% of read limit\tdecode tok/s (model)\tprefill GFLOP/s\tprefill kernels' peak\t% of that peak\tprefill tok/s (model)\t")
	for _, dt := range dts {
		r, err := benchFormat(p, f, dt, read)
		if err != nil {
			return err
		}
		label, pct := "-", "-"
		if pk, ok := tensor.PrefillPeak(cal.Set, cal.Quant, dt); ok && peaks[pk] > 0 {
			label, pct = peakLabels[pk], fmt.Sprintf("%.0f%%", 100*r.prefillFlops/peaks[pk])
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.0f%%\t%.1f\t%.0f\t%s\t%s\t%.0f\t\n", dt, r.decodeBps/1e9, r.readBps/1e9, 100*r.ofRead,
			r.decodeBps/r.modelBytes, r.prefillFlops/1e9, label, pct, r.prefillFlops/r.modelFlopsPerToken)
	}
	fmt.Fprintf(tw, "(decode: median of %d passes, each after a pass of the read limit's scan; read beside: those scans' median; %% of read limit: the median of each pass's ratio to the scan before it)\n", f.reps)
	fmt.Fprintf(tw, "(model: %d layers of this shape plus a %d-entry tied embedding read whole by the logits; attention not counted)\n", benchModelLayers, f.vocab)
	return tw.Flush()
}

// benchModelLayers is the layer count of the model the token rates are
// given for (llama-1b's).
const benchModelLayers = 16

// formatResult is one format's measurements.
type formatResult struct {
	decodeBps, prefillFlops float64
	// readBps is the read limit's scan timed alternately with decode, and
	// ofRead the median of each decode pass's rate over the scan's before it.
	readBps, ofRead float64
	// modelBytes and modelFlopsPerToken are what a token of the whole
	// model reads and computes in this format.
	modelBytes, modelFlopsPerToken float64
}

// layerShapes are the rows×cols of a decoder layer's linear layers: q, k,
// v, o, gate, up and down.
func layerShapes(f benchModelFlags) [][2]int {
	h := f.hidden
	return [][2]int{{h, h}, {f.kv, h}, {f.kv, h}, {h, h}, {f.ffn, h}, {f.ffn, h}, {h, f.ffn}}
}

// benchFormat builds f.layers layers of dt weights (one layer quantized,
// copied into the others) and times decode over all of them and prefill
// over the first, the decode passes alternated with read's scan.
func benchFormat(p *tensor.Pool, f benchModelFlags, dt tensor.DType, read readLimit) (formatResult, error) {
	rng := rand.New(rand.NewPCG(7, uint64(dt)))
	shapes := layerShapes(f)
	proto := make([]*tensor.Mat, len(shapes))
	var layerParams float64
	for i, s := range shapes {
		m, err := randomWeights(rng, dt, s[0], s[1])
		if err != nil {
			return formatResult{}, err
		}
		proto[i] = m
		layerParams += float64(s[0]) * float64(s[1])
	}
	// Every layer a copy of proto's weights, laid out as the model loaders
	// lay them out: back to back in one mapping of huge pages.
	per := 0
	for _, m := range proto {
		per += (max(matBytes(m), tensor.PanelBytes(m)) + 63) &^ 63
	}
	mem, err := hugemem.Map(per * f.layers)
	if err != nil {
		return formatResult{}, err
	}
	defer hugemem.Unmap(mem)
	panels := os.Getenv("TANDEM_PANELS") != "0"
	var layers [][]*tensor.Mat
	for range f.layers {
		l := make([]*tensor.Mat, len(proto))
		for i, m := range proto {
			n := matBytes(m)
			if pn := tensor.PanelBytes(m); pn > 0 && panels {
				pm, err := tensor.PackPanels(m, mem[:pn:pn])
				if err != nil {
					return formatResult{}, err
				}
				l[i], n = pm, pn
			} else {
				l[i] = copyMat(m, mem[:n:n])
			}
			mem = mem[(n+63)&^63:]
		}
		layers = append(layers, l)
	}
	bytesPerParam := float64(matBytes(proto[0])) / (float64(shapes[0][0]) * float64(shapes[0][1]))
	maxRows := slices.MaxFunc(shapes, func(a, b [2]int) int { return a[0] - b[0] })[0]
	x := randomActs(rng, f.tokens*f.ffn)
	out := make([]float32, f.tokens*maxRows)
	decode := func() {
		for _, l := range layers {
			for _, m := range l {
				p.MatMul(out, x, 1, m)
			}
		}
	}
	prefill := func() {
		for _, m := range layers[0] {
			p.MatMul(out, x, f.tokens, m)
		}
	}
	decodeBytes := bytesPerParam * layerParams * float64(f.layers)
	dec, scan, ratio := pairedMedians(f.reps, decode, read.pass)
	r := formatResult{
		decodeBps:    decodeBytes / dec.Seconds(),
		readBps:      read.bytes / scan.Seconds(),
		ofRead:       ratio * decodeBytes / read.bytes,
		prefillFlops: 2 * layerParams * float64(f.tokens) / median(f.reps, prefill).Seconds(),
	}
	modelParams := layerParams*benchModelLayers + float64(f.vocab)*float64(f.hidden)
	r.modelBytes = bytesPerParam * modelParams
	r.modelFlopsPerToken = 2 * modelParams
	return r, nil
}

// matBytes is the bytes m's weights occupy.
func matBytes(m *tensor.Mat) int { return 4*len(m.F32) + 2*len(m.U16) + len(m.Q) }

// pagesText says how much of mem (hugemem's) is in transparent huge pages
// and the system's THP policy: the weights are mapped alike, and decode
// reads 4 KiB pages slower.
func pagesText(mem []byte) string {
	_, huge, ok := hugemem.Resident(mem)
	if !ok {
		return "page sizes unknown on this OS"
	}
	mode := hugemem.Mode()
	if mode == "" {
		mode = "unknown"
	}
	return fmt.Sprintf("%d of %d MiB scanned in 2 MiB pages (transparent huge pages: %s; the weights are mapped alike)", huge>>20, cap(mem)>>20, mode)
}

// copyMat returns m with its weights copied into dst (matBytes(m) bytes,
// aligned for m's element type).
func copyMat(m *tensor.Mat, dst []byte) *tensor.Mat {
	c := *m
	p := unsafe.Pointer(unsafe.SliceData(dst))
	switch {
	case m.F32 != nil:
		c.F32 = unsafe.Slice((*float32)(p), len(m.F32))
		copy(c.F32, m.F32)
	case m.U16 != nil:
		c.U16 = unsafe.Slice((*uint16)(p), len(m.U16))
		copy(c.U16, m.U16)
	default:
		c.Q = dst
		copy(c.Q, m.Q)
	}
	return &c
}

// randomWeights returns an n×k matrix of dtype dt with values in ±0.1.
func randomWeights(rng *rand.Rand, dt tensor.DType, n, k int) (*tensor.Mat, error) {
	src := make([]float32, n*k)
	for i := range src {
		src[i] = (rng.Float32()*2 - 1) / 10
	}
	m := &tensor.Mat{DType: dt, Rows: n, Cols: k}
	switch dt {
	case tensor.F32:
		m.F32 = src
	case tensor.BF16, tensor.F16:
		conv := tensor.F32ToBF16
		if dt == tensor.F16 {
			conv = tensor.F32ToF16
		}
		m.U16 = make([]uint16, len(src))
		for i, v := range src {
			m.U16[i] = conv(v)
		}
	default:
		q, err := tensor.QuantizeRows(dt, src, n, k)
		if err != nil {
			return nil, fmt.Errorf("quantizing the %s benchmark weights: %w", dt, err)
		}
		m.Q = q
	}
	return m, nil
}

// randomActs returns n activations in ±1.
func randomActs(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
	}
	return x
}

// median runs fn once to warm up, then reps times, and returns the median
// duration: of this thread's CPU time when the benchmark runs on one
// thread and the OS can say (on a machine shared with other work, the
// kernel's speed rather than the scheduler's), of the wall clock otherwise.
func median(reps int, fn func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clock := benchClock
	fn()
	ds := make([]time.Duration, reps)
	for i := range ds {
		t := clock()
		fn()
		ds[i] = clock() - t
	}
	slices.Sort(ds)
	return ds[reps/2]
}

// pairedMedians runs b once to warm up, then b and fn alternately, reps
// times each (fn right after b, which leaves nothing of fn's data in the
// caches when b is the read scan), and returns the median durations of fn
// and of b and the median of the ratios t_b / t_fn pass by pass, on
// median's clock. On a machine shared with other work the memory
// bandwidth left to this process moves over seconds; a pair of passes
// sees the same share, so the ratio's median is steadier than that of the
// two medians.
func pairedMedians(reps int, fn, b func()) (tfn, tb time.Duration, ratio float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clock := benchClock
	b()
	fns, bs := make([]time.Duration, reps), make([]time.Duration, reps)
	ratios := make([]float64, reps)
	for i := range reps {
		t := clock()
		b()
		u := clock()
		fn()
		bs[i], fns[i] = u-t, clock()-u
		ratios[i] = float64(bs[i]) / float64(max(fns[i], 1))
	}
	slices.Sort(fns)
	slices.Sort(bs)
	slices.Sort(ratios)
	return fns[reps/2], bs[reps/2], ratios[reps/2]
}

// benchClock is median's clock (see useThreadCPU).
var benchClock = wallClock

// wallClock is the time since an arbitrary fixed point.
func wallClock() time.Duration { return time.Since(benchEpoch) }

var benchEpoch = time.Now()

// useThreadCPU makes median measure thread CPU time if this OS can and
// reports whether it does.
func useThreadCPU() bool {
	if _, ok := threadCPU(); !ok {
		return false
	}
	benchClock = func() time.Duration { d, _ := threadCPU(); return d }
	return true
}

// readLimit is the measured read limit and what it was measured beside.
type readLimit struct {
	// bps is the read limit: the fastest tensor.ReadScan, bytes per
	// second, at streams streams side by side and prefetch distance pf.
	bps         float64
	streams, pf int
	// words and dot are the plain Go scans' rates (tensor.SumWords, and
	// Dot of the data with itself), the limit before ReadScan.
	words, dot float64
	// pass runs the fastest scan once more over its bytes (for
	// pairedMedians).
	pass  func()
	bytes float64
	// mem is the scanned memory's mapping (hugemem's), for the caller to
	// release when done with pass.
	mem []byte
}

// streamRead measures the read limit: a scan of mib MiB split over the
// pool's threads by tensor.ReadScan at each of its stream counts and
// prefetch distances, the fastest kept, and the plain scans beside it;
// bytes per second, median of reps passes each. (docs/performance-log.md's
// first numbers scanned with ArgMax, which without AVX-512 is bound by its
// arithmetic; the next with SumWords and Dot, below what the prefetching
// matrix kernels read.)
func streamRead(p *tensor.Pool, mib, reps int) (readLimit, error) {
	// In huge pages, as the loaded weights are (a scan of 4 KiB pages
	// read 5–15% less on a Zen 4: docs/performance-log.md).
	mem, err := hugemem.Map(mib << 20)
	if err != nil {
		return readLimit{}, err
	}
	big := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(mem))), mib<<20/4)
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range big {
		big[i] = rng.Float32()*2 - 1
	}
	n := p.Threads()
	per := len(big) / n
	rate := func(scan func([]float32)) float64 {
		d := median(reps, func() {
			p.Parallel(n, func(lo, hi int) { scan(big[lo*per : hi*per]) })
		})
		return float64(per*n*4) / d.Seconds()
	}
	var r readLimit
	for _, st := range tensor.ReadScanStreams {
		for _, pf := range tensor.ReadScanDistances {
			if bps := rate(func(x []float32) { tensor.ReadScan(x, st, pf) }); bps > r.bps {
				r.bps, r.streams, r.pf = bps, st, pf
			}
		}
	}
	r.mem, r.bytes = mem, float64(per*n*4)
	r.pass = func() {
		p.Parallel(n, func(lo, hi int) { tensor.ReadScan(big[lo*per:hi*per], r.streams, r.pf) })
	}
	r.words = rate(func(x []float32) { tensor.SumWords(x) })
	r.dot = rate(func(x []float32) { tensor.Dot(x, x) })
	return r, nil
}

// String describes how the limit was measured.
func (r readLimit) String() string {
	how := "Go scan"
	if tensor.ReadScanIsAssembly() {
		how = fmt.Sprintf("assembly scan, %d streams side by side, ", r.streams)
		if r.pf == 0 {
			how += "no software prefetch"
		} else {
			how += fmt.Sprintf("prefetching %d KiB ahead", r.pf>>10)
		}
	}
	return fmt.Sprintf("%.1f GB/s (%s; plain Go scans: words %.1f, dot %.1f GB/s)", r.bps/1e9, how, r.words/1e9, r.dot/1e9)
}

// inCacheMatMul measures the f32 MatMul's rate on operands that stay in
// the core's caches (32 activation rows times 128×256 weights, 128 KiB),
// on every thread at once: how near the product's tiles get to the FMA
// peak with their loads. FLOP per second, median of reps.
func inCacheMatMul(p *tensor.Pool, reps int) float64 {
	const m, n, k, iters = 32, 128, 256, 100
	rng := rand.New(rand.NewPCG(9, 9))
	threads := p.Threads()
	ws := make([]*tensor.Mat, threads)
	xs := make([][]float32, threads)
	outs := make([][]float32, threads)
	for i := range threads {
		ws[i] = &tensor.Mat{DType: tensor.F32, Rows: n, Cols: k, F32: randomActs(rng, n*k)}
		xs[i], outs[i] = randomActs(rng, m*k), make([]float32, m*n)
	}
	serial := tensor.NewPool(1)
	defer serial.Close()
	d := median(reps, func() {
		p.Parallel(threads, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				for range iters {
					serial.MatMul(outs[t], xs[t], m, ws[t])
				}
			}
		})
	})
	return 2 * float64(m*n*k) * iters * float64(threads) / d.Seconds()
}

// amxText describes this CPU's AMX and, where the OS permits it, what the
// AMX kernels' self-checks found (they decide whether the calibration may
// choose them).
func amxText() string {
	amx := tensor.DetectAMX()
	if !amx.Tile || !amx.Permitted {
		return amx.String()
	}
	quant, bf16 := "passed", "passed"
	if err := tensor.AMXSelfCheck(); err != nil {
		quant = "failed: " + err.Error()
	}
	if err := tensor.AMXBF16SelfCheck(); err != nil {
		bf16 = "failed: " + err.Error()
	}
	return fmt.Sprintf("%s (self-checks: amx %s; amxbf16 %s)", amx, quant, bf16)
}
