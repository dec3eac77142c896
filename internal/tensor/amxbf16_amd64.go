package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"unsafe"
)

// The amxbf16 kernel set: avx512bf16's, with bf16 weights multiplied by
// AMX-BF16 (asmgen's amx.go, gemmAMXBF16) wherever a matrix's rows are a
// multiple of 16 and its columns of 32, for every number of activation
// rows (decode too), so that each output takes the same instructions
// whatever the batch: TDPBF16PS over K in order, in one tile. Its rounding
// is AMX's (pairs accumulated as the instruction does; denormals flushed),
// not VDPBF16PS's, so it is a kernel set of its own, chosen by the
// calibration only where it is measured faster, and only after
// amxBF16SelfCheck.

// amxBF16Config holds gemmAMXBF16's tile configuration for r = 1..16
// activation rows (palette 1): tile 0 the sums (16 rows of r f32), tile 1
// 16 weight rows of 32 bf16, tile 2 16 pairs of k of r activation rows.
var amxBF16Config = func() (c [amxGroup + 1][64]byte) {
	for r := 1; r <= amxGroup; r++ {
		c[r][0] = 1
		for _, t := range []struct{ tile, rows, colsb int }{{0, 16, 4 * r}, {1, 16, 64}, {2, 16, 4 * r}} {
			c[r][16+2*t.tile] = byte(t.colsb)
			c[r][48+t.tile] = byte(t.rows)
		}
	}
	return c
}()

// amxFullConfig configures all eight tiles as 16 rows of 64 bytes:
// gemmAMXBF16x4's (four of sums, two of weights, two of activations) and
// the AMX peak kernels' (four of sums, two of ones).
var amxFullConfig = func() (c [64]byte) {
	c[0] = 1
	for t := range 8 {
		c[16+2*t], c[48+t] = 64, 16
	}
	return c
}()

// amxGatherIdx is gemmAMXBF16's gather offsets: element 16·i, row i of
// the stored tile.
var amxGatherIdx = [16]int32{0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240}

// amxBF16Kernel and amxBF16Kernel4 are the kernels; a test runs the
// driver with Go functions of the same contracts where the CPU has no AMX.
var (
	amxBF16Kernel  = gemmAMXBF16
	amxBF16Kernel4 = gemmAMXBF16x4
)

// amxBF16Available reports whether this CPU and OS run AMX-BF16.
func amxBF16Available() bool {
	s := DetectAMX()
	return s.Tile && s.BF16 && s.Permitted
}

// amxBF16Fits reports whether the amxbf16 set multiplies w with AMX: bf16
// rows in groups of 16 and columns in steps of 32. Any other matrix takes
// avx512bf16's kernels, for every batch alike.
func amxBF16Fits(w *Mat) bool {
	return w.DType == BF16 && w.Rows%16 == 0 && w.Cols%32 == 0 && w.Cols > 0
}

// amxBF16Scratch holds, per MatMul, the packed activations.
var amxBF16Scratch = sync.Pool{New: func() any { return new([]uint16) }}

// amxTileScratch holds a worker's stored tiles (four for gemmAMXBF16x4).
var amxTileScratch = sync.Pool{New: func() any { return new([4 * amxGroup * 16]float32) }}

// packAMXBF16 lays out activation rows [lo, hi) of m rows of k bf16 (xb)
// as gemmAMXBF16's tile B wants them in dst: per group of 16 rows, per
// pair p of k, the 16 rows' pairs (x[j][2p], x[j][2p+1]) side by side (64
// bytes), a pair copied as one uint32 (2.4 times as fast as by halves:
// 0.5 ms for 512 rows of 2,048 on a Zen 4 thread). A last group that is
// not full leaves its columns past m as they were: its tile B is
// configured with its rows' columns only, so nothing reads them.
func packAMXBF16(xb []uint16, lo, hi, m, k int, dst []uint16) {
	pairs := k / 2
	groups := (m + amxGroup - 1) / amxGroup
	src := unsafe.Slice((*uint32)(unsafe.Pointer(&xb[0])), m*pairs)
	d32 := unsafe.Slice((*uint32)(unsafe.Pointer(&dst[0])), groups*pairs*amxGroup)
	for i := lo; i < hi; i++ {
		g, j := i/amxGroup, i%amxGroup
		row := src[i*pairs : (i+1)*pairs]
		d := d32[g*pairs*amxGroup+j:]
		for p, v := range row {
			d[amxGroup*p] = v
		}
	}
}

// matmulAMXBF16 is matMul for the amxbf16 set and a matrix that fits: the
// activations xb (rounded to bf16) packed once, then each 32 weight rows
// of a chunk (a multiple of 16) by every group of 16 activation rows, two
// full groups a call where there are (gemmAMXBF16x4), the rest one a call;
// a single group (decode) in one call over the chunk.
func (p *Pool) matmulAMXBF16(out []float32, xb []uint16, m int, w *Mat, chunk int) {
	n, k := w.Rows, w.Cols
	groups := (m + amxGroup - 1) / amxGroup
	buf := amxBF16Scratch.Get().(*[]uint16)
	defer amxBF16Scratch.Put(buf)
	if cap(*buf) < groups*k*16 {
		*buf = make([]uint16, groups*k*16)
	}
	xp := (*buf)[:groups*k*16]
	p.run(m, amxGroup, func(_, lo, hi int) { packAMXBF16(xb, lo, hi, m, k, xp) })
	full := m / amxGroup
	p.run(n, chunk, func(_, lo, hi int) {
		tile := amxTileScratch.Get().(*[4 * amxGroup * 16]float32)
		defer amxTileScratch.Put(tile)
		if groups == 1 {
			amxBF16Kernel(&w.U16[lo*k], k, &xp[0], k, hi-lo, m, &out[lo], n, &amxBF16Config[m][0], &tile[0], &amxGatherIdx[0])
			return
		}
		// 32 weight rows at a time, so that they stay in cache while
		// every group of activation rows passes over them.
		for r0 := lo; r0 < hi; r0 += 32 {
			rows := min(32, hi-r0)
			g := 0
			for ; rows == 32 && g+1 < full; g += 2 {
				amxBF16Kernel4(&w.U16[r0*k], k, &xp[g*k*16], 2*k*16, k, 32, &out[g*amxGroup*n+r0], n,
					&amxFullConfig[0], &tile[0], &amxGatherIdx[0])
			}
			for ; g < groups; g++ {
				r := min(amxGroup, m-g*amxGroup)
				amxBF16Kernel(&w.U16[r0*k], k, &xp[g*k*16], k, rows, r, &out[g*amxGroup*n+r0], n,
					&amxBF16Config[r][0], &tile[0], &amxGatherIdx[0])
			}
		}
	})
}

// AMXBF16SelfCheck reports why the amxbf16 kernel set is not used here,
// or nil: it runs amxBF16SelfCheck (once).
func AMXBF16SelfCheck() error { return amxBF16SelfCheck() }

// amxBF16SelfCheck multiplies a random bf16 matrix by 1, 5, 16, 32 and 37
// activation rows with the amxbf16 set and returns an error unless every
// output is the same bits at every batch size and within bf16's rounding
// of the avx512bf16 set's: a CPU where it fails keeps the other sets. It
// runs once.
var amxBF16SelfCheck = sync.OnceValue(func() error {
	var amx, ref *kernelSet
	for _, ks := range kernelSets {
		switch ks.name {
		case "amxbf16":
			amx = ks
		case "avx512bf16":
			ref = ks
		}
	}
	if amx == nil || !amx.avail || ref == nil || !ref.avail {
		return errors.New("tensor: AMX-BF16 and AVX512-BF16 are not both available here: " + DetectAMX().String())
	}
	return amxBF16Compare(amx, ref)
})

// amxBF16Compare checks the amx set against ref as amxBF16SelfCheck says.
func amxBF16Compare(amx, ref *kernelSet) error {
	const n, k, mMax = 48, 256, 37
	rng := rand.New(rand.NewPCG(9, 10))
	w := randomMat(rng, BF16, n, k)
	x := make([]float32, mMax*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	p := &Pool{threads: 1}
	full := make([]float32, mMax*n)
	p.matMul(amx, full, x, mMax, w)
	want := make([]float32, mMax*n)
	p.matMul(ref, want, x, mMax, w)
	for i, v := range full {
		if d := math.Abs(float64(v - want[i])); d > 1e-2*(1+math.Abs(float64(want[i]))) || v != v {
			return fmt.Errorf("tensor: the amxbf16 set's product differs from avx512bf16's at row %d, column %d: %g, want %g", i/n, i%n, v, want[i])
		}
	}
	for _, m := range []int{1, 5, 16, 32} {
		got := make([]float32, m*n)
		p.matMul(amx, got, x, m, w)
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(full[i]) {
				return fmt.Errorf("tensor: the amxbf16 set is not batch invariant: row %d, column %d is %g in a batch of %d, %g in one of %d", i/n, i%n, v, m, full[i], mMax)
			}
		}
	}
	return nil
}
