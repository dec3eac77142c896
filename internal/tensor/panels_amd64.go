package tensor

import (
	"math"
	"unsafe"
)

// panelKernels reports whether this CPU runs the AVX512-VNNI kernels that
// read the panels.
func panelKernels() bool { return hasPanelKernels }

// hasPanelKernels is panelKernels' answer, asked of CPUID once.
var hasPanelKernels = func() bool {
	for _, q := range archQuantKernels() {
		if q.name == "avx512vnni" {
			return q.avail
		}
	}
	return false
}()

// panelSet is the kernels of a dtype stored as panels: the pack kernel
// from ggml's rows (16 weight rows a call) and the dot kernels over the
// panels (dot[r-1] takes r activation rows); for products of more than
// widenAbove rows, optionally a kernel that widens a chunk of the panel
// into the pack kernels' layout that the qmm kernels read (wide).
type panelSet struct {
	pack       qpack
	dot        []qdot
	widen      func(src *byte, nb int, dst *byte, pf uintptr)
	wide       qTypeKernels
	widenAbove int
}

// panelSets are the kernels of each dtype stored as panels. Q8_0's are the
// AVX-512 kernels' own; the others keep ggml's bytes (asmgen's quant32.go,
// quantk.go, quantkdot.go, quantk5n.go, quantk6n.go). The 5- and 6-bit
// kernels make each level whole once for all the rows of a pass, which
// pays for itself up to widenAbove rows (one llama-1b layer, one Zen 4
// thread, GFLOP/s unwidened against widened; docs/performance-log.md):
// Q5_0 12 rows 209–215 against 202–205, 16 alike, 32 rows 261–265
// against 268–277, 128 rows 299–301 against 321–325; Q6_K 24 rows 249–253
// against 231–234, 48 rows 258–260 against 264–267, 128 rows 268–271
// against 291–292; Q5_K (passes of its 4-row kernel) 12 rows 213–218
// against 162–180, 16 rows 234–238 against 205–208, 32 rows alike, 128
// rows 302–303 against 317–321. Q4_0's and Q4_K's nibbles are unpacked
// faster than widened at every size (Q4_0: 8 rows 220–252 against 174–184,
// 16 rows 266–275 against 236–240, 32 rows 303–315 against 281–291, 128
// rows alike; Q4_K: 8 rows 205–221 against 181–186, 16 rows 252–267
// against 229–240, 32 rows 289–298 against 283–289, 128 rows 329–333
// against 317–332): they widen only for the AMX kernels, which read the
// pack kernels' layouts.
var panelSets = map[DType]panelSet{
	Q8_0: {pack: qpackQ8_0AVX512, dot: dot32AVX512},
	Q4_0: {pack: qpackQ4_0NAVX512, dot: []qdot{qdot40NAVX512R1, qdot40NAVX512R2, qdot40NAVX512R3, qdot40NAVX512R4,
		qdot40NAVX512R5, qdot40NAVX512R6, qdot40NAVX512R7, qdot40NAVX512R8},
		widen: qwidenQ4_0NAVX512, wide: qKernelsAVX512.types[Q4_0], widenAbove: math.MaxInt},
	Q5_0: {pack: qpackQ5_0NAVX512, dot: []qdot{qdot50NAVX512R1, qdot50NAVX512R2, qdot50NAVX512R3, qdot50NAVX512R4,
		qdot50NAVX512R5, qdot50NAVX512R6, qdot50NAVX512R7, qdot50NAVX512R8},
		widen: qwidenQ5_0NAVX512, wide: qKernelsAVX512.types[Q5_0], widenAbove: 16},
	Q4_K: {pack: qpackQ4_KNAVX512, dot: []qdot{qdotK4NAVX512R1, qdotK4NAVX512R2, qdotK4NAVX512R3, qdotK4NAVX512R4, qdotK4NAVX512R5, qdotK4NAVX512R6},
		widen: qwidenQ4_KNAVX512, wide: qKernelsAVX512.types[Q4_K], widenAbove: math.MaxInt},
	Q6_K: {pack: qpackQ6_KNAVX512, dot: []qdot{qdot6NAVX512R1, qdot6NAVX512R2, qdot6NAVX512R3, qdot6NAVX512R4},
		widen: qwidenQ6_KNAVX512, wide: qKernelsAVX512.types[Q6_K], widenAbove: 32},
	Q5_K: {pack: qpackQ5_KNAVX512, dot: []qdot{qdotK5NAVX512R1, qdotK5NAVX512R2, qdotK5NAVX512R3, qdotK5NAVX512R4},
		widen: qwidenQ5_KNAVX512, wide: qKernelsAVX512.types[Q5_K], widenAbove: 32},
}

// packPanels packs m's 16-row groups into dst with its dtype's pack
// kernel, each call prefetching the next group's rows.
func packPanels(m *Mat, dst []byte) {
	block, elems := panelBlock(m.DType)
	rb, _ := m.DType.RowBytes(m.Cols)
	nb, _ := m.DType.BlockSize()
	nb = m.Cols / nb // ggml's blocks a row
	group := m.Cols / elems * block
	pack := panelSets[m.DType].pack
	for g := range m.Rows / 16 {
		next := uintptr(unsafe.Pointer(&m.Q[min((g+1)*16*rb, len(m.Q)-1)]))
		pack(&m.Q[g*16*rb], rb, nb, &dst[g*group], next)
	}
}

// qmmPanels is qmm for a panel-stored w: rows [lo, hi), multiples of 16,
// by the AVX-512 dot kernels straight over the stored panels (no pack), a
// chunk of blocks at a time so that the panel stays in cache while the
// activation rows pass over it; or, where the dtype has a widen kernel and
// m is more than its widenAbove rows, by the qmm kernels over each chunk
// widened into scratch.
func qmmPanels(a *qAct, w *Mat, lo, hi int, out []float32) { qmmPanelsWith(a, w, lo, hi, out, false) }

// qmmPanelsAMX is qmmPanels with an AMX kernel for each group of 16
// activation rows (Q8_0 as stored; the other formats widened).
func qmmPanelsAMX(a *qAct, w *Mat, lo, hi int, out []float32) { qmmPanelsWith(a, w, lo, hi, out, true) }

func qmmPanelsWith(a *qAct, w *Mat, lo, hi int, out []float32, amx bool) {
	set := panelSets[w.DType]
	dot := set.dot
	block, elems := panelBlock(w.DType)
	k, m := a.k, a.m
	nb := k / elems
	words, metaElems := metaWords(w.DType)
	words *= elems / metaElems // the activation's meta words per panel block
	chunk := max(1, qPanelTarget/block)
	if m <= len(dot) {
		chunk = nb // one pass over the panel: nothing to keep in cache
	}
	sc := qScratches.Get().(*qScratch)
	defer qScratches.Put(sc)
	if cap(sc.acc) < m*16 {
		sc.acc = make([]float32, m*16)
	}
	acc := sc.acc[:m*16]
	var wide []byte
	per := 1 // ggml's blocks in a panel block, widened
	// The AMX kernel reads the pack kernels' layout: with it, a dtype
	// that can be widened is, from one group of 16 activation rows.
	if set.widen != nil && (m > set.widenAbove || amx && m >= amxGroup) {
		bs, _ := w.DType.BlockSize()
		per = elems / bs
		dot = set.wide.dot
		chunk = max(1, qPanelTarget/(per*set.wide.panelBytes))
		wide = aligned64(&sc.panel, min(chunk, nb)*per*set.wide.panelBytes)
	}
	var ad *amxDot
	amxRows := 0
	if amx {
		ad, amxRows = amxFor(dot, a)
	}
	for g := lo / 16; g < hi/16; g++ {
		clear(acc)
		panel := w.Q[g*nb*block:]
		for b0 := 0; b0 < nb; b0 += chunk {
			c := min(chunk, nb-b0)
			p := &panel[b0*block]
			if wide != nil {
				// Prefetch the next chunk, of this group or the next,
				// while this one is computed on.
				next := min((g*nb+b0+c)*block, len(w.Q)-1)
				set.widen(p, c, &wide[0], uintptr(unsafe.Pointer(&w.Q[next])))
				p = &wide[0]
			}
			if amxRows > 0 {
				amxRun(sc, a, ad, amxRows, b0*elems/ad.elems, c*elems/ad.elems, p, acc)
			}
			for i := amxRows; i < m; i += len(dot) {
				r := min(len(dot), m-i)
				dot[r-1](&a.xq[i*k+b0*elems], k, &a.meta[(i*nb+b0)*words], nb*words*4, p, c*per, &acc[i*16])
			}
		}
		storeAcc(out[g*16:], w.Rows, acc, 16, 16, m)
	}
}
