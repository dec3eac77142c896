package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/bochs"
)

// ftz flushes a denormal to a zero of its sign, as AMX-BF16 does with its
// inputs and results.
func ftz(v float32) float32 {
	if v != 0 && math.Abs(float64(v)) < 0x1p-126 {
		return float32(math.Copysign(0, float64(v)))
	}
	return v
}

// amxBF16Dot is one output of TDPBF16PS over a weight row (k a multiple of
// 32) and activation row j of a packed group (packAMXBF16), as Intel's
// definition and Bochs compute it: per instruction (32 k) the even and the
// odd products each fused into a chain of their own from zero, the chains
// added, the sum added to the accumulator; round to nearest even, inputs
// and results denormal flushed.
func amxBF16Dot(wrow, xp []uint16, j int) float32 {
	bf := func(h uint16) float32 { return ftz(math.Float32frombits(uint32(h) << 16)) }
	var c float32
	for k0 := 0; k0 < len(wrow); k0 += 32 {
		var e, o float32
		for p := range 16 {
			kk := k0 + 2*p
			e = ftz(fma32(bf(wrow[kk]), bf(xp[kk/2*32+2*j]), e))
			o = ftz(fma32(bf(wrow[kk+1]), bf(xp[kk/2*32+2*j+1]), o))
		}
		c = ftz(c + ftz(e+o))
	}
	return c
}

// gemmAMXBF16Go is gemmAMXBF16's contract in Go (amxBF16Dot for each
// output), for testing the driver where the CPU has no AMX.
func gemmAMXBF16Go(w *uint16, ldw int, xp *uint16, k, rows, r int, out *float32, ldo int, _ *byte, _ *float32, _ *int32) {
	ws := unsafe.Slice(w, (rows-1)*ldw+k)
	xs := unsafe.Slice(xp, k*16)
	os := unsafe.Slice(out, (r-1)*ldo+rows)
	for i := range rows {
		for j := range r {
			os[j*ldo+i] = amxBF16Dot(ws[i*ldw:i*ldw+k], xs, j)
		}
	}
}

// gemmAMXBF16x4Go is gemmAMXBF16x4's contract in Go: gemmAMXBF16Go for
// each of the two activation groups, 32 weight rows at a time.
func gemmAMXBF16x4Go(w *uint16, ldw int, xp *uint16, xstride, k, rows int, out *float32, ldo int, cfg *byte, scratch *float32, idx *int32) {
	xs := unsafe.Slice(xp, xstride/2+k*16)
	os := unsafe.Slice(out, 31*ldo+rows)
	for g := range 2 {
		gemmAMXBF16Go(w, ldw, &xs[g*xstride/2], k, rows, 16, &os[16*g*ldo], ldo, cfg, scratch, idx)
	}
}

// u16Bytes returns v's little-endian bytes (to place in an emulator's
// memory).
func u16Bytes(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, h := range v {
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b
}

// randomBF16Rows returns m×k random values and their bf16 rounding (what
// the avx512bf16 sets multiply).
func randomBF16Rows(rng *rand.Rand, m, k int) []uint16 {
	xb := make([]uint16, m*k)
	for i := range xb {
		xb[i] = F32ToBF16(float32(rng.NormFloat64()))
	}
	return xb
}

// TestAMXBF16KernelUnderBochs runs gemmAMXBF16 and gemmAMXBF16x4
// themselves, in the Bochs emulator's Sapphire Rapids: 32 weight rows of
// 96 by groups of 1, 5 and 16 activation rows (one call, and 16 weight
// rows a call), and by two full groups with the 2×2 kernel, every output
// compared bit for bit with the definition (amxBF16Dot), so the same in
// every batch.
func TestAMXBF16KernelUnderBochs(t *testing.T) {
	code, err := bochs.FuncCode(gemmAMXBF16Entry())
	if err != nil {
		t.Fatal(err)
	}
	const n, k = 32, 96
	rng := rand.New(rand.NewPCG(12, 13))
	w := randomBF16Rows(rng, n, k)
	x := randomBF16Rows(rng, amxGroup, k)
	p := bochs.NewProgram()
	fn := p.Put(code, 64)
	pw := p.Put(u16Bytes(w), 64)
	idx := make([]byte, 64)
	for i, v := range amxGatherIdx {
		binary.LittleEndian.PutUint32(idx[4*i:], uint32(v))
	}
	pidx := p.Put(idx, 64)
	tile := p.Alloc(1024, 64)
	rs := []int{1, 5, 16}
	for _, r := range rs {
		xp := make([]uint16, k*16)
		packAMXBF16(x[:r*k], 0, r, r, k, xp)
		px := p.Put(u16Bytes(xp), 64)
		cfg := p.Put(amxBF16Config[r][:], 64)
		out := p.Alloc(4*r*n, 64)
		if r == 5 {
			// 16 weight rows a call, as the driver calls it for prefill.
			for g := 0; g < n; g += 16 {
				p.Call(fn, pw+uint64(2*g*k), k, px, k, 16, uint64(r), out+uint64(4*g), n, cfg, tile, pidx)
			}
		} else {
			p.Call(fn, pw, k, px, k, n, uint64(r), out, n, cfg, tile, pidx)
		}
		p.Dump(out, 4*r*n)
	}
	// Two full groups by the 2×2 kernel.
	x2 := randomBF16Rows(rng, 2*amxGroup, k)
	xp2 := make([]uint16, 2*k*16)
	packAMXBF16(x2, 0, 2*amxGroup, 2*amxGroup, k, xp2)
	code4, err := bochs.FuncCode(gemmAMXBF16x4Entry())
	if err != nil {
		t.Fatal(err)
	}
	fn4, px2, cfg4 := p.Put(code4, 64), p.Put(u16Bytes(xp2), 64), p.Put(amxFullConfig[:], 64)
	tile4 := p.Alloc(4096, 64)
	out4 := p.Alloc(4*2*amxGroup*n, 64)
	p.Call(fn4, pw, k, px2, 2*k*16, k, n, out4, n, cfg4, tile4, pidx)
	p.Dump(out4, 4*2*amxGroup*n)
	dumps := bochs.RunTest(t, p)
	for j := range 2 * amxGroup {
		for i := range n {
			got := math.Float32frombits(binary.LittleEndian.Uint32(dumps[len(rs)][4*(j*n+i):]))
			want := amxBF16Dot(w[i*k:(i+1)*k], xp2[j/amxGroup*k*16:], j%amxGroup)
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("2×2 kernel: activation row %d, weight row %d: %g, want %g", j, i, got, want)
			}
		}
	}
	xp := make([]uint16, k*16)
	packAMXBF16(x, 0, amxGroup, amxGroup, k, xp)
	for c, r := range rs {
		for j := range r {
			for i := range n {
				got := math.Float32frombits(binary.LittleEndian.Uint32(dumps[c][4*(j*n+i):]))
				want := amxBF16Dot(w[i*k:(i+1)*k], xp, j)
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%d activation rows: row %d, weight row %d: %g (%#x), want %g (%#x)", r, j, i, got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
		}
	}
}

// amxBF16Set returns the amxbf16 kernel set, available or not.
func amxBF16Set(t *testing.T) *kernelSet {
	for _, ks := range kernelSets {
		if ks.name == "amxbf16" {
			return ks
		}
	}
	t.Fatal("no amxbf16 kernel set")
	return nil
}

// TestAMXBF16SetIsBatchInvariant runs MatMul with the amxbf16 set (with
// the kernel's contract in Go where the CPU has no AMX, gemmAMXBF16 where
// it has) on 1–64 activation rows, one and two threads: every output must
// be the definition's bits (amxBF16Dot), so the same in every batch, and
// within bf16's rounding of avx512bf16's products; a matrix that does not
// fit (rows not a multiple of 16) takes avx512bf16's kernels.
func TestAMXBF16SetIsBatchInvariant(t *testing.T) {
	ks := amxBF16Set(t)
	if ks.toBF16 == nil || !hasPanelKernels {
		t.Skip("no AVX512-BF16 here")
	}
	if !amxBF16Available() {
		k1, k4 := amxBF16Kernel, amxBF16Kernel4
		defer func() { amxBF16Kernel, amxBF16Kernel4 = k1, k4 }()
		amxBF16Kernel, amxBF16Kernel4 = gemmAMXBF16Go, gemmAMXBF16x4Go
		t.Log("no AMX here: the driver runs the kernel's contract in Go")
	}
	rng := rand.New(rand.NewPCG(14, 15))
	const n, k, mMax = 64, 128, 64
	w := randomMat(rng, BF16, n, k)
	x := make([]float32, mMax*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	xb := make([]uint16, mMax*k)
	for i, v := range x {
		xb[i] = F32ToBF16(v)
	}
	for _, threads := range []int{1, 2} {
		p := NewPool(threads)
		for _, m := range []int{1, 3, 16, 17, 40, 64} {
			out := make([]float32, m*n)
			p.matMul(ks, out, x, m, w)
			for j := range m {
				xp := make([]uint16, k*16)
				packAMXBF16(xb[j*k:(j+1)*k], 0, 1, 1, k, xp)
				for i := range n {
					want := amxBF16Dot(w.U16[i*k:(i+1)*k], xp, 0)
					if got := out[j*n+i]; math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%d threads, %d rows: row %d, weight row %d: %g, want %g", threads, m, j, i, got, want)
					}
				}
			}
		}
		p.Close()
	}
	var ref *kernelSet
	for _, s := range kernelSets {
		if s.name == "avx512bf16" {
			ref = s
		}
	}
	// The products themselves (not only their order): within bf16's
	// rounding of avx512bf16's, as the self-check asks on AMX hardware.
	if err := amxBF16Compare(ks, ref); err != nil {
		t.Fatal(err)
	}
	// Rows not a multiple of 16: avx512bf16's kernels, bit for bit.
	odd := randomMat(rng, BF16, 24, k)
	p := NewPool(1)
	defer p.Close()
	got, want := make([]float32, 5*24), make([]float32, 5*24)
	p.matMul(ks, got, x, 5, odd)
	p.matMul(ref, want, x, 5, odd)
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("a 24-row matrix: output %d is %g, avx512bf16 gives %g", i, got[i], want[i])
		}
	}
}

// TestAMXBF16SelfCheck runs the self-check the calibration runs before it
// times the amxbf16 set: where the CPU has AMX-BF16 it must pass, elsewhere
// refuse the set and say why.
func TestAMXBF16SelfCheck(t *testing.T) {
	err := amxBF16SelfCheck()
	if amxBF16Set(t).avail {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err == nil {
		t.Fatal("the self-check passed on a CPU without AMX-BF16")
	}
	if _, err := findSet("amxbf16"); err == nil {
		t.Fatal(`findSet "amxbf16" succeeded without AMX-BF16`)
	}
	t.Log(err)
}

// TestAMXPeakKernelsUnderBochs runs the AMX peak loops (`tandem bench
// model`'s tile-dot peaks) in the Bochs emulator's Sapphire Rapids, 3
// passes, and checks that their lane sums count the multiply-adds the
// rates assume (peakKernels' macs).
func TestAMXPeakKernelsUnderBochs(t *testing.T) {
	const iters = 3
	p := bochs.NewProgram()
	cfg := p.Put(amxFullConfig[:], 64)
	scratch := p.Alloc(4096, 64)
	kernels := []struct {
		peak  Peak
		entry *byte
		one   uint16
	}{{PeakAMXBF16, peakAMXBF16Entry(), 0x3f80}, {PeakAMXInt8, peakAMXInt8Entry(), 0x0101}}
	for _, k := range kernels {
		code, err := bochs.FuncCode(k.entry)
		if err != nil {
			t.Fatal(err)
		}
		ones := make([]byte, 1024)
		for i := 0; i < len(ones); i += 2 {
			binary.LittleEndian.PutUint16(ones[i:], k.one)
		}
		fn, po, out := p.Put(code, 64), p.Put(ones, 64), p.Alloc(64, 64)
		p.Call(fn, iters, out, cfg, po, scratch)
		p.Dump(out, 64)
	}
	dumps := bochs.RunTest(t, p)
	for i, k := range kernels {
		var sum float64
		for l := range 16 {
			v := binary.LittleEndian.Uint32(dumps[i][4*l:])
			if k.peak == PeakAMXBF16 {
				sum += float64(math.Float32frombits(v))
			} else {
				sum += float64(int32(v))
			}
		}
		if want := float64(peakKernels[k.peak].macs * iters); sum != want {
			t.Fatalf("%v: the lanes sum to %g, want %g", k.peak, sum, want)
		}
	}
}
