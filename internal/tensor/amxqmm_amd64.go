package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// The quantized products with AMX (the "amx" quantized kernels: the
// AVX512-VNNI ones, with each group of 16 activation rows multiplied by
// AMX-INT8's TDPBSUD instead: asmgen's amx.go, qamx32R16 for the blocks
// of 32, qamxKR16 and qamx6KR16 for the K-quants). The integers are exact
// and the f32 chains the definition's, so the results are every quantized
// kernel's bits; the calibration chooses them only where they are
// measured faster, and only after amxSelfCheck found them bit-identical
// on this CPU.

// amxGroup is the activation rows one AMX kernel call takes.
const amxGroup = 16

// amxConfig32 is qamx32R16's and qamxKR16's tile configuration (palette
// 1; asmgen's amx.go), two sets alike: tiles 0 and 3 the 16×16 int32 sums
// (16 rows of 64 bytes), 1 and 4 16 activation rows of 32 bytes, 2 and 5
// 8 rows of 64 bytes of levels. amxConfig16 is qamx6KR16's: Q6_K's
// sub-blocks of 16, tiles 1 and 4 16 rows of 16 bytes, 2 and 5 4 rows of
// 64.
var (
	amxConfig32 = amxInt8Config(32)
	amxConfig16 = amxInt8Config(16)
)

// amxInt8Config returns the int8 kernels' configuration for blocks of
// block bytes (see amxConfig32).
func amxInt8Config(block int) (c [64]byte) {
	c[0] = 1
	for set := range 2 {
		for i, t := range []struct{ rows, colsb int }{{16, 64}, {16, block}, {block / 4, 64}} {
			c[16+2*(3*set+i)], c[48+3*set+i] = byte(t.colsb), byte(t.rows)
		}
	}
	return c
}

// amxKernel is an AMX dot kernel's signature: 16 activation rows over nb
// blocks of a panel, continuing the chains in acc.
type amxKernel = func(x *int8, ldx int, meta *uint32, panel *byte, nb int, acc *float32, cfg *byte, scratch *int32)

// amxDot is an AMX dot kernel and what its driver needs to know: the VNNI
// dot kernels whose panel layout it reads (and whose bits it gives), the
// weights of a block, its configuration and the int32s of the tiles it
// stores.
type amxDot struct {
	dot      []qdot
	kernel   *amxKernel
	elems    int
	cfg      *[64]byte
	tileInts int
}

// The kernels; tests run the drivers with Go functions of the same
// contract where the CPU has no AMX.
var (
	amxDot32 amxKernel = qamx32R16
	amxDotK  amxKernel = qamxKR16
	amxDot6K amxKernel = qamx6KR16
)

// amxDots are the AMX dot kernels: Q8_0, Q4_0 and Q5_0 blocks of 32
// (qamx32R16), the Q4_K/Q5_K and the Q6_K super-blocks (qamxKR16,
// qamx6KR16).
var amxDots = []amxDot{
	{dot: dot32AVX512, kernel: &amxDot32, elems: 32, cfg: &amxConfig32, tileInts: 2 * 256},
	{dot: dotKAVX512, kernel: &amxDotK, elems: qk, cfg: &amxConfig32, tileInts: 8 * 256},
	{dot: dot6KAVX512, kernel: &amxDot6K, elems: qk, cfg: &amxConfig16, tileInts: 16 * 256},
}

// amxFor returns the AMX dot kernel that stands in for the VNNI dot
// kernels dot and the activation rows it takes (a.amxRows, prepareAMX's),
// or nil and 0.
func amxFor(dot []qdot, a *qAct) (*amxDot, int) {
	if a.amxRows == 0 || len(dot) == 0 {
		return nil, 0
	}
	for i, d := range amxDots {
		if &dot[0] == &d.dot[0] {
			return &amxDots[i], a.amxRows
		}
	}
	return nil, 0
}

// qKernelsAMX are qKernelsAVX512 with the AMX dot kernels for groups of
// 16 activation rows.
var qKernelsAMX = func() *qKernelSet {
	s := *qKernelsAVX512
	s.amx = true
	return &s
}()

func qmmAMX(a *qAct, w *Mat, lo, hi int, out []float32) { qKernelsAMX.run(a, w, lo, hi, out) }

// prepareAMX arranges the per-block records of a's first a.m/16·16 rows
// as the AMX kernels read them, per group of 16 rows and block, into
// a.amxMeta and sets a.amxRows (0 under 16 rows): for the 32-blocks'
// (qamx32R16) transposed, the 16 rows' scales then their corrections; for
// the K-quants' the rows' 64-byte records side by side. A product does it
// once, before its workers share a.
func (a *qAct) prepareAMX() {
	rows := a.m / amxGroup * amxGroup
	a.amxRows = rows
	if rows == 0 {
		return
	}
	words, elems := metaWords(a.dt)
	nb := a.k / elems
	n := rows * nb * words
	if cap(a.amxMeta) < n {
		a.amxMeta = make([]uint32, n)
	}
	meta := a.amxMeta[:n]
	for i := range rows {
		g, r := i/amxGroup, i%amxGroup
		src := a.meta[i*nb*words : (i+1)*nb*words]
		for b := range nb {
			dst := meta[(g*nb+b)*amxGroup*words:]
			rec := src[b*words : (b+1)*words]
			if elems == 32 {
				for w, v := range rec {
					dst[w*amxGroup+r] = v
				}
			} else {
				copy(dst[r*words:], rec)
			}
		}
	}
}

// amxRun continues the chains in acc (16 a row) of the first rows
// activation rows (prepareAMX's) over d's blocks [b0, b0+c), whose panel
// (the layout of d.dot) is at panel.
func amxRun(sc *qScratch, a *qAct, d *amxDot, rows, b0, c int, panel *byte, acc []float32) {
	if cap(sc.amxTile) < d.tileInts {
		sc.amxTile = make([]int32, d.tileInts)
	}
	words, _ := metaWords(a.dt)
	nb := a.k / d.elems
	for i := 0; i < rows; i += amxGroup {
		(*d.kernel)(&a.xq[i*a.k+b0*d.elems], a.k, &a.amxMeta[(i/amxGroup*nb+b0)*amxGroup*words], panel, c,
			&acc[i*16], &d.cfg[0], &sc.amxTile[0])
	}
}

// amxAvailable reports whether this CPU and OS run AMX-INT8.
func amxAvailable() bool {
	s := DetectAMX()
	return s.Tile && s.Int8 && s.Permitted
}

// AMXSelfCheck reports why the AMX kernels are not used here, or nil: it
// runs amxSelfCheck (once).
func AMXSelfCheck() error { return amxSelfCheck() }

// amxSelfCheck runs one product of each format the AMX kernels take
// (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K, as panels and as rows; 33 activation rows,
// so that two groups and a remainder run) with the AMX kernels and the
// AVX512-VNNI ones and returns an error unless every output is
// bit-identical: a CPU where they differ keeps the VNNI kernels. It runs
// once.
var amxSelfCheck = sync.OnceValue(func() error {
	if !amxAvailable() || !hasPanelKernels {
		return errors.New("tensor: AMX-INT8 and AVX512-VNNI are not both available here: " + DetectAMX().String())
	}
	return amxCompare(qmmAMX, qmmAVX512, qmmPanelsAMX, qmmPanels)
})

// amxCompare multiplies random matrices of every format with an AMX
// kernel (K = 2,048: more blocks than one chunk of the drivers) by 33
// random activation rows with amx and vnni (and stored as panels, widened
// for the AMX kernels but Q8_0's, with amxPanels and vnniPanels) and
// returns an error naming the first output that differs.
func amxCompare(amx, vnni, amxPanels, vnniPanels func(a *qAct, w *Mat, lo, hi int, out []float32)) error {
	const m, n, k = 33, 32, 2048
	rng := rand.New(rand.NewPCG(7, 11))
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ks := defaultSet()
	for _, dt := range []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
		w := randomMat(rng, dt, n, k)
		type pair struct {
			name      string
			w         *Mat
			amx, vnni func(a *qAct, w *Mat, lo, hi int, out []float32)
		}
		runs := []pair{{dt.String(), w, amx, vnni}}
		if PanelBytes(w) > 0 {
			pw, err := PackPanels(w, make([]byte, PanelBytes(w)))
			if err != nil {
				return err
			}
			runs = append(runs, pair{dt.String() + " panels", pw, amxPanels, vnniPanels})
		}
		for _, r := range runs {
			a := &qAct{}
			(&Pool{threads: 1}).quantizeActs(ks, a, dt, x, m, k)
			a.prepareAMX()
			got, want := make([]float32, m*n), make([]float32, m*n)
			r.amx(a, r.w, 0, n, got)
			r.vnni(a, r.w, 0, n, want)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					return fmt.Errorf("tensor: the AMX kernels' %s product differs from the AVX512-VNNI kernels' at row %d, column %d: %g, want %g", r.name, i/n, i%n, got[i], want[i])
				}
			}
		}
	}
	return nil
}
