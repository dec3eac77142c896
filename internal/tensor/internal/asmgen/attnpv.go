package main

// The avx512bf16 attention's weighted value sum over key pairs (attnPVDP,
// see attn.go for the three kernels) and its word-permutation table
// (pvIndex).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// pvIndex is the word-permutation table of attnPVDP: its first vector
// interleaves words 0..15 of two tables (word 2i from the first, 2i+1 from
// the second), its second words 16..31.
func pvIndex() Mem {
	t := GLOBL("pvindex", RODATA|NOPTR)
	for half := range 2 {
		for i := range 16 {
			off := half*64 + 4*i
			DATA(off, U16(uint16(16*half+i)))
			DATA(off+2, U16(uint16(32+16*half+i)))
		}
	}
	return t
}

// attnPV emits the weighted value sum over key pairs: for rows r < rows,
// t < hd and pairs (j, j+1), j = 0, 2, 4, ... < n in order, with value row
// j at v + offs[j] (elements; rows anywhere, as the blocks of a paged KV
// pool are),
//
//	acc[r·lda+t] += w[r·ldw+j]·v[offs[j]+t] + w[r·ldw+j+1]·v[offs[j+1]+t]
//
// as one VDPBF16PS lane (weights and values bf16). With n odd the last
// pair's second value is zero and its row is not read (w[r·ldw+n] must be
// zero). Dimensions are walked in blocks of 32, then 16, then a masked
// block; rows in blocks of 8 and one of the rest, with the accumulators in
// registers across all pairs, so each pair of value rows is loaded and
// interleaved (VPERMT2W) once per block of rows.
func attnPV(idx Mem) {
	TEXT("attnPVDP", NOSPLIT, "func(acc *float32, lda int, w *uint16, ldw int, rows int, v *uint16, offs *int, n int, hd int)")
	Doc("attnPVDP adds to rows accumulator rows the n value rows v[offs[j]:] weighted by bf16 weights, over key pairs with VDPBF16PS (see asmgen).")
	attnPVBody(idx, false)
}

// attnPVStream emits attnPV's kernel that also prefetches the KV stream at
// pf (streamLines): every pair step of a block of 32 dimensions two lines,
// of 16 (or fewer) one, the bytes the step reads (its odd last pair none).
// The arithmetic is attnPV's, instruction for instruction.
func attnPVStream(idx Mem) {
	TEXT("attnPVDPStream", NOSPLIT, "func(acc *float32, lda int, w *uint16, ldw int, rows int, v *uint16, offs *int, n int, hd int, "+streamParams+")")
	Doc("attnPVDPStream is attnPVDP prefetching the KV stream at pf, as many lines a pair step as it reads (see asmgen).")
	attnPVBody(idx, true)
}

// attnPVBody is the body of attnPV and attnPVStream (stream).
func attnPVBody(idx Mem, stream bool) {
	idxLo, idxHi := ZMM(), ZMM()
	VMOVDQU16(idx, idxLo)
	VMOVDQU16(idx.Offset(64), idxHi)
	doff := GP64() // element offset of the dimension block
	XORQ(doff, doff)
	// left returns the number of dimensions from doff on.
	left := func() GPVirtual {
		d := Load(Param("hd"), GP64()).(GPVirtual)
		SUBQ(doff, d)
		return d
	}

	block := func(lbl string, dims, rb int, mask Op, ar, wr Register) {
		nv := dims / 16
		var half OpmaskVirtual
		if dims == 16 && mask == nil {
			g := GP32()
			MOVL(U32(0xffff), g)
			half = K()
			KMOVW(g, half)
		}
		lda := Load(Param("lda"), GP64())
		SHLQ(U8(2), lda)
		acc := make([][]VecVirtual, rb)
		arow := GP64()
		MOVQ(ar, arow)
		for r := range rb {
			acc[r] = make([]VecVirtual, nv)
			for c := range nv {
				acc[r][c] = ZMM()
				if mask == nil {
					VMOVUPS(Mem{Base: arow, Disp: 64 * c}, acc[r][c])
				} else {
					VMOVUPS_Z(Mem{Base: arow}, mask, acc[r][c])
				}
			}
			if r+1 < rb {
				ADDQ(lda, arow)
			}
		}
		ldw := Load(Param("ldw"), GP64())
		SHLQ(U8(1), ldw)
		bases := make([]GPVirtual, (rb+2)/3)
		for i := range bases {
			bases[i] = GP64()
			if i == 0 {
				MOVQ(wr, bases[i])
			} else {
				LEAQ(Mem{Base: bases[i-1], Index: ldw, Scale: 2}, bases[i])
				ADDQ(ldw, bases[i])
			}
		}
		wmem := func(r int) Mem {
			m := Mem{Base: bases[r/3]}
			if r%3 != 0 {
				m.Index, m.Scale = ldw, uint8(r%3)
			}
			return m
		}
		vb := Load(Param("v"), GP64())
		LEAQ(Mem{Base: vb, Index: doff, Scale: 2}, vb)
		op := Load(Param("offs"), GP64())
		cnt := Load(Param("n"), GP64())
		SHRQ(U8(1), cnt)
		pair := func(odd bool) {
			if stream && !odd {
				streamLines(dims / 16)
			}
			a1, b := ZMM(), ZMM()
			load := func(m Mem, dst VecVirtual) {
				// A 16-dimension block loads 16 words into a zmm with a
				// word mask (whole-register writes keep avo's liveness
				// analysis exact; ymm writes would extend the zmm's).
				switch {
				case dims == 32:
					VMOVDQU16(m, dst)
				case mask == nil:
					VMOVDQU16_Z(m, half, dst)
				default:
					VMOVDQU16_Z(m, mask, dst)
				}
			}
			o0 := GP64()
			MOVQ(Mem{Base: op}, o0)
			load(Mem{Base: vb, Index: o0, Scale: 2}, a1)
			if odd {
				VXORPS(b, b, b)
			} else {
				o1 := GP64()
				MOVQ(Mem{Base: op, Disp: 8}, o1)
				load(Mem{Base: vb, Index: o1, Scale: 2}, b)
			}
			var a2 VecVirtual
			if nv == 2 {
				a2 = ZMM()
				VMOVDQA64(a1, a2)
				VPERMT2W(b, idxHi, a2)
			}
			VPERMT2W(b, idxLo, a1)
			for r := range rb {
				bc := ZMM()
				VPBROADCASTD(wmem(r), bc)
				vdpbf16ps(a1, bc, acc[r][0])
				if nv == 2 {
					vdpbf16ps(a2, bc, acc[r][1])
				}
			}
		}
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "odd"))
		Label(lbl + "pair")
		pair(false)
		ADDQ(U32(16), op)
		for _, b := range bases {
			ADDQ(U32(4), b)
		}
		DECQ(cnt)
		JNE(LabelRef(lbl + "pair"))
		Label(lbl + "odd")
		nn := Load(Param("n"), GP64())
		TESTQ(U32(1), nn)
		JE(LabelRef(lbl + "store"))
		pair(true)
		Label(lbl + "store")
		lda = Load(Param("lda"), GP64())
		SHLQ(U8(2), lda)
		MOVQ(ar, arow)
		for r := range rb {
			for c := range nv {
				if mask == nil {
					VMOVUPS(acc[r][c], Mem{Base: arow, Disp: 64 * c})
				} else {
					VMOVUPS(acc[r][c], mask, Mem{Base: arow})
				}
			}
			if r+1 < rb {
				ADDQ(lda, arow)
			}
		}
	}

	// rowsLoop runs block over all rows for the current dimension block.
	rowsLoop := func(p string, dims int, mask Op) {
		ar := Load(Param("acc"), GP64())
		LEAQ(Mem{Base: ar, Index: doff, Scale: 4}, ar)
		wr := Load(Param("w"), GP64())
		rl := Load(Param("rows"), GP64())
		advance := func(rb int) {
			lda := Load(Param("lda"), GP64())
			SHLQ(U8(2), lda)
			ldw := Load(Param("ldw"), GP64())
			SHLQ(U8(1), ldw)
			for range rb {
				ADDQ(lda, ar)
				ADDQ(ldw, wr)
			}
			SUBQ(U32(rb), rl)
		}
		Label(p + "r8")
		CMPQ(rl, U32(8))
		JL(LabelRef(p + "rest"))
		block(p+"b8", dims, 8, mask, ar, wr)
		advance(8)
		JMP(LabelRef(p + "r8"))
		// The remaining 0..7 rows in one block (a GQA group of 3 heads
		// is one block).
		Label(p + "rest")
		for rb := 1; rb < 8; rb++ {
			CMPQ(rl, U32(rb))
			JE(LabelRef(fmt.Sprintf("%sb%d", p, rb)))
		}
		JMP(LabelRef(p + "r0"))
		for rb := 1; rb < 8; rb++ {
			Label(fmt.Sprintf("%sb%d", p, rb))
			block(fmt.Sprintf("%sb%d", p, rb), dims, rb, mask, ar, wr)
			JMP(LabelRef(p + "r0"))
		}
		Label(p + "r0")
	}

	Label("d32")
	CMPQ(left(), U32(32))
	JL(LabelRef("d16"))
	rowsLoop("w", 32, nil)
	ADDQ(U32(32), doff)
	JMP(LabelRef("d32"))
	Label("d16")
	CMPQ(left(), U32(16))
	JL(LabelRef("dtail"))
	rowsLoop("h", 16, nil)
	ADDQ(U32(16), doff)
	Label("dtail")
	d := left()
	TESTQ(d, d)
	JE(LabelRef("done"))
	rowsLoop("t", 16, tailMask(d))
	Label("done")
	VZEROUPPER()
	RET()
}
