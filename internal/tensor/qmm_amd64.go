package tensor

import "golang.org/x/sys/cpu"

// The assembly quantized kernels of amd64 (see asmgen's quant.go,
// quant_avx2.go and rowquant.go), driven by qKernelSet.run.

// qKernelsAVX512 are the AVX512-VNNI kernels: 16 weight rows per panel.
var qKernelsAVX512 = &qKernelSet{lanes: 16, types: map[DType]qTypeKernels{
	Q8_0: {qpackQ8_0AVX512, dot32AVX512, 9 * 64},
	Q4_0: {qpackQ4_0AVX512, dot32AVX512, 9 * 64},
	Q5_0: {qpackQ5_0AVX512, dot32AVX512, 9 * 64},
	Q4_K: {qpackQ4_KAVX512, dotKAVX512, 78 * 64},
	Q5_K: {qpackQ5_KAVX512, dotKAVX512, 78 * 64},
	Q6_K: {qpackQ6_KAVX512, dot6KAVX512, 89 * 64},
}, row: map[DType]qRowKernel{
	Q8_0: {fn: qrowQ8_0AVX512, group: 8, slot: 64},
	Q4_0: {fn: qrowQ4_0AVX512, group: 8, slot: 64},
	Q5_0: {fn: qrowQ5_0AVX512, group: 8, slot: 64},
	Q4_K: {fn: qrowQ4_KAVX512, group: 4, slot: 64, perm: true},
	Q5_K: {fn: qrowQ5_KAVX512, group: 4, slot: 64, perm: true},
	Q6_K: {fn: qrowQ6_KAVX512, group: 4, slot: 32},
}}

var (
	dot32AVX512 = []qdot{qdot32AVX512R1, qdot32AVX512R2, qdot32AVX512R3, qdot32AVX512R4,
		qdot32AVX512R5, qdot32AVX512R6, qdot32AVX512R7, qdot32AVX512R8}
	dotKAVX512  = []qdot{qdotKAVX512R1, qdotKAVX512R2, qdotKAVX512R3, qdotKAVX512R4, qdotKAVX512R5, qdotKAVX512R6}
	dot6KAVX512 = []qdot{qdot6KAVX512R1, qdot6KAVX512R2, qdot6KAVX512R3, qdot6KAVX512R4, qdot6KAVX512R5, qdot6KAVX512R6}
)

// qKernelsAVX2 are the AVX2 kernels: 8 weight rows per panel.
var qKernelsAVX2 = &qKernelSet{lanes: 8, types: map[DType]qTypeKernels{
	Q8_0: {qpackQ8_0AVX2, []qdot{qdotQ8_0AVX2R1, qdotQ8_0AVX2R2, qdotQ8_0AVX2R3, qdotQ8_0AVX2R4}, 9 * 32},
	Q4_0: {qpackQ4_0AVX2, []qdot{qdotQ4_0AVX2R1, qdotQ4_0AVX2R2, qdotQ4_0AVX2R3, qdotQ4_0AVX2R4}, 9 * 32},
	Q5_0: {qpackQ5_0AVX2, []qdot{qdotQ5_0AVX2R1, qdotQ5_0AVX2R2, qdotQ5_0AVX2R3, qdotQ5_0AVX2R4}, 9 * 32},
	Q4_K: {qpackQ4_KAVX2, []qdot{qdotKAVX2R1, qdotKAVX2R2, qdotKAVX2R3, qdotKAVX2R4}, 78 * 32},
	Q5_K: {qpackQ5_KAVX2, []qdot{qdot5KAVX2R1, qdot5KAVX2R2, qdot5KAVX2R3, qdot5KAVX2R4}, 78 * 32},
	Q6_K: {qpackQ6_KAVX2, []qdot{qdot6KAVX2R1, qdot6KAVX2R2, qdot6KAVX2R3, qdot6KAVX2R4}, 89 * 32},
}, row: map[DType]qRowKernel{
	Q8_0: {fn8: qrow8Q8_0AVX2, fnStreams: qrowQ8_0AVX2, streams: qRowStreamsAVX2, group: 8, slot: 64},
	Q4_0: {fn8: qrow8Q4_0AVX2, fnStreams: qrowQ4_0AVX2, streams: qRowStreamsAVX2, group: 8, slot: 64},
	Q5_0: {fn8: qrow8Q5_0AVX2, fnStreams: qrowQ5_0AVX2, streams: qRowStreamsAVX2, group: 8, slot: 64},
	Q4_K: {fn8K: qrow8Q4_KAVX2, fnStreams: qrowQ4_KAVX2, streams: qRowStreamsKAVX2, group: 4, slot: 64},
	Q5_K: {fn8K: qrow8Q5_KAVX2, fnStreams: qrowQ5_KAVX2, streams: qRowStreamsKAVX2, group: 4, slot: 64},
	Q6_K: {fn8K: qrow8Q6_KAVX2, fnStreams: qrowQ6_KAVX2, streams: qRowStreamsKAVX2, group: 4, slot: 32},
}}

// The VBMI row kernels of Q4_0 and Q5_0 where the CPU has AVX512-VBMI
// (Ice Lake, Zen 4 and later; not Skylake-SP or Cascade Lake): about 45
// instructions per group of 8 blocks where row32's take 100 (asmgen's
// rowq32vbmi.go), for rows of a multiple of 4 blocks.
func init() {
	if !cpu.X86.HasAVX512VBMI {
		return
	}
	for dt, fn := range map[DType]qrow{Q4_0: qrowQ4_0VBMI, Q5_0: qrowQ5_0VBMI} {
		rk := qKernelsAVX512.row[dt]
		rk.quad = &qRowKernel{fn: fn, group: 8, slot: 64, perm: true}
		qKernelsAVX512.row[dt] = rk
	}
	quadRows = true
}

func qmmAVX512(a *qAct, w *Mat, lo, hi int, out []float32) { qKernelsAVX512.run(a, w, lo, hi, out) }

func qmmAVX2(a *qAct, w *Mat, lo, hi int, out []float32) { qKernelsAVX2.run(a, w, lo, hi, out) }

// qRowStreamsAVX2 and qRowStreamsKAVX2 are the weight rows the AVX2 row
// kernels of the 32-blocks and of the K-quants read side by side, as
// asmgen's rowStreamsAVX2 and rowStreamsKAVX2 (a kernel and its driver
// that disagree give wrong rows, which the tests catch).
const (
	qRowStreamsAVX2  = 4
	qRowStreamsKAVX2 = 2
)
