// Package tensor holds Tandem's CPU kernels: the matrix product of f32
// activations with f32, bf16, f16 or block-quantized weights
// (Pool.MatMul), vector helpers used by attention (Dot, Axpy), the
// element-wise layers (RMSNorm, SiLUMul, Softmax), dtype conversions, the
// reference (de)quantization of ggml's block formats (QuantizeRows,
// DequantizeRow) and the persistent worker Pool that runs them in parallel.
//
// The matrix kernels are Go assembly generated with avo (see
// internal/asmgen; run `go generate` here after changing it) in an AVX-512
// and an AVX2+FMA variant, plus a pure-Go fallback. A third variant,
// avx512bf16, is AVX-512 with bf16 weights multiplied by activations
// rounded to bf16 (VDPBF16PS, as llama.cpp does): about 1.3–1.9× the
// throughput of widening the weights, for a relative error of at most 2⁻⁹
// per activation; BF16Activations reports whether it is in use. The first variant the CPU
// supports is active at start-up; Calibrate (run by tandem serve) times every variant the
// CPU supports and keeps the fastest, cached per CPU model and build, TANDEM_KERNELS
// overriding it; ISA reports the variant in use and SetISA overrides it.
//
// Quantized weights (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K: ggml's block layouts,
// so GGUF tensor data is used as it is) stay quantized in memory. MatMul
// quantizes the activations per block as llama.cpp does (q8_0 per 32 for
// Q8_0, Q4_0 and Q5_0, q8_K per 256 for the K-quants), takes exact integer dot
// products per block (VPDPBUSD on AVX512-VNNI, VPMADDUBSW and VPMADDWD on
// AVX2) and accumulates the block scales in f32 in one fixed order; see
// qmatmul.go for the definition every kernel follows.
//
// Batch invariance is the package's central promise: for a given ISA, every
// output element of MatMul is computed by the same sequence of floating
// point operations whatever the number of rows m, the tile or worker that
// computes it, or whether the single-row path ran. Each variant fixes one
// accumulation structure per dot product (one vector accumulator marching
// over K, a fixed horizontal reduction tree, a fixed tail) and every code
// path uses it. Results therefore differ between ISAs, but never within one,
// except for quantized weights, whose results are the same on every ISA
// (for finite activations).
package tensor
