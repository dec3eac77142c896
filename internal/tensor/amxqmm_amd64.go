package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// The quantized products with AMX (the "amx" quantized kernels: the
// AVX512-VNNI ones, with each group of 16 activation rows of a Q8_0, Q4_0
// or Q5_0 product multiplied by AMX-INT8's TDPBSUD instead: asmgen's
// amx.go, qamx32R16). The integers are exact and the f32 chains the
// definition's, so the results are every quantized kernel's bits; the
// calibration chooses them only where they are measured faster, and only
// after amxSelfCheck found them bit-identical on this CPU.

// amxGroup is the activation rows one qamx32R16 call takes.
const amxGroup = 16

// amxConfig32 is qamx32R16's tile configuration (palette 1; asmgen's
// amxConfig32): tile 0 the 16×16 int32 sums (16 rows of 64 bytes), tile 1
// 16 activation rows of 32 bytes, tile 2 8 rows of 64 bytes of levels.
var amxConfig32 = [64]byte{0: 1, 16: 64, 18: 32, 20: 64, 48: 16, 49: 16, 50: 8}

// amxDot32 is the AMX dot kernel; a test runs the drivers with a Go
// function of the same contract where the CPU has no AMX.
var amxDot32 = qamx32R16

// qKernelsAMX are qKernelsAVX512 with the AMX dot kernel for groups of 16
// activation rows.
var qKernelsAMX = func() *qKernelSet {
	s := *qKernelsAVX512
	s.amx = true
	return &s
}()

func qmmAMX(a *qAct, w *Mat, lo, hi int, out []float32) { qKernelsAMX.run(a, w, lo, hi, out) }

// isDot32 reports whether dot is the AVX512-VNNI dot kernels of 32-weight
// blocks (the panel32 layout qamx32R16 reads).
func isDot32(dot []qdot) bool { return len(dot) > 0 && &dot[0] == &dot32AVX512[0] }

// amxPrepare arranges the per-block records of a's first a.m/16·16 rows
// (a Q8_0, Q4_0 or Q5_0 product's: dx and the correction per 32-block) as
// qamx32R16 reads them, per group of 16 rows and block the 16 scales then
// the 16 corrections, into sc.amxMeta, and returns those rows' count (0
// under 16).
func amxPrepare(sc *qScratch, a *qAct) int {
	rows := a.m / amxGroup * amxGroup
	if rows == 0 {
		return 0
	}
	nb := a.k / 32
	n := rows * nb * 2
	if cap(sc.amxMeta) < n {
		sc.amxMeta = make([]uint32, n)
	}
	meta := sc.amxMeta[:n]
	for i := range rows {
		g, r := i/amxGroup, i%amxGroup
		src := a.meta[i*nb*2 : (i+1)*nb*2]
		for b := range nb {
			dst := meta[(g*nb+b)*32:]
			dst[r], dst[amxGroup+r] = src[2*b], src[2*b+1]
		}
	}
	return rows
}

// amxDots continues the chains in acc (16 a row) of the first rows
// activation rows (amxPrepare's) over the 32-blocks [b0, b0+c), whose
// panel32 panel is at panel.
func amxDots(sc *qScratch, a *qAct, rows, b0, c int, panel *byte, acc []float32) {
	nb := a.k / 32
	for i := 0; i < rows; i += amxGroup {
		amxDot32(&a.xq[i*a.k+b0*32], a.k, &sc.amxMeta[(i/amxGroup*nb+b0)*32], panel, c, &acc[i*16], &amxConfig32[0], &sc.amxTile[0])
	}
}

// amxAvailable reports whether this CPU and OS run AMX-INT8.
func amxAvailable() bool {
	s := DetectAMX()
	return s.Tile && s.Int8 && s.Permitted
}

var amxCheck struct {
	once sync.Once
	err  error
}

// AMXSelfCheck reports why the AMX kernels are not used here, or nil: it
// runs amxSelfCheck (once).
func AMXSelfCheck() error { return amxSelfCheck() }

// amxSelfCheck runs one product of each format the AMX kernel takes
// (Q8_0, Q4_0 and Q5_0 as panels and as rows; 33 activation rows,
// so that two groups and a remainder run) with the AMX kernels and the
// AVX512-VNNI ones and returns an error unless every output is
// bit-identical: a CPU where they differ keeps the VNNI kernels. It runs
// once.
func amxSelfCheck() error {
	amxCheck.once.Do(func() {
		if !amxAvailable() || !hasPanelKernels {
			amxCheck.err = errors.New("tensor: AMX-INT8 and AVX512-VNNI are not both available here: " + DetectAMX().String())
			return
		}
		amxCheck.err = amxCompare(qmmAMX, qmmAVX512, qmmPanelsAMX, qmmPanels)
	})
	return amxCheck.err
}

// amxCompare multiplies random Q8_0, Q4_0 and Q5_0 matrices (K = 2,048:
// more blocks than one chunk of the drivers) by 33 random activation rows
// with amx and vnni (and stored as panels, Q4_0's and Q5_0's widened for
// the AMX kernel, with amxPanels and vnniPanels) and returns an error
// naming the first output that differs.
func amxCompare(amx, vnni, amxPanels, vnniPanels func(a *qAct, w *Mat, lo, hi int, out []float32)) error {
	const m, n, k = 33, 32, 2048
	rng := rand.New(rand.NewPCG(7, 11))
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ks := defaultSet()
	for _, dt := range []DType{Q8_0, Q4_0, Q5_0} {
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
