package main

// The f32 → bf16 conversion of activations and KV rows with
// VCVTNEPS2BF16 (round to nearest even): cvtBF16, and cvtBF16Stream with
// non-temporal stores.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

// cvtBF16 emits the f32 → bf16 conversion of the activations.
func cvtBF16() {
	TEXT("cvtBF16AVX512", NOSPLIT, "func(x *float32, out *uint16, n int)")
	Doc("cvtBF16AVX512 rounds x[t] to bf16 (nearest even) into out[t] for t < n.")
	x := Load(Param("x"), GP64())
	o := Load(Param("out"), GP64())
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	Label("loop")
	CMPQ(left, U32(16))
	JL(LabelRef("tail"))
	v, h := ZMM(), YMM()
	VMOVUPS(Mem{Base: x}, v)
	vcvtneps2bf16(v, h)
	VMOVDQU(h, Mem{Base: o})
	ADDQ(U32(64), x)
	ADDQ(U32(32), o)
	SUBQ(U32(16), left)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(left, left)
	JE(LabelRef("done"))
	mask := tailMask(left)
	v2, h2 := ZMM(), YMM()
	VMOVUPS_Z(Mem{Base: x}, mask, v2)
	vcvtneps2bf16(v2, h2)
	VMOVDQU16(h2, mask, Mem{Base: o})
	Label("done")
	VZEROUPPER()
	RET()
}

// cvtBF16Stream emits cvtBF16 for whole 16-element groups with
// non-temporal stores (out must be 32-byte aligned): rows written to a KV
// cache that will not be read again soon, so neither the read for ownership
// nor the cache pollution of ordinary stores is paid. It ends with SFENCE,
// so the rows are visible to other threads like ordinary stores.
func cvtBF16Stream() {
	TEXT("cvtBF16StreamAVX512", NOSPLIT, "func(x *float32, out *uint16, n int)")
	Doc("cvtBF16StreamAVX512 rounds x[t] to bf16 into out[t] for t < n (n a multiple of 16, out 32-byte aligned) with non-temporal stores.")
	x := Load(Param("x"), GP64())
	o := Load(Param("out"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(U8(4), n)
	TESTQ(n, n)
	JE(LabelRef("done"))
	Label("loop")
	v, h := ZMM(), YMM()
	VMOVUPS(Mem{Base: x}, v)
	vcvtneps2bf16(v, h)
	VMOVNTDQ(h, Mem{Base: o})
	ADDQ(U32(64), x)
	ADDQ(U32(32), o)
	DECQ(n)
	JNE(LabelRef("loop"))
	Label("done")
	SFENCE()
	VZEROUPPER()
	RET()
}
