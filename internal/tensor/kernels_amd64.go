package tensor

import "golang.org/x/sys/cpu"

//go:generate go -C internal/asmgen run . -out ../../kern_amd64.s -stubs ../../kern_amd64_stubs.go -pkg tensor

// archKernelSets returns the assembly kernel sets, best first, marking those
// this CPU cannot run.
func archKernelSets() []*kernelSet {
	x := cpu.X86
	avx2 := x.HasAVX2 && x.HasFMA && x.HasF16C && x.HasOSXSAVE
	avx512 := avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL && x.HasBMI2
	avx512Set := &kernelSet{
		name:         "avx512",
		f32:          [maxTileRows]gemmF32{gemmAVX512F32R1, gemmAVX512F32R2, gemmAVX512F32R3, gemmAVX512F32R4},
		bf16:         [maxTileRows]gemmU16{gemmAVX512BF16R1, gemmAVX512BF16R2, gemmAVX512BF16R3, gemmAVX512BF16R4},
		f16:          [maxTileRows]gemmU16{gemmAVX512F16R1, gemmAVX512F16R2, gemmAVX512F16R3, gemmAVX512F16R4},
		cols:         4,
		dot:          dotAVX512,
		axpy:         axpyAVX512,
		axpyRows:     axpyRowsAVX512,
		axpyRowsBF16: axpyRowsBF16AVX512,
		axpyRowsBF16G: [maxTileRows - 1]func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int){
			axpyRowsBF16G2AVX512, axpyRowsBF16G3AVX512, axpyRowsBF16G4AVX512},
		silu:        siluMulAVX512,
		expSum:      expSumAVX512,
		argMax:      argMaxAVX512,
		appendAbove: appendAboveAVX512,
		avail:       avx512,
	}
	// Quantized weights: VPDPBUSD where there is AVX512-VNNI, the AVX2
	// kernels otherwise (the results are the same either way).
	avx512Set.qmm, avx512Set.qmmName = qmmAVX2, "avx2"
	if x.HasAVX512VNNI {
		avx512Set.qmm, avx512Set.qmmName = qmmAVX512, "avx512vnni"
	}
	avx512Set.qactQ8_0 = qactQ8_0AVX512
	avx512Set.qactQ8K = qactQ8KAVX512
	// avx512bf16 is avx512 with bf16 activations for bf16 weights
	// (VDPBF16PS: twice the arithmetic per instruction, no widening).
	bf16 := *avx512Set
	bf16.name = "avx512bf16"
	bf16.bf16x = [maxTileRows]gemmBF16x{gemmDPBF16R1, gemmDPBF16R2, gemmDPBF16R3, gemmDPBF16R4}
	bf16.toBF16 = cvtBF16AVX512
	bf16.toBF16Stream = cvtBF16StreamAVX512
	bf16.attnScores = [maxTileRows]func(q *uint16, ldq int, k *uint32, groups, steps int, out *float32, ldo int){
		attnScoresDPR1, attnScoresDPR2, attnScoresDPR3, attnScoresDPR4}
	bf16.attnSoftmax = attnSoftmaxAVX512
	bf16.attnPV = attnPVDP
	bf16.attnKeysStream = [maxTileRows]func(x *uint16, ldx int, w *uint16, ldw, k, n int, out *float32, ldo int, pf, pfEnd, pfNext uintptr){
		attnKeysDPR1, attnKeysDPR2, attnKeysDPR3, attnKeysDPR4}
	bf16.attnPVStream = attnPVDPStream
	bf16.avail = avx512 && x.HasAVX512BF16
	// amxbf16 is avx512bf16 with AMX-BF16 for the bf16 weights
	// (amxbf16_amd64.go); chosen by the calibration, never by CPUID.
	amx := bf16
	amx.name, amx.amxBF16 = "amxbf16", true
	amx.avail = bf16.avail && amxBF16Available()
	return []*kernelSet{
		&bf16,
		&amx,
		avx512Set,
		{
			name: "avx2",
			f32:  [maxTileRows]gemmF32{gemmAVX2F32R1, gemmAVX2F32R2, gemmAVX2F32R3, gemmAVX2F32R4},
			bf16: [maxTileRows]gemmU16{gemmAVX2BF16R1, gemmAVX2BF16R2, gemmAVX2BF16R3, gemmAVX2BF16R4},
			f16:  [maxTileRows]gemmU16{gemmAVX2F16R1, gemmAVX2F16R2, gemmAVX2F16R3, gemmAVX2F16R4},
			cols: 4,
			// The 4×3 tile's f32 weight rows with its 4 activation rows
			// overflow L1 from K ≈ 1,000: 128 KiB panels measured 5–15%
			// faster than 64 for K = 1,536 and 2,048, the same for 576.
			panelF32: 128 << 10,
			f32KB:    [2]gemmF32KB{gemmAVX2F32R3KB, gemmAVX2F32R4KB},
			u16KB: [2][2]gemmU16KB{{gemmAVX2BF16R3KB, gemmAVX2BF16R4KB},
				{gemmAVX2F16R3KB, gemmAVX2F16R4KB}},
			kBlockMin: kBlockMinAVX2,
			dot:       dotAVX2,
			axpy:      axpyAVX2,
			silu:      siluMulAVX2,
			expSum:    expSumAVX2,
			qmm:       qmmAVX2,
			qmmName:   "avx2",
			avail:     avx2,

			// The quantized product's activation quantizers.
			qactQ8_0: qactQ8_0AVX2,
			qactQ8K:  qactQ8KAVX2,

			// Attention's value sums (bit-identical to axpy per row) and
			// row maxima.
			axpyRows: axpyRowsF32AVX2,
			axpyRowsG: [maxTileRows - 1]func(alpha *float32, lda int, v *float32, ldv, rows int, y *float32, ldy, n int){
				axpyRowsF32G2AVX2, axpyRowsF32G3AVX2, axpyRowsF32G4AVX2},
			axpyRowsBF16: axpyRowsBF16AVX2,
			axpyRowsBF16G: [maxTileRows - 1]func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int){
				axpyRowsBF16G2AVX2, axpyRowsBF16G3AVX2, axpyRowsBF16G4AVX2},
			argMax: argMaxAVX2,
			// Attention's prefill scores from transposed keys.
			attnScoresF32: [attnF32Rows]func(q *float32, ldq int, k *float32, pairs, hd int, out *float32, ldo int){
				attnScoresAVX2R1, attnScoresAVX2R2, attnScoresAVX2R3},
			// Attention's decode scores from the pool's key rows, 8 keys a
			// vector.
			attnKeys: [attnF32Rows]func(q *float32, ldq int, k *uint16, ldk, groups, hd int, out *float32, ldo int){
				attnKeysAVX2R1, attnKeysAVX2R2, attnKeysAVX2R3},
			// The same prefetching a later call's KV, and the value sums
			// likewise.
			attnKeysPf: [attnF32Rows]func(q *float32, ldq int, k *uint16, ldk, groups, hd int, out *float32, ldo, pf int){
				attnKeysPfAVX2R1, attnKeysPfAVX2R2, attnKeysPfAVX2R3},
			attnValues: [maxTileRows - 1]func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n, pf int){
				attnValuesBF16G2AVX2, attnValuesBF16G3AVX2, attnValuesBF16G4AVX2},
		},
	}
}

// kBlockMinAVX2 is the K above which the AVX2 set's 3- and 4-row kernels
// run over blocks of K: 4 f32 x rows of K = 1,024 with a tile's 3 weight
// rows still fit L1 (bf16 weights), at 1,536 they do not.
const kBlockMinAVX2 = 1024

// archQuantKernels returns the assembly quantized matrix kernels, best
// first, marking those this CPU cannot run. They give the same results bit
// for bit (see qmm.go), so any of them may serve any kernel set.
func archQuantKernels() []quantKernel {
	x := cpu.X86
	avx2 := x.HasAVX2 && x.HasFMA && x.HasF16C && x.HasOSXSAVE
	avx512 := avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL && x.HasBMI2
	return []quantKernel{
		{name: "avx512vnni", fn: qmmAVX512, avail: avx512 && x.HasAVX512VNNI},
		// AMX-INT8 for groups of 16 activation rows (prefill), the VNNI
		// kernels for the rest; chosen by the calibration, never by CPUID.
		{name: "amx", fn: qmmAMX, avail: avx512 && x.HasAVX512VNNI && amxAvailable()},
		{name: "avx2", fn: qmmAVX2, avail: avx2},
	}
}

func prefetch(p uintptr, ld, rows, lines int) { prefetchRows(p, ld, rows, lines) }
