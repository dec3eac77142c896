package main

// The AVX-512 one-row (decode) kernels gemmAVX512<dtype>R1: wideCols weight
// rows a pass, one from each of wideCols streams (three base registers:
// gemm.go's strided8), the K loop unrolled twice, each stream prefetched
// into the L2 wideDist ahead; the leftover rows go through gemm.go's
// passes. dpbf16.go's one-row kernel shares the body
// (wideKernel.emitWide) with its own loads and products.

import (
	"fmt"
	"math/bits"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// wideCols is the number of weight rows the AVX-512 one-row kernel reads
// per pass: one from each of wideCols streams.
const wideCols = 8

// wideDist is how far ahead in each stream the AVX-512 one-row kernels
// prefetch into the L2 (PREFETCHT1, the lines of the next unrolled trip's
// distance), as the VNNI row kernels do: on a Zen 4, one thread, bf16
// decode from DRAM went from 71–90% to 89–101% of the read beside it and
// f32 from 81–85% to 87–101% (tandem bench model, llama-1b layers);
// qwen3-0.6b bf16 decoded 12% faster on one thread. 4, 8 and 16 KiB were
// alike there; 4 KiB ran SmolLM2's short matrices fastest on two threads
// (docs/performance-log.md).
const wideDist = 4 << 10

// wideTrip is how many bytes of each stream one trip of the AVX-512 one-row
// kernels' K loop reads: two lines. f32 and bf16-by-bf16 took two vector
// steps a trip from the first; the widened 16-bit weights (f16, and bf16 in
// the avx512 set) took two steps, one line, until a Zen 4 measured four
// steps faster: f16 decode on one thread read 24.1–26.3 GB/s with two,
// 25.9–27.4 with four (tandem bench model, alternated; eight: no better).
const wideTrip = 128

// wideKernel is what tells the AVX-512 one-row kernels apart (gemmWideR1:
// f32 x by f32, bf16 or f16 weights with FMAs; gemmDPR1: bf16 by bf16 with
// VDPBF16PS); emitWide emits the body they share.
type wideKernel struct {
	elems  int   // elements per vector step: 16 f32 lanes, or 32 bf16
	wshift uint8 // log2 of the bytes per weight element
	xsize  int   // bytes per x element
	// loadW and loadX load one step's weights or x at m into dst; with a
	// mask the masked-off elements are zero and not read.
	loadW, loadX func(m Mem, dst VecVirtual, mask Op)
	madd         func(w, x, acc VecVirtual) // acc += the products of w and x
	// pass emits the ordinary kernel's pass over cols weight rows (labels
	// prefixed p), for the rows left over; kv is k rounded down to a step.
	pass func(cols int, kv Register, p string)
}

// emitWide emits a one-row kernel's body from label wide on. A call's n
// rows are split into wideCols streams, as gemvAVX2 splits them: with
// q = n/wideCols, stream c is rows c·q … c·q+q-1, and pass j reads row j
// of every stream (one accumulator a row, the K loop unrolled to read
// wideTrip bytes of each stream a trip,
// the steps left by halves, the masked tail step with mask, the fixed
// tree), so each
// stream runs through q·ldw contiguous elements. Eight adjacent rows read
// as one region, prefetched a pass ahead, streamed SmolLM2's short rows
// (1,152 bytes) from DRAM at two thirds of the rate eight long streams
// reach on a Zen 4 (docs/performance-log.md). Rows 8q … n-1 follow four and
// one at a time through pass; then the return. x is the x row's register
// and k its length. Each output is the same sum in the same order as
// before: only the order of the rows changes.
func (w wideKernel) emitWide(k, wcur, ocur, nrem Register, x GPVirtual, mask Op) {
	const cols = wideCols
	wsize := 1 << w.wshift
	// The passes left, the streams' stride in weight bytes (q rows) and in
	// output bytes (q outputs) live on the stack: the K loop needs the
	// registers.
	nsteps := wideTrip / (w.elems << w.wshift) // vector steps a trip
	passM, wstrM, ostrM := AllocLocal(8), AllocLocal(8), AllocLocal(8)
	{
		q := GP64()
		MOVQ(nrem, q)
		SHRQ(U8(3), q)
		MOVQ(q, passM)
		wstr := Load(Param("ldw"), GP64())
		SHLQ(U8(w.wshift), wstr)
		IMULQ(q, wstr)
		MOVQ(wstr, wstrM)
		SHLQ(U8(2), q)
		MOVQ(q, ostrM)
	}
	Label("wide")
	CMPQ(passM, U8(0))
	JE(LabelRef("wdone"))
	{
		// Row c of the pass: stream c's, its stride apart.
		S := GP64()
		MOVQ(wstrM, S)
		bases, rowMem := strided8(wcur, S)
		xp := GP64()
		MOVQ(x, xp)
		cnt := GP64() // trips of two steps
		MOVQ(k, cnt)
		SHRQ(U8(bits.TrailingZeros(uint(nsteps*w.elems))), cnt)

		acc := make([]VecVirtual, cols)
		for c := range acc {
			acc[c] = ZMM()
			VXORPS(acc[c], acc[c], acc[c])
		}
		step := func(disp int, m Op) {
			ws := make([]VecVirtual, cols)
			for c := range ws {
				ws[c] = ZMM()
				w.loadW(rowMem(c, wsize*disp), ws[c], m)
			}
			xv := ZMM()
			w.loadX(Mem{Base: xp, Disp: w.xsize * disp}, xv, m)
			for c := range cols {
				w.madd(ws[c], xv, acc[c])
			}
		}
		advance := func(elems int) {
			for _, b := range bases {
				ADDQ(U32(wsize*elems), b)
			}
			ADDQ(U32(w.xsize*elems), xp)
		}
		steps := func(n int) {
			for j := range n {
				step(j*w.elems, nil)
			}
			advance(n * w.elems)
		}
		TESTQ(cnt, cnt)
		JE(LabelRef(fmt.Sprintf("wleft%d", nsteps/2)))
		Label("wloop")
		for c := range cols {
			for l := 0; l < nsteps*w.elems<<w.wshift; l += 64 {
				PREFETCHT1(rowMem(c, wideDist+l))
			}
		}
		steps(nsteps)
		DECQ(cnt)
		JNE(LabelRef("wloop"))
		for h := nsteps / 2; h >= 1; h /= 2 {
			// The k%(2h·elems) ≥ h·elems steps left.
			Label(fmt.Sprintf("wleft%d", h))
			next := "wtail"
			if h > 1 {
				next = fmt.Sprintf("wleft%d", h/2)
			}
			TESTQ(U32(h*w.elems), k)
			JE(LabelRef(next))
			steps(h)
		}
		Label("wtail")
		TESTQ(U32(w.elems-1), k)
		JE(LabelRef("wreduce"))
		step(0, mask)
		Label("wreduce")
		// Stream c's output is at ocur + c·ostr.
		ostr := GP64()
		MOVQ(ostrM, ostr)
		_, outMem := strided8(ocur, ostr)
		for g := 0; g < cols; g += 4 {
			sums := quadSums512([][]VecVirtual{acc[g : g+4]})[0]
			for i := range 4 {
				m := outMem(g+i, 0)
				if i == 0 {
					VMOVSS(sums, m)
				} else {
					VEXTRACTPS(U8(i), sums, m)
				}
			}
		}
		ADDQ(U32(4), ocur)
		L := Load(Param("ldw"), GP64())
		SHLQ(U8(w.wshift), L)
		ADDQ(L, wcur)
	}
	DECQ(passM)
	JMP(LabelRef("wide"))
	Label("wdone")
	// The rows left start 7 strides past where stream 0 ended.
	{
		t := GP64()
		MOVQ(wstrM, t)
		IMUL3Q(U8(7), t, t)
		ADDQ(t, wcur)
		MOVQ(ostrM, t)
		IMUL3Q(U8(7), t, t)
		ADDQ(t, ocur)
		ANDQ(U8(cols-1), nrem)
	}

	Label("quad")
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-w.elems), kv)
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	w.pass(4, kv, "q")
	SUBQ(U32(4), nrem)
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	w.pass(1, kv, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// gemmWideR1 emits the AVX-512 one-row (decode) kernel. It is memory
// bound, so it reads wideCols weight rows per pass, one from each of
// wideCols long streams the hardware prefetchers follow (emitWide), and
// unrolls the K loop twice. Each weight row still has exactly one
// accumulator marching over K in steps of 16, then the masked tail, then
// the fixed reduction tree, so every output is bit-identical to the one
// the multi-row tiles compute. Leftover rows (n % wideCols) go through a
// 4-wide and a 1-wide pass of the ordinary kernel.
func gemmWideR1(s isa, dt dtype) {
	name := fmt.Sprintf("gemm%s%sR1", s.name, dt.name)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(x *float32, ldx int, w %s, ldw int, k int, n int, out *float32, ldo int, pf uintptr)", dt.goType))
	Doc(fmt.Sprintf("%s computes 1 row of x times n rows of %s weights (see asmgen).", name, dt.name))

	k := Load(Param("k"), GP64())
	mask := tailMask(k)
	xr := []GPVirtual{Load(Param("x"), GP64()).(GPVirtual)}
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())

	wideKernel{
		elems:  s.lanes,
		wshift: dt.shift,
		xsize:  4,
		loadW:  func(m Mem, dst VecVirtual, mask Op) { loadW(s, dt, m, dst, mask) },
		loadX:  func(m Mem, dst VecVirtual, mask Op) { loadW(s, dtF32, m, dst, mask) },
		madd:   func(w, x, acc VecVirtual) { VFMADD231PS(w, x, acc) },
		pass: func(cols int, kv Register, p string) {
			gemmPass(s, dt, 1, cols, xr, wcur, ocur, k, kv, mask, p)
		},
	}.emitWide(k, wcur, ocur, nrem, xr[0], mask)
}
