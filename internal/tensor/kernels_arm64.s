// NEON kernels of the arm64 "neon" kernel set and "neondot" quantized
// kernels (kernels_arm64.go), written by hand (avo emits amd64 only): Go's
// assembler has no mnemonic for the vector FADD, FADDP, FMUL, FCMGT, FCVTL,
// SCVTF and SDOT, so the macros below encode them as WORDs.
//
// Each dot product has one accumulation structure (dotNEONRef in
// kernels_arm64_test.go is its definition): eight accumulators of four lanes
// over steps of 32 elements (accumulator a, lane l takes element 32i+4a+l,
// FMLA), the groups of four left into accumulator 0, the lane-wise tree
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), the pairwise (v0+v1)+(v2+v3), then
// the last n%4 elements one fused multiply-add each.

#include "textflag.h"

// FADD Vd.4S, Vn.4S, Vm.4S
#define VFADD4S(m, n, d) WORD $(0x4E20D400 | (m<<16) | (n<<5) | d)
// FADDP Vd.4S, Vn.4S, Vm.4S
#define VFADDP4S(m, n, d) WORD $(0x6E20D400 | (m<<16) | (n<<5) | d)
// FADDP Sd, Vn.2S
#define FADDP2S(n, d) WORD $(0x7E30D800 | (n<<5) | d)
// FCVTL Vd.4S, Vn.4H and FCVTL2 Vd.4S, Vn.8H: f16 lanes 0-3 (4-7) to f32
#define FCVTL4H(n, d) WORD $(0x0E217800 | (n<<5) | d)
#define FCVTL8H(n, d) WORD $(0x4E217800 | (n<<5) | d)

// ZERO8 clears the eight accumulators V0-V7.
#define ZERO8 \
	VEOR	V0.B16, V0.B16, V0.B16; \
	VEOR	V1.B16, V1.B16, V1.B16; \
	VEOR	V2.B16, V2.B16, V2.B16; \
	VEOR	V3.B16, V3.B16, V3.B16; \
	VEOR	V4.B16, V4.B16, V4.B16; \
	VEOR	V5.B16, V5.B16, V5.B16; \
	VEOR	V6.B16, V6.B16, V6.B16; \
	VEOR	V7.B16, V7.B16, V7.B16

// LOADX loads the next 32 x elements (R0) into V8-V15.
#define LOADX \
	VLD1.P	64(R0), [V8.S4, V9.S4, V10.S4, V11.S4]; \
	VLD1.P	64(R0), [V12.S4, V13.S4, V14.S4, V15.S4]

// MADD8 adds V8-V15 times V16-V23 to V0-V7.
#define MADD8 \
	VFMLA	V16.S4, V8.S4, V0.S4; \
	VFMLA	V17.S4, V9.S4, V1.S4; \
	VFMLA	V18.S4, V10.S4, V2.S4; \
	VFMLA	V19.S4, V11.S4, V3.S4; \
	VFMLA	V20.S4, V12.S4, V4.S4; \
	VFMLA	V21.S4, V13.S4, V5.S4; \
	VFMLA	V22.S4, V14.S4, V6.S4; \
	VFMLA	V23.S4, V15.S4, V7.S4

// TREE sums V0-V7 into S0 (F0).
#define TREE \
	VFADD4S(1, 0, 0); \
	VFADD4S(3, 2, 2); \
	VFADD4S(5, 4, 4); \
	VFADD4S(7, 6, 6); \
	VFADD4S(2, 0, 0); \
	VFADD4S(6, 4, 4); \
	VFADD4S(4, 0, 0); \
	VFADDP4S(0, 0, 0); \
	FADDP2S(0, 0)

// func dotF32NEON(x, w *float32, n int) float32
TEXT ·dotF32NEON(SB), NOSPLIT, $0-28
	MOVD	x+0(FP), R0
	MOVD	w+8(FP), R1
	MOVD	n+16(FP), R2
	ZERO8
	LSR	$5, R2, R3
	CBZ	R3, f32quads
f32loop:
	LOADX
	VLD1.P	64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	VLD1.P	64(R1), [V20.S4, V21.S4, V22.S4, V23.S4]
	MADD8
	SUBS	$1, R3, R3
	BNE	f32loop
f32quads:
	AND	$31, R2, R3
	LSR	$2, R3, R3
	CBZ	R3, f32tree
f32quad:
	VLD1.P	16(R0), [V8.S4]
	VLD1.P	16(R1), [V16.S4]
	VFMLA	V16.S4, V8.S4, V0.S4
	SUBS	$1, R3, R3
	BNE	f32quad
f32tree:
	TREE
	AND	$3, R2, R3
	CBZ	R3, f32done
f32tail:
	FMOVS.P	4(R0), F8
	FMOVS.P	4(R1), F16
	FMADDS	F16, F0, F8, F0
	SUBS	$1, R3, R3
	BNE	f32tail
f32done:
	FMOVS	F0, ret+24(FP)
	RET

// func dotBF16NEON(x *float32, w *uint16, n int) float32
TEXT ·dotBF16NEON(SB), NOSPLIT, $0-28
	MOVD	x+0(FP), R0
	MOVD	w+8(FP), R1
	MOVD	n+16(FP), R2
	ZERO8
	VEOR	V31.B16, V31.B16, V31.B16
	LSR	$5, R2, R3
	CBZ	R3, bf16quads
bf16loop:
	LOADX
	VLD1.P	64(R1), [V24.H8, V25.H8, V26.H8, V27.H8]
	// A bf16 is the high half of its f32: interleave with zeros.
	VZIP1	V24.H8, V31.H8, V16.H8
	VZIP2	V24.H8, V31.H8, V17.H8
	VZIP1	V25.H8, V31.H8, V18.H8
	VZIP2	V25.H8, V31.H8, V19.H8
	VZIP1	V26.H8, V31.H8, V20.H8
	VZIP2	V26.H8, V31.H8, V21.H8
	VZIP1	V27.H8, V31.H8, V22.H8
	VZIP2	V27.H8, V31.H8, V23.H8
	MADD8
	SUBS	$1, R3, R3
	BNE	bf16loop
bf16quads:
	AND	$31, R2, R3
	LSR	$2, R3, R3
	CBZ	R3, bf16tree
bf16quad:
	VLD1.P	16(R0), [V8.S4]
	FMOVD.P	8(R1), F24
	VZIP1	V24.H8, V31.H8, V16.H8
	VFMLA	V16.S4, V8.S4, V0.S4
	SUBS	$1, R3, R3
	BNE	bf16quad
bf16tree:
	TREE
	AND	$3, R2, R3
	CBZ	R3, bf16done
bf16tail:
	FMOVS.P	4(R0), F8
	MOVHU.P	2(R1), R4
	LSLW	$16, R4, R4
	FMOVS	R4, F16
	FMADDS	F16, F0, F8, F0
	SUBS	$1, R3, R3
	BNE	bf16tail
bf16done:
	FMOVS	F0, ret+24(FP)
	RET

// func dotF16NEON(x *float32, w *uint16, n int) float32
TEXT ·dotF16NEON(SB), NOSPLIT, $0-28
	MOVD	x+0(FP), R0
	MOVD	w+8(FP), R1
	MOVD	n+16(FP), R2
	ZERO8
	LSR	$5, R2, R3
	CBZ	R3, f16quads
f16loop:
	LOADX
	VLD1.P	64(R1), [V24.H8, V25.H8, V26.H8, V27.H8]
	FCVTL4H(24, 16)
	FCVTL8H(24, 17)
	FCVTL4H(25, 18)
	FCVTL8H(25, 19)
	FCVTL4H(26, 20)
	FCVTL8H(26, 21)
	FCVTL4H(27, 22)
	FCVTL8H(27, 23)
	MADD8
	SUBS	$1, R3, R3
	BNE	f16loop
f16quads:
	AND	$31, R2, R3
	LSR	$2, R3, R3
	CBZ	R3, f16tree
f16quad:
	VLD1.P	16(R0), [V8.S4]
	FMOVD.P	8(R1), F24
	FCVTL4H(24, 16)
	VFMLA	V16.S4, V8.S4, V0.S4
	SUBS	$1, R3, R3
	BNE	f16quad
f16tree:
	TREE
	AND	$3, R2, R3
	CBZ	R3, f16done
f16tail:
	FMOVS.P	4(R0), F8
	MOVHU.P	2(R1), R4
	FMOVS	R4, F16
	FCVTL4H(16, 16)
	FMADDS	F16, F0, F8, F0
	SUBS	$1, R3, R3
	BNE	f16tail
f16done:
	FMOVS	F0, ret+24(FP)
	RET

// FMUL Vd.4S, Vn.4S, Vm.4S
#define VFMUL4S(m, n, d) WORD $(0x6E20DC00 | (m<<16) | (n<<5) | d)
// FCMGT Vd.4S, Vn.4S, Vm.4S: all ones where Vn > Vm
#define VFCMGT4S(m, n, d) WORD $(0x6EA0E400 | (m<<16) | (n<<5) | d)

// The value sums (axpyRows*): y[t] += alpha[r]·v[r][t] for each row r in
// order, the product rounded before the sum as axpyGo does, so that they
// are bit-identical to one axpy a row. They take n a multiple of their
// chunk; the Go wrappers do the last columns.

// AXPY4(a, w0, …, w3, y0, …, y3) adds the products of register a (alpha in
// every lane) with the four vectors w (overwritten) to the four y; the
// arguments are register numbers.
#define AXPY4(a, w0, w1, w2, w3, y0, y1, y2, y3) \
	VFMUL4S(a, w0, w0); \
	VFMUL4S(a, w1, w1); \
	VFMUL4S(a, w2, w2); \
	VFMUL4S(a, w3, w3); \
	VFADD4S(w0, y0, y0); \
	VFADD4S(w1, y1, y1); \
	VFADD4S(w2, y2, y2); \
	VFADD4S(w3, y3, y3)

// func axpyRowsNEON(alpha, v *float32, ldv, rows int, y *float32, n int)
// n is a multiple of 16.
TEXT ·axpyRowsNEON(SB), NOSPLIT, $0-48
	MOVD	alpha+0(FP), R0
	MOVD	v+8(FP), R1
	MOVD	ldv+16(FP), R2
	LSL	$2, R2, R2
	MOVD	rows+24(FP), R3
	MOVD	y+32(FP), R4
	MOVD	n+40(FP), R5
	LSR	$4, R5, R6
	CBZ	R6, rdone
	CBZ	R3, rdone
rchunk:
	VLD1	(R4), [V0.S4, V1.S4, V2.S4, V3.S4]
	MOVD	R0, R7
	MOVD	R1, R8
	MOVD	R3, R9
rrow:
	VLD1R.P	4(R7), [V16.S4]
	VLD1	(R8), [V4.S4, V5.S4, V6.S4, V7.S4]
	AXPY4(16, 4, 5, 6, 7, 0, 1, 2, 3)
	ADD	R2, R8, R8
	SUBS	$1, R9, R9
	BNE	rrow
	VST1.P	[V0.S4, V1.S4, V2.S4, V3.S4], 64(R4)
	ADD	$64, R1, R1
	SUBS	$1, R6, R6
	BNE	rchunk
rdone:
	RET

// func axpyRowsBF16NEON(alpha *float32, v *uint16, ldv, rows int, y *float32, n int)
// n is a multiple of 16.
TEXT ·axpyRowsBF16NEON(SB), NOSPLIT, $0-48
	MOVD	alpha+0(FP), R0
	MOVD	v+8(FP), R1
	MOVD	ldv+16(FP), R2
	LSL	$1, R2, R2
	MOVD	rows+24(FP), R3
	MOVD	y+32(FP), R4
	MOVD	n+40(FP), R5
	VEOR	V31.B16, V31.B16, V31.B16
	LSR	$4, R5, R6
	CBZ	R6, bdone
	CBZ	R3, bdone
bchunk:
	VLD1	(R4), [V0.S4, V1.S4, V2.S4, V3.S4]
	MOVD	R0, R7
	MOVD	R1, R8
	MOVD	R3, R9
brow:
	VLD1R.P	4(R7), [V16.S4]
	VLD1	(R8), [V24.H8, V25.H8]
	VZIP1	V24.H8, V31.H8, V4.H8
	VZIP2	V24.H8, V31.H8, V5.H8
	VZIP1	V25.H8, V31.H8, V6.H8
	VZIP2	V25.H8, V31.H8, V7.H8
	AXPY4(16, 4, 5, 6, 7, 0, 1, 2, 3)
	ADD	R2, R8, R8
	SUBS	$1, R9, R9
	BNE	brow
	VST1.P	[V0.S4, V1.S4, V2.S4, V3.S4], 64(R4)
	ADD	$32, R1, R1
	SUBS	$1, R6, R6
	BNE	bchunk
bdone:
	RET

// The grouped bf16 value sums: g = 2..4 outputs (the query heads of a GQA
// group) share each value row, 8 columns at a time.

// GSTEP adds alpha (from the pointer ap, which advances a row) times the
// widened row (V16, V17) to an output's two vectors y0, y1.
#define GSTEP(ap, y0, y1) \
	VLD1R.P	4(ap), [V18.S4]; \
	VFMUL4S(18, 16, 19); \
	VFMUL4S(18, 17, 20); \
	VFADD4S(19, y0, y0); \
	VFADD4S(20, y1, y1)

// GCHUNK starts a chunk of 8 columns: output h's y address in R20+h (at
// R4 + h·ldy), the first two outputs' y in V0-V3, output h's alpha
// pointer in R10+h, the value row pointer R8 and the rows left R9.
#define GCHUNK \
	MOVD	R4, R20; \
	ADD	R15, R20, R21; \
	ADD	R15, R21, R22; \
	ADD	R15, R22, R23; \
	VLD1	(R20), [V0.S4, V1.S4]; \
	VLD1	(R21), [V2.S4, V3.S4]; \
	MOVD	R0, R10; \
	ADD	R14, R10, R11; \
	ADD	R14, R11, R12; \
	ADD	R14, R12, R13; \
	MOVD	R1, R8; \
	MOVD	R3, R9

// GROW widens the value row's 8 columns (V16, V17) and adds them, weighted,
// to the first two outputs.
#define GROW \
	VLD1	(R8), [V24.H8]; \
	VZIP1	V24.H8, V31.H8, V16.H8; \
	VZIP2	V24.H8, V31.H8, V17.H8; \
	GSTEP(R10, 0, 1); \
	GSTEP(R11, 2, 3)

// func axpyRowsBF16G2NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)
// n is a multiple of 8, rows at least 1.
TEXT ·axpyRowsBF16G2NEON(SB), NOSPLIT, $0-64
	MOVD	alpha+0(FP), R0
	MOVD	lda+8(FP), R14
	LSL	$2, R14, R14
	MOVD	v+16(FP), R1
	MOVD	ldv+24(FP), R2
	LSL	$1, R2, R2
	MOVD	rows+32(FP), R3
	MOVD	y+40(FP), R4
	MOVD	ldy+48(FP), R15
	LSL	$2, R15, R15
	MOVD	n+56(FP), R5
	VEOR	V31.B16, V31.B16, V31.B16
	LSR	$3, R5, R6
	CBZ	R6, done
chunk:
	GCHUNK
row:
	GROW
	ADD	R2, R8, R8
	SUBS	$1, R9, R9
	BNE	row
	VST1	[V0.S4, V1.S4], (R20)
	VST1	[V2.S4, V3.S4], (R21)
	ADD	$32, R4, R4
	ADD	$16, R1, R1
	SUBS	$1, R6, R6
	BNE	chunk
done:
	RET

// func axpyRowsBF16G3NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)
// n is a multiple of 8, rows at least 1.
TEXT ·axpyRowsBF16G3NEON(SB), NOSPLIT, $0-64
	MOVD	alpha+0(FP), R0
	MOVD	lda+8(FP), R14
	LSL	$2, R14, R14
	MOVD	v+16(FP), R1
	MOVD	ldv+24(FP), R2
	LSL	$1, R2, R2
	MOVD	rows+32(FP), R3
	MOVD	y+40(FP), R4
	MOVD	ldy+48(FP), R15
	LSL	$2, R15, R15
	MOVD	n+56(FP), R5
	VEOR	V31.B16, V31.B16, V31.B16
	LSR	$3, R5, R6
	CBZ	R6, done
chunk:
	GCHUNK
	VLD1	(R22), [V4.S4, V5.S4]
row:
	GROW
	GSTEP(R12, 4, 5)
	ADD	R2, R8, R8
	SUBS	$1, R9, R9
	BNE	row
	VST1	[V0.S4, V1.S4], (R20)
	VST1	[V2.S4, V3.S4], (R21)
	VST1	[V4.S4, V5.S4], (R22)
	ADD	$32, R4, R4
	ADD	$16, R1, R1
	SUBS	$1, R6, R6
	BNE	chunk
done:
	RET

// func axpyRowsBF16G4NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)
// n is a multiple of 8, rows at least 1.
TEXT ·axpyRowsBF16G4NEON(SB), NOSPLIT, $0-64
	MOVD	alpha+0(FP), R0
	MOVD	lda+8(FP), R14
	LSL	$2, R14, R14
	MOVD	v+16(FP), R1
	MOVD	ldv+24(FP), R2
	LSL	$1, R2, R2
	MOVD	rows+32(FP), R3
	MOVD	y+40(FP), R4
	MOVD	ldy+48(FP), R15
	LSL	$2, R15, R15
	MOVD	n+56(FP), R5
	VEOR	V31.B16, V31.B16, V31.B16
	LSR	$3, R5, R6
	CBZ	R6, done
chunk:
	GCHUNK
	VLD1	(R22), [V4.S4, V5.S4]
	VLD1	(R23), [V6.S4, V7.S4]
row:
	GROW
	GSTEP(R12, 4, 5)
	GSTEP(R13, 6, 7)
	ADD	R2, R8, R8
	SUBS	$1, R9, R9
	BNE	row
	VST1	[V0.S4, V1.S4], (R20)
	VST1	[V2.S4, V3.S4], (R21)
	VST1	[V4.S4, V5.S4], (R22)
	VST1	[V6.S4, V7.S4], (R23)
	ADD	$32, R4, R4
	ADD	$16, R1, R1
	SUBS	$1, R6, R6
	BNE	chunk
done:
	RET

// func firstAboveNEON(x *float32, blocks int, bv float32) int
// returns the first of the 16-element blocks of x holding an element
// above bv (NaN never is), or blocks.
TEXT ·firstAboveNEON(SB), NOSPLIT, $0-32
	MOVD	x+0(FP), R0
	MOVD	blocks+8(FP), R1
	FMOVS	bv+16(FP), F16
	VDUP	V16.S[0], V16.S4
	MOVD	$0, R2
	CBZ	R1, adone
ablock:
	VLD1.P	64(R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VFCMGT4S(16, 0, 0)
	VFCMGT4S(16, 1, 1)
	VFCMGT4S(16, 2, 2)
	VFCMGT4S(16, 3, 3)
	VORR	V1.B16, V0.B16, V0.B16
	VORR	V3.B16, V2.B16, V2.B16
	VORR	V2.B16, V0.B16, V0.B16
	VMOV	V0.D[0], R3
	VMOV	V0.D[1], R4
	ORR	R3, R4, R4
	CBNZ	R4, adone
	ADD	$1, R2, R2
	CMP	R1, R2
	BLT	ablock
adone:
	MOVD	R2, ret+24(FP)
	RET

// The quantized products of the "neondot" kernels (ARMv8.2's dot product,
// SDOT): four weight rows of Q8_0, Q4_0 or Q5_0 blocks against one row of int8
// activation levels, each output by qdotGo's definition, a lane a row:
// per block the exact integer sum s (SDOT, then pairwise adds), then
// acc = fma(float32(s), d·dx, acc) with d the block's f16 scale.

// SDOT Vd.4S, Vn.16B, Vm.16B
#define SDOT16B(m, n, d) WORD $(0x4E809400 | (m<<16) | (n<<5) | d)
// SCVTF Vd.4S, Vn.4S
#define SCVTF4S(n, d) WORD $(0x4E21D800 | (n<<5) | d)

// Q8ROW(WP, VS, S, lane): row lane's block at WP (advanced past it): its
// scale into V7's half-word lane, Σ levels·x (V1, V2) into VS (register
// number S) as four partial sums.
#define Q8ROW(WP, VS, S, lane) \
	VEOR	VS.B16, VS.B16, VS.B16; \
	MOVHU.P	2(WP), R10; \
	VMOV	R10, V7.H[lane]; \
	VLD1.P	32(WP), [V4.B16, V5.B16]; \
	SDOT16B(1, 4, S); \
	SDOT16B(2, 5, S)

// Q4ROW is Q8ROW for a Q4_0 block: the low nibbles are elements 0-15, the
// high ones 16-31, each less 8 (V29 holds 8s, V30 0x0f).
#define Q4ROW(WP, VS, S, lane) \
	VEOR	VS.B16, VS.B16, VS.B16; \
	MOVHU.P	2(WP), R10; \
	VMOV	R10, V7.H[lane]; \
	VLD1.P	16(WP), [V4.B16]; \
	VUSHR	$4, V4.B16, V5.B16; \
	VAND	V30.B16, V4.B16, V4.B16; \
	VSUB	V29.B16, V4.B16, V4.B16; \
	VSUB	V29.B16, V5.B16, V5.B16; \
	SDOT16B(1, 4, S); \
	SDOT16B(2, 5, S)

// Q5ROW is Q8ROW for a Q5_0 block: the nibbles as Q4_0's, with bit i of
// qh (spread to a byte per element by table lookups and CMTST against the
// bit masks in V28) as element i's fifth bit, each level less 16 (V25
// holds 16s, V26 and V27 the lookups' indices).
#define Q5ROW(WP, VS, S, lane) \
	VEOR	VS.B16, VS.B16, VS.B16; \
	MOVHU.P	2(WP), R10; \
	VMOV	R10, V7.H[lane]; \
	MOVWU.P	4(WP), R11; \
	VLD1.P	16(WP), [V4.B16]; \
	VDUP	R11, V6.S4; \
	VTBL	V26.B16, [V6.B16], V8.B16; \
	VTBL	V27.B16, [V6.B16], V9.B16; \
	VCMTST	V28.B16, V8.B16, V8.B16; \
	VCMTST	V28.B16, V9.B16, V9.B16; \
	VAND	V25.B16, V8.B16, V8.B16; \
	VAND	V25.B16, V9.B16, V9.B16; \
	VAND	V30.B16, V4.B16, V5.B16; \
	VUSHR	$4, V4.B16, V4.B16; \
	VORR	V8.B16, V5.B16, V5.B16; \
	VORR	V9.B16, V4.B16, V4.B16; \
	VSUB	V25.B16, V5.B16, V5.B16; \
	VSUB	V25.B16, V4.B16, V4.B16; \
	SDOT16B(1, 5, S); \
	SDOT16B(2, 4, S)

// QBLOCKEND sums each row's partials into one lane of V16 and adds its
// product with d·dx (dx from R1) to the accumulators V0.
#define QBLOCKEND \
	VADDP	V17.S4, V16.S4, V16.S4; \
	VADDP	V19.S4, V18.S4, V18.S4; \
	VADDP	V18.S4, V16.S4, V16.S4; \
	SCVTF4S(16, 16); \
	FMOVS	(R1), F3; \
	ADD	$8, R1, R1; \
	VDUP	V3.S[0], V3.S4; \
	FCVTL4H(7, 7); \
	VFMUL4S(3, 7, 7); \
	VFMLA	V7.S4, V16.S4, V0.S4

// func qdotQ8_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)
TEXT ·qdotQ8_0x4NEON(SB), NOSPLIT, $0-48
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R6
	MOVD	rb+24(FP), R3
	MOVD	nb+32(FP), R4
	MOVD	out+40(FP), R5
	ADD	R3, R6, R7
	ADD	R3, R7, R8
	ADD	R3, R8, R9
	VEOR	V0.B16, V0.B16, V0.B16
	CBZ	R4, q8done
q8block:
	VLD1.P	32(R0), [V1.B16, V2.B16]
	Q8ROW(R6, V16, 16, 0)
	Q8ROW(R7, V17, 17, 1)
	Q8ROW(R8, V18, 18, 2)
	Q8ROW(R9, V19, 19, 3)
	QBLOCKEND
	SUBS	$1, R4, R4
	BNE	q8block
q8done:
	VST1	[V0.S4], (R5)
	RET

// func qdotQ4_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)
TEXT ·qdotQ4_0x4NEON(SB), NOSPLIT, $0-48
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R6
	MOVD	rb+24(FP), R3
	MOVD	nb+32(FP), R4
	MOVD	out+40(FP), R5
	ADD	R3, R6, R7
	ADD	R3, R7, R8
	ADD	R3, R8, R9
	VEOR	V0.B16, V0.B16, V0.B16
	VMOVI	$8, V29.B16
	VMOVI	$15, V30.B16
	CBZ	R4, q4done
q4block:
	VLD1.P	32(R0), [V1.B16, V2.B16]
	Q4ROW(R6, V16, 16, 0)
	Q4ROW(R7, V17, 17, 1)
	Q4ROW(R8, V18, 18, 2)
	Q4ROW(R9, V19, 19, 3)
	QBLOCKEND
	SUBS	$1, R4, R4
	BNE	q4block
q4done:
	VST1	[V0.S4], (R5)
	RET

// The Q4_K dot product of one weight row and one row of activation levels,
// by qdotGo's definition: per super-block each sub-block's exact integer
// sum s_j (SDOT), is = Σ sc_j·s_j and ms = Σ mn_j·xsum_j with the 6-bit
// scales and mins unpacked by table lookups, then
// acc = fma(float32(is), d·dx, acc) and acc = fma(-float32(ms), dmin·dx, acc).

// MUL Vd.4S, Vn.4S, Vm.4S and MLA (Vd += Vn·Vm)
#define MUL4S(m, n, d) WORD $(0x4EA09C00 | (m<<16) | (n<<5) | d)
#define MLA4S(m, n, d) WORD $(0x4EA09400 | (m<<16) | (n<<5) | d)
// SMULL Vd.4S, Vn.4H, Vm.4H and SMLAL2 Vd.4S, Vn.8H, Vm.8H
#define SMULL4H(m, n, d) WORD $(0x0E60C000 | (m<<16) | (n<<5) | d)
#define SMLAL8H(m, n, d) WORD $(0x4E608000 | (m<<16) | (n<<5) | d)
// USHL Vd.16B, Vn.16B, Vm.16B: each byte shifted by Vm's (negative: right)
#define USHL16B(m, n, d) WORD $(0x6E204400 | (m<<16) | (n<<5) | d)

// The lookups of the scales and mins: bytes j<4 of sc are s[j]&63, j≥4
// s[j+4]&15 | s[j-4]>>6<<4; of mn, s[j+4]&63 and s[j+4]>>4 | s[j]>>6<<4
// (index 255 gives 0).
DATA q4kscales<>+0(SB)/8, $0x0b0a090803020100  // sc's low bits: s[0..3], s[8..11]
DATA q4kscales<>+8(SB)/8, $0xffffffffffffffff
DATA q4kscales<>+16(SB)/8, $0x03020100ffffffff // sc's high bits: s[0..3] for j≥4
DATA q4kscales<>+24(SB)/8, $0xffffffffffffffff
DATA q4kscales<>+32(SB)/8, $0x0b0a090807060504 // mn's low bits: s[4..11]
DATA q4kscales<>+40(SB)/8, $0xffffffffffffffff
DATA q4kscales<>+48(SB)/8, $0x07060504ffffffff // mn's high bits: s[4..7] for j≥4
DATA q4kscales<>+56(SB)/8, $0xffffffffffffffff
DATA q4kscales<>+64(SB)/8, $0x0f0f0f0f3f3f3f3f // the low bits' masks
DATA q4kscales<>+72(SB)/8, $0x0000000000000000
DATA q4kscales<>+80(SB)/8, $0xfcfcfcfc00000000 // mn's low bits: j≥4 shifted right 4
DATA q4kscales<>+88(SB)/8, $0x0000000000000000
GLOBL q4kscales<>(SB), RODATA|NOPTR, $96

// Q4KCHUNK(S0, S1, s0, s1): the next two sub-blocks (32 qs bytes at R6, 64
// levels at R0, both advanced: low nibbles the first, high the second)
// into S0 and S1 (register numbers s0, s1) as four partial sums each.
#define Q4KCHUNK(S0, S1, s0, s1) \
	VLD1.P	32(R6), [V4.B16, V5.B16]; \
	VLD1.P	64(R0), [V0.B16, V1.B16, V2.B16, V3.B16]; \
	VAND	V30.B16, V4.B16, V6.B16; \
	VAND	V30.B16, V5.B16, V7.B16; \
	VUSHR	$4, V4.B16, V8.B16; \
	VUSHR	$4, V5.B16, V9.B16; \
	VEOR	S0.B16, S0.B16, S0.B16; \
	VEOR	S1.B16, S1.B16, S1.B16; \
	SDOT16B(0, 6, s0); \
	SDOT16B(1, 7, s0); \
	SDOT16B(2, 8, s1); \
	SDOT16B(3, 9, s1)

// KSETUP loads the K-quant kernels' constants (the scale lookups, their
// masks and shifts, V25-V31) and clears the accumulator F15.
#define KSETUP \
	MOVD	$q4kscales<>(SB), R4; \
	VLD1.P	64(R4), [V25.B16, V26.B16, V27.B16, V28.B16]; \
	VLD1.P	16(R4), [V29.B16]; \
	VLD1	(R4), [V31.B16]; \
	VMOVI	$15, V30.B16; \
	VEOR	V15.B16, V15.B16, V15.B16

// KTAIL ends a K-quant super-block at R2 (records at R1) whose sub-block
// sums are in V16-V23 as four partials each: s_0..s_3 into V16 and
// s_4..s_7 into V20 by pairwise adds; the scales sc (V10) and mins mn
// (V12) unpacked a byte each by the lookups; is = Σ sc_j·s_j and
// ms = Σ mn_j·xsum_j (the activations' int16 sums per 32, words 4..7);
// then d·dx and dmin·dx (each product rounded) and the two FMAs into F15.
#define KTAIL \
	VADDP	V17.S4, V16.S4, V16.S4; \
	VADDP	V19.S4, V18.S4, V18.S4; \
	VADDP	V18.S4, V16.S4, V16.S4; \
	VADDP	V21.S4, V20.S4, V20.S4; \
	VADDP	V23.S4, V22.S4, V22.S4; \
	VADDP	V22.S4, V20.S4, V20.S4; \
	ADD	$4, R2, R7; \
	VLD1	(R7), [V24.B16]; \
	VTBL	V25.B16, [V24.B16], V10.B16; \
	VAND	V29.B16, V10.B16, V10.B16; \
	VTBL	V26.B16, [V24.B16], V11.B16; \
	VUSHR	$6, V11.B16, V11.B16; \
	VSHL	$4, V11.B16, V11.B16; \
	VORR	V11.B16, V10.B16, V10.B16; \
	VTBL	V27.B16, [V24.B16], V12.B16; \
	USHL16B(31, 12, 12); \
	VAND	V29.B16, V12.B16, V12.B16; \
	VTBL	V28.B16, [V24.B16], V13.B16; \
	VUSHR	$6, V13.B16, V13.B16; \
	VSHL	$4, V13.B16, V13.B16; \
	VORR	V13.B16, V12.B16, V12.B16; \
	VUXTL	V10.B8, V10.H8; \
	VUXTL	V10.H4, V11.S4; \
	VUXTL2	V10.H8, V10.S4; \
	MUL4S(11, 16, 16); \
	MLA4S(10, 20, 16); \
	VADDV	V16.S4, V16; \
	VUXTL	V12.B8, V12.H8; \
	ADD	$16, R1, R7; \
	VLD1	(R7), [V13.H8]; \
	SMULL4H(13, 12, 14); \
	SMLAL8H(13, 12, 14); \
	VADDV	V14.S4, V14; \
	FMOVS	(R1), F13; \
	MOVWU	(R2), R5; \
	FMOVS	R5, F11; \
	FCVTL4H(11, 11); \
	VDUP	V13.S[0], V13.S4; \
	VFMUL4S(13, 11, 11); \
	VMOV	V16.S[0], R8; \
	SCVTFWS	R8, F10; \
	FMADDS	F11, F15, F10, F15; \
	VMOV	V11.S[1], R8; \
	FMOVS	R8, F12; \
	VMOV	V14.S[0], R9; \
	SCVTFWS	R9, F10; \
	FNEGS	F10, F10; \
	FMADDS	F12, F15, F10, F15

// func qdotQ4KNEON(x *int8, meta *uint32, w *byte, nb int) float32
TEXT ·qdotQ4KNEON(SB), NOSPLIT, $0-36
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R2
	MOVD	nb+24(FP), R3
	KSETUP
	CBZ	R3, kdone
kblock:
	ADD	$16, R2, R6
	Q4KCHUNK(V16, V17, 16, 17)
	Q4KCHUNK(V18, V19, 18, 19)
	Q4KCHUNK(V20, V21, 20, 21)
	Q4KCHUNK(V22, V23, 22, 23)
	KTAIL
	ADD	$144, R2, R2
	ADD	$64, R1, R1
	SUBS	$1, R3, R3
	BNE	kblock
kdone:
	FMOVS	F15, ret+32(FP)
	RET

// Q5KCHUNK(S0, S1, s0, s1, l0, l1) is Q4KCHUNK for Q5_K: each level's fifth
// bit is bit 7-l0 (first sub-block) or 7-l1 (second) of qh's byte for its
// position (V12, V13), isolated by shifting it to the top (l) and back
// down (7), then put above the nibble by SLI.
#define Q5KCHUNK(S0, S1, s0, s1, l0, l1) \
	VLD1.P	32(R6), [V4.B16, V5.B16]; \
	VLD1.P	64(R0), [V0.B16, V1.B16, V2.B16, V3.B16]; \
	VAND	V30.B16, V4.B16, V6.B16; \
	VAND	V30.B16, V5.B16, V7.B16; \
	VUSHR	$4, V4.B16, V8.B16; \
	VUSHR	$4, V5.B16, V9.B16; \
	VSHL	$l0, V12.B16, V10.B16; \
	VSHL	$l0, V13.B16, V11.B16; \
	VUSHR	$7, V10.B16, V10.B16; \
	VUSHR	$7, V11.B16, V11.B16; \
	VSLI	$4, V10.B16, V6.B16; \
	VSLI	$4, V11.B16, V7.B16; \
	VSHL	$l1, V12.B16, V10.B16; \
	VSHL	$l1, V13.B16, V11.B16; \
	VUSHR	$7, V10.B16, V10.B16; \
	VUSHR	$7, V11.B16, V11.B16; \
	VSLI	$4, V10.B16, V8.B16; \
	VSLI	$4, V11.B16, V9.B16; \
	VEOR	S0.B16, S0.B16, S0.B16; \
	VEOR	S1.B16, S1.B16, S1.B16; \
	SDOT16B(0, 6, s0); \
	SDOT16B(1, 7, s0); \
	SDOT16B(2, 8, s1); \
	SDOT16B(3, 9, s1)

// func qdotQ5KNEON(x *int8, meta *uint32, w *byte, nb int) float32
TEXT ·qdotQ5KNEON(SB), NOSPLIT, $0-36
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R2
	MOVD	nb+24(FP), R3
	KSETUP
	CBZ	R3, k5done
k5block:
	ADD	$16, R2, R6
	VLD1.P	32(R6), [V12.B16, V13.B16]
	Q5KCHUNK(V16, V17, 16, 17, 7, 6)
	Q5KCHUNK(V18, V19, 18, 19, 5, 4)
	Q5KCHUNK(V20, V21, 20, 21, 3, 2)
	Q5KCHUNK(V22, V23, 22, 23, 1, 0)
	KTAIL
	ADD	$176, R2, R2
	ADD	$64, R1, R1
	SUBS	$1, R3, R3
	BNE	k5block
k5done:
	FMOVS	F15, ret+32(FP)
	RET

// The Q6_K dot product of one weight row and one row of activation levels,
// by qdotGo's definition: each 16-element sub-block's exact Σ (q-32)·x
// (SDOT) times its int8 scale, summed in int32 (MLA by element), then
// acc = fma(float32(is), d·dx, acc). A level is ql's nibble with qh's two
// bits above it (SLI).

// SSHLL (SXTL) Vd.8H, Vn.8B / SSHLL2 Vd.8H, Vn.16B, and the 4H/8H to 4S ones
#define SXTL8B(n, d) WORD $(0x0F08A400 | (n<<5) | d)
#define SXTL16B(n, d) WORD $(0x4F08A400 | (n<<5) | d)
#define SXTL4H(n, d) WORD $(0x0F10A400 | (n<<5) | d)
#define SXTL8H(n, d) WORD $(0x4F10A400 | (n<<5) | d)
// MLA Vd.4S, Vn.4S, Vm.S[i]
#define MLAELEM(m, i, n, d) WORD $(0x6F800000 | ((i&1)<<21) | (((m>>4)&1)<<20) | ((m&15)<<16) | ((i>>1)<<11) | (n<<5) | d)

// Q6LEVEL(x, sr, i) makes a sub-block's levels whole (nibble in V16, qh's two
// bits in V17), less 32, and adds Σ level·x (x in register x) times the
// scale in register sr's lane i to V27.
#define Q6LEVEL(x, sr, i) \
	VSLI	$4, V17.B16, V16.B16; \
	VSUB	V28.B16, V16.B16, V16.B16; \
	VEOR	V18.B16, V18.B16, V18.B16; \
	SDOT16B(x, 16, 18); \
	MLAELEM(sr, i, 18, 27)

// Q6HALF(sa, sb) runs the next half super-block (64 ql bytes at R6, 32 qh
// bytes at R7, 128 levels at R0, all advanced; ql's first 32 bytes A in V0,
// V1, the next B in V2, V3, qh in V4, V5, the levels' quarters in V8-V15):
// its 8 sub-blocks, scales in registers sa (the first four) and sb. A
// quarter's nibbles are A's low (0), B's low (1), A's high (2), B's high
// (3), its two bits qh's bits 2q, 2q+1.
#define Q6HALF(sa, sb) \
	VLD1.P	64(R6), [V0.B16, V1.B16, V2.B16, V3.B16]; \
	VLD1.P	32(R7), [V4.B16, V5.B16]; \
	VLD1.P	64(R0), [V8.B16, V9.B16, V10.B16, V11.B16]; \
	VLD1.P	64(R0), [V12.B16, V13.B16, V14.B16, V15.B16]; \
	VAND	V30.B16, V0.B16, V16.B16; \
	VAND	V29.B16, V4.B16, V17.B16; \
	Q6LEVEL(8, sa, 0); \
	VAND	V30.B16, V1.B16, V16.B16; \
	VAND	V29.B16, V5.B16, V17.B16; \
	Q6LEVEL(9, sa, 1); \
	VAND	V30.B16, V2.B16, V16.B16; \
	VUSHR	$2, V4.B16, V17.B16; \
	VAND	V29.B16, V17.B16, V17.B16; \
	Q6LEVEL(10, sa, 2); \
	VAND	V30.B16, V3.B16, V16.B16; \
	VUSHR	$2, V5.B16, V17.B16; \
	VAND	V29.B16, V17.B16, V17.B16; \
	Q6LEVEL(11, sa, 3); \
	VUSHR	$4, V0.B16, V16.B16; \
	VUSHR	$4, V4.B16, V17.B16; \
	VAND	V29.B16, V17.B16, V17.B16; \
	Q6LEVEL(12, sb, 0); \
	VUSHR	$4, V1.B16, V16.B16; \
	VUSHR	$4, V5.B16, V17.B16; \
	VAND	V29.B16, V17.B16, V17.B16; \
	Q6LEVEL(13, sb, 1); \
	VUSHR	$4, V2.B16, V16.B16; \
	VUSHR	$6, V4.B16, V17.B16; \
	Q6LEVEL(14, sb, 2); \
	VUSHR	$4, V3.B16, V16.B16; \
	VUSHR	$6, V5.B16, V17.B16; \
	Q6LEVEL(15, sb, 3)

// func qdotQ6KNEON(x *int8, meta *uint32, w *byte, nb int) float32
TEXT ·qdotQ6KNEON(SB), NOSPLIT, $0-36
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R2
	MOVD	nb+24(FP), R3
	VMOVI	$32, V28.B16
	VMOVI	$3, V29.B16
	VMOVI	$15, V30.B16
	VEOR	V31.B16, V31.B16, V31.B16
	CBZ	R3, sdone
sblock:
	// The 16 scales as int32: sub-block s's in V(20+s/4), lane s%4.
	ADD	$192, R2, R7
	VLD1	(R7), [V24.B16]
	SXTL8B(24, 25)
	SXTL16B(24, 26)
	SXTL4H(25, 20)
	SXTL8H(25, 21)
	SXTL4H(26, 22)
	SXTL8H(26, 23)
	VEOR	V27.B16, V27.B16, V27.B16
	MOVD	R2, R6
	ADD	$128, R2, R7
	Q6HALF(20, 21)
	Q6HALF(22, 23)
	VADDV	V27.S4, V27
	VMOV	V27.S[0], R8
	SCVTFWS	R8, F6
	MOVHU	208(R2), R5
	FMOVS	R5, F7
	FCVTL4H(7, 7)
	FMOVS	(R1), F5
	FMULS	F5, F7, F7
	FMADDS	F7, F31, F6, F31
	ADD	$210, R2, R2
	ADD	$64, R1, R1
	SUBS	$1, R3, R3
	BNE	sblock
sdone:
	FMOVS	F31, ret+32(FP)
	RET

// The Q5_0 lookups: qh's byte 0 for elements 0-7, 1 for 8-15 (V26), 2 and
// 3 for 16-31 (V27); the bit of each element in its byte (V28).
DATA q50consts<>+0(SB)/8, $0x0000000000000000
DATA q50consts<>+8(SB)/8, $0x0101010101010101
DATA q50consts<>+16(SB)/8, $0x0202020202020202
DATA q50consts<>+24(SB)/8, $0x0303030303030303
DATA q50consts<>+32(SB)/8, $0x8040201008040201
DATA q50consts<>+40(SB)/8, $0x8040201008040201
GLOBL q50consts<>(SB), RODATA|NOPTR, $48

// func qdotQ5_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)
TEXT ·qdotQ5_0x4NEON(SB), NOSPLIT, $0-48
	MOVD	x+0(FP), R0
	MOVD	meta+8(FP), R1
	MOVD	w+16(FP), R6
	MOVD	rb+24(FP), R3
	MOVD	nb+32(FP), R4
	MOVD	out+40(FP), R5
	ADD	R3, R6, R7
	ADD	R3, R7, R8
	ADD	R3, R8, R9
	MOVD	$q50consts<>(SB), R12
	VLD1	(R12), [V26.B16, V27.B16, V28.B16]
	VMOVI	$16, V25.B16
	VMOVI	$15, V30.B16
	VEOR	V0.B16, V0.B16, V0.B16
	CBZ	R4, q5done
q5block:
	VLD1.P	32(R0), [V1.B16, V2.B16]
	Q5ROW(R6, V16, 16, 0)
	Q5ROW(R7, V17, 17, 1)
	Q5ROW(R8, V18, 18, 2)
	Q5ROW(R9, V19, 19, 3)
	QBLOCKEND
	SUBS	$1, R4, R4
	BNE	q5block
q5done:
	VST1	[V0.S4], (R5)
	RET
