package tensor

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// gemmF32 and gemmU16 are the signatures of the matrix kernels: they compute
// out[r*ldo+j] = Σ_t x[r*ldx+t]·w[j*ldw+t] for r < rows (fixed per kernel),
// j < n and t < k. ldx, ldw and ldo count elements. The caller guarantees
// that every addressed element is in bounds.
type (
	gemmF32 func(x *float32, ldx int, w *float32, ldw, k, n int, out *float32, ldo int, pf uintptr)
	gemmU16 func(x *float32, ldx int, w *uint16, ldw, k, n int, out *float32, ldo int, pf uintptr)
	// gemmF32KB and gemmU16KB are gemmF32 and gemmU16 over elements
	// [k0,k1) of K (k0 < k1, multiples of 8, k1 ≤ k&^7), each output's
	// 8-lane accumulator starting from zero when k0 = 0 and from acc
	// otherwise, and going back to acc after the block, or, when k1 is
	// k&^7, through the kernel's tree and K%8 tail to out: acc holds 8
	// floats per output, weight row j and x row r at acc[(j·rows+r)·8:].
	gemmF32KB func(x *float32, ldx int, w *float32, ldw, k0, k1, k, n int, out *float32, ldo int, acc *float32)
	gemmU16KB func(x *float32, ldx int, w *uint16, ldw, k0, k1, k, n int, out *float32, ldo int, acc *float32)
	// gemmBF16x is gemmU16 with the activations already rounded to bf16.
	gemmBF16x func(x *uint16, ldx int, w *uint16, ldw, k, n int, out *float32, ldo int, pf uintptr)
)

// maxTileRows is the largest number of x rows one matrix kernel handles.
const maxTileRows = 4

// kernelSet is one implementation of the kernels: every dot product it
// computes has one fixed accumulation structure, so its results are
// batch invariant (see asmgen for the assembly variants).
type kernelSet struct {
	name string
	// f32, bf16 and f16 hold the matrix kernels for 1..maxTileRows x rows
	// (index rows-1).
	f32  [maxTileRows]gemmF32
	bf16 [maxTileRows]gemmU16
	f16  [maxTileRows]gemmU16
	// f32KB and u16KB[0] (bf16) and u16KB[1] (f16), when set, are the
	// 3- and 4-row kernels (index rows-3) over one block of K, for K above
	// kBlockMin (see matmulBlocked).
	f32KB     [2]gemmF32KB
	u16KB     [2][2]gemmU16KB
	kBlockMin int
	// bf16x, when set, replaces bf16: MatMul rounds the activations to
	// bf16 with toBF16 (nearest even) and multiplies bf16 by bf16.
	bf16x  [maxTileRows]gemmBF16x
	toBF16 func(x *float32, out *uint16, n int)
	// toBF16Stream, if set, is toBF16 with non-temporal stores for n a
	// multiple of 16 and out 32-byte aligned.
	toBF16Stream func(x *float32, out *uint16, n int)
	// cols is the number of weight rows the widest kernel processes per
	// pass; the matrix driver aligns its work split to it.
	cols int
	// panelF32, if set, replaces panelBytesF32 for f32 weights.
	panelF32 int
	dot      func(a, b *float32, n int) float32
	axpy     func(alpha float32, x, y *float32, n int)
	// axpyRows, if set, is rows calls of axpy with y kept in registers
	// (bit-identical to them); nil means call axpy per row.
	axpyRows func(alpha, v *float32, ldv, rows int, y *float32, n int)
	// axpyRowsBF16, if set, is axpyRows over bf16 rows widened to f32;
	// nil means widen each row and call axpy.
	axpyRowsBF16 func(alpha *float32, v *uint16, ldv, rows int, y *float32, n int)
	// axpyRowsBF16G[g-2], if set, is axpyRowsBF16 for g = 2..4 outputs
	// sharing the value rows (AxpyRowsBF16Group).
	axpyRowsBF16G [maxTileRows - 1]func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)
	// axpyRowsG[g-2], if set, is axpyRows for g = 2..4 outputs sharing the
	// value rows (AxpyRowsGroup).
	axpyRowsG [maxTileRows - 1]func(alpha *float32, lda int, v *float32, ldv, rows int, y *float32, ldy, n int)
	// silu computes gate[t] = silu(gate[t])·up[t]; expSum computes
	// x[t] = e^(x[t]-mx) and returns the sum.
	silu   func(gate, up *float32, n int)
	expSum func(x *float32, n int, mx float32) float32
	// argMax and appendAbove, if set, are the scans of ArgMax and
	// AppendAbove (see their kernels in asmgen); nil means the Go loops.
	argMax      func(x *float32, n int) int
	appendAbove func(x *float32, n int, t float32, dst *int32) int
	// qmm, if set, computes the quantized matrix product for weight rows
	// [lo,hi) (see qmmGo, its definition); nil means qmmGo.
	qmm func(a *qAct, w *Mat, lo, hi int, out []float32)
	// qmmName names qmm among quantKernels ("go" when qmm is nil).
	qmmName string
	// amx says that qmm is the "amx" kernels, so that panel-stored
	// matrices run qmmPanelsAMX too.
	amx bool
	// amxBF16 says that bf16 weights whose shape fits (amxBF16Fits) are
	// multiplied with AMX-BF16 for every batch (the amxbf16 set).
	amxBF16 bool
	// qmmRow[d], if set, replaces qmm for products of weights of dtype d
	// with one activation row (a lone sequence's decode token), where
	// other kernels may stream the weights faster than those that are
	// fastest with many rows, and faster for one format than another;
	// qmmRowName[d] names it. Nil means qmm (see withQuants).
	qmmRow     [numDTypes]func(a *qAct, w *Mat, lo, hi int, out []float32)
	qmmRowName [numDTypes]string
	// qactQ8_0 and qactQ8K, if set, quantize nb blocks of activations
	// exactly as quantizeActQ8_0 and quantizeActQ8K do (for finite
	// values); nil means the Go loops.
	qactQ8_0 func(x *float32, nb int, q *int8, meta *uint32, corrMul int)
	qactQ8K  func(x *float32, nb int, q *int8, meta *uint32)
	// attnScores[r-1], attnSoftmax and attnPV, if set, are the kernels of
	// the bf16 attention path (attn.go); they come with bf16x.
	attnScores  [maxTileRows]func(q *uint16, ldq int, k *uint32, groups, steps int, out *float32, ldo int)
	attnSoftmax func(s *float32, lds, rows, n int, m, l, acc *float32, lda, hd int, w *uint16, ldw int)
	attnPV      func(acc *float32, lda int, w *uint16, ldw, rows int, v *uint16, offs *int, n, hd int)
	// attnScoresF32[r-1], if set, scores r query rows against keys packed
	// transposed in f32 (AttnScoresF32), bit-identical to this set's
	// DotRowsBF16 and DotRows.
	attnScoresF32 [attnF32Rows]func(q *float32, ldq int, k *float32, pairs, hd int, out *float32, ldo int)
	// attnKeys[r-1], if set, scores r f32 query rows against groups of 8
	// bf16 key rows in place (AttnKeyScoresBF16), bit-identical to this
	// set's DotRowsBF16; attnKeysPf[r-1] likewise, prefetching lines from
	// k + pf bytes on (AttnKeyScoresBF16Prefetch).
	attnKeys   [attnF32Rows]func(q *float32, ldq int, k *uint16, ldk, groups, hd int, out *float32, ldo int)
	attnKeysPf [attnF32Rows]func(q *float32, ldq int, k *uint16, ldk, groups, hd int, out *float32, ldo, pf int)
	// attnValues[g-2], if set, is axpyRowsBF16G[g-2] prefetching lines
	// from v + pf bytes on (AttnValuesBF16).
	attnValues [maxTileRows - 1]func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n, pf int)
	// attnKeysStream[r-1] and attnPVStream, if set, are bf16x[r-1] and
	// attnPV that also prefetch a KVStream (attnstream.go), bit-identical.
	attnKeysStream [maxTileRows]func(x *uint16, ldx int, w *uint16, ldw, k, n int, out *float32, ldo int, pf, pfEnd, pfNext uintptr)
	attnPVStream   func(acc *float32, lda int, w *uint16, ldw, rows int, v *uint16, offs *int, n, hd int, pf, pfEnd, pfNext uintptr)
	avail          bool
}

// kernelSets lists the implementations in order of preference: the
// architecture's assembly variants, then the pure-Go one.
var kernelSets = append(archKernelSets(), genericSet())

// active is the kernel set in use.
var active atomic.Pointer[kernelSet]

func init() {
	for _, ks := range kernelSets {
		if ks.avail {
			active.Store(ks)
			break
		}
	}
}

// ISA names the kernel implementation in use: "avx512", "avx2" or "go".
// Two processes produce bit-identical results only if their ISA is the
// same, so engines that exchange KV cache state should compare it.
func ISA() string { return active.Load().name }

// ISAs lists the kernel implementations this machine can run, best first.
func ISAs() []string {
	var names []string
	for _, ks := range kernelSets {
		if ks.avail {
			names = append(names, ks.name)
		}
	}
	return names
}

// SetISA selects the kernel implementation by name (one of ISAs). It is
// meant for start-up and tests: kernels running concurrently with SetISA
// may use either implementation.
func SetISA(name string) error {
	for _, ks := range kernelSets {
		if ks.name == name {
			if !ks.avail {
				return fmt.Errorf("tensor: ISA %q is not supported by this CPU (supported: %v)", name, ISAs())
			}
			active.Store(ks)
			return nil
		}
	}
	return fmt.Errorf("tensor: unknown ISA %q (supported: %v)", name, ISAs())
}

// genericSet returns the pure-Go kernels. Every dot product is dotGo over
// widened weights, whatever the kernel, so they are batch invariant.
func genericSet() *kernelSet {
	ks := &kernelSet{name: "go", qmmName: "go", cols: 1, avail: true, dot: dotGoPtr, axpy: axpyGoPtr, silu: siluGoPtr, expSum: expSumGoPtr}
	for r := range maxTileRows {
		rows := r + 1
		ks.f32[r] = func(x *float32, ldx int, w *float32, ldw, k, n int, out *float32, ldo int, _ uintptr) {
			xs, ws, os := views(x, ldx, rows, k), unsafe.Slice(w, span(ldw, n, k)), unsafe.Slice(out, span(ldo, rows, n))
			for j := range n {
				wr := ws[j*ldw : j*ldw+k]
				for i := range rows {
					os[i*ldo+j] = dotGo(xs[i*ldx:i*ldx+k], wr)
				}
			}
		}
		ks.bf16[r] = genericU16(rows, BF16ToF32)
		ks.f16[r] = genericU16(rows, F16ToF32)
	}
	return ks
}

// genericU16 returns a pure-Go kernel for 16-bit weights widened by widen.
func genericU16(rows int, widen func(uint16) float32) gemmU16 {
	return func(x *float32, ldx int, w *uint16, ldw, k, n int, out *float32, ldo int, _ uintptr) {
		xs, ws, os := views(x, ldx, rows, k), unsafe.Slice(w, span(ldw, n, k)), unsafe.Slice(out, span(ldo, rows, n))
		row := make([]float32, k)
		for j := range n {
			for t, b := range ws[j*ldw : j*ldw+k] {
				row[t] = widen(b)
			}
			for i := range rows {
				os[i*ldo+j] = dotGo(xs[i*ldx:i*ldx+k], row)
			}
		}
	}
}

// span is the number of elements addressed by rows rows of length cols at
// stride ld.
func span(ld, rows, cols int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// views returns the rows×k elements at x with row stride ld as a slice.
func views(x *float32, ld, rows, k int) []float32 { return unsafe.Slice(x, span(ld, rows, k)) }

// dotGo is the pure-Go dot product: four interleaved partial sums over
// groups of four, combined as (s0+s1)+(s2+s3), then the tail in order. The
// explicit float32 conversions forbid the compiler from fusing the
// multiplies and adds, so the result does not depend on GOAMD64.
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	n4 := len(a) &^ 3
	for t := 0; t < n4; t += 4 {
		s0 += float32(a[t] * b[t])
		s1 += float32(a[t+1] * b[t+1])
		s2 += float32(a[t+2] * b[t+2])
		s3 += float32(a[t+3] * b[t+3])
	}
	s := (s0 + s1) + (s2 + s3)
	for t := n4; t < len(a); t++ {
		s += float32(a[t] * b[t])
	}
	return s
}

func dotGoPtr(a, b *float32, n int) float32 {
	return dotGo(unsafe.Slice(a, n), unsafe.Slice(b, n))
}

// axpyGo computes y[t] += alpha·x[t] without fusing (see dotGo).
func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for t, v := range x {
		y[t] += float32(alpha * v)
	}
}

func axpyGoPtr(alpha float32, x, y *float32, n int) {
	axpyGo(alpha, unsafe.Slice(x, n), unsafe.Slice(y, n))
}

func siluGoPtr(gate, up *float32, n int) {
	g, u := unsafe.Slice(gate, n), unsafe.Slice(up, n)
	for i, v := range g {
		g[i] = v / (1 + expf(-v)) * u[i]
	}
}

func expSumGoPtr(x *float32, n int, mx float32) float32 {
	var sum float32
	xs := unsafe.Slice(x, n)
	for i, v := range xs {
		e := expf(v - mx)
		xs[i] = e
		sum += e
	}
	return sum
}
