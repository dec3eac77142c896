package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/bochs"
)

// TestBF16DotKernelsAreIntelsUnderBochs runs the avx512bf16 set's
// VDPBF16PS matrix kernels (one and four activation rows, 71 k: the masked
// tail too; weights with denormals) natively and on Bochs's Sapphire
// Rapids, which computes VDPBF16PS as Intel defines it (two fused
// multiply-adds a lane, odd pair first, denormals flushed), and compares
// the bits: the set's results do not depend on the CPU's vendor, so P/D
// engines on AMD and Intel hosts that both chose it exchange KV that a
// colocated run would have computed.
func TestBF16DotKernelsAreIntelsUnderBochs(t *testing.T) {
	var ks *kernelSet
	for _, s := range kernelSets {
		if s.name == "avx512bf16" {
			ks = s
		}
	}
	if ks == nil || !ks.avail {
		t.Skip("no AVX512-BF16 here to compare with")
	}
	const n, k = 16, 71
	rng := rand.New(rand.NewPCG(21, 22))
	w := randomBF16Rows(rng, n, k)
	x := randomBF16Rows(rng, 4, k)
	for i := 0; i < len(w); i += 13 {
		w[i] = F32ToBF16(float32(rng.NormFloat64()) * 1e-39) // a denormal
	}
	r1, r4 := make([]float32, n), make([]float32, 4*n)
	gemmDPBF16R1(&x[0], k, &w[0], k, k, n, &r1[0], n, 0)
	gemmDPBF16R4(&x[0], k, &w[0], k, k, n, &r4[0], n, 0)
	p := bochs.NewProgram()
	var fns []uint64
	for _, e := range []*byte{gemmDPBF16R1Entry(), gemmDPBF16R4Entry()} {
		code, err := bochs.FuncCode(e)
		if err != nil {
			t.Fatal(err)
		}
		fns = append(fns, p.Put(code, 64))
	}
	px, pw := p.Put(u16Bytes(x), 64), p.Put(u16Bytes(w), 64)
	o1, o4 := p.Alloc(4*n, 64), p.Alloc(4*4*n, 64)
	p.Call(fns[0], px, k, pw, k, k, n, o1, n, 0)
	p.Call(fns[1], px, k, pw, k, k, n, o4, n, 0)
	p.Dump(o1, 4*n)
	p.Dump(o4, 4*4*n)
	out := bochs.RunTest(t, p)
	for c, native := range [][]float32{r1, r4} {
		for i, v := range native {
			if got := binary.LittleEndian.Uint32(out[c][4*i:]); got != math.Float32bits(v) {
				t.Fatalf("%d-row kernel, output %d: %g on Bochs, %g here", []int{1, 4}[c], i, math.Float32frombits(got), v)
			}
		}
	}
}
