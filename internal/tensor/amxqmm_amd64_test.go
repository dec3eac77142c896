package tensor

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/bochs"
)

// panel32Go writes the panel32 layout (the AVX-512 pack kernels' and
// qamx32R16's) of blocks [b0, b0+nb) of 16 rows of w (Q8_0, Q4_0 or Q5_0,
// ggml's blocks) into dst: per block 8 vectors of unsigned levels (Q8_0
// level+128, Q4_0 0..15, Q5_0 0..31), vector i holding levels 4i..4i+3 of
// row r at bytes 4r..4r+3, then the 16 scales as f32.
func panel32Go(w *Mat, row0, b0, nb int, dst []byte) {
	rb, _ := w.DType.RowBytes(w.Cols)
	_, bytes := w.DType.BlockSize()
	for b := range nb {
		p := dst[b*panel32Bytes : (b+1)*panel32Bytes]
		for r := range 16 {
			blk := w.Q[(row0+r)*rb+(b0+b)*bytes:][:bytes]
			for t := range 32 {
				var level byte
				switch w.DType {
				case Q8_0:
					level = blk[2+t] ^ 0x80
				case Q4_0:
					level = blk[2+t%16] >> (4 * (t / 16)) & 15
				case Q5_0:
					level = byte(q5_0Value(blk, t))
				}
				p[64*(t/4)+4*r+t%4] = level
			}
			binary.LittleEndian.PutUint32(p[512+4*r:], math.Float32bits(f16(blk, 0)))
		}
	}
}

// panel32Bytes is a panel32 block's bytes.
const panel32Bytes = 9 * 64

// qamx32Go is qamx32R16's contract in Go (the definition's operations over
// the panel32 layout), for testing the drivers where the CPU has no AMX.
func qamx32Go(x *int8, ldx int, meta *uint32, panel *byte, nb int, acc *float32, _ *byte, _ *int32) {
	if nb == 0 {
		return
	}
	xs := unsafe.Slice(x, 15*ldx+32*nb)
	ms := unsafe.Slice(meta, 32*nb)
	ps := unsafe.Slice(panel, panel32Bytes*nb)
	as := unsafe.Slice(acc, 16*16)
	for b := range nb {
		blk := ps[b*panel32Bytes:]
		for r := range 16 {
			dx := math.Float32frombits(ms[32*b+r])
			for n := range 16 {
				s := int32(ms[32*b+16+r])
				for t := range 32 {
					s += int32(xs[r*ldx+32*b+t]) * int32(blk[64*(t/4)+4*n+t%4])
				}
				dw := math.Float32frombits(binary.LittleEndian.Uint32(blk[512+4*n:]))
				as[16*r+n] = fma32(float32(s), dw*dx, as[16*r+n])
			}
		}
	}
}

// TestPanel32GoIsThePackKernels checks the test's panel32 layout against
// the AVX-512 pack kernels' where the CPU runs them.
func TestPanel32GoIsThePackKernels(t *testing.T) {
	if !hasPanelKernels {
		t.Skip("no AVX512-VNNI kernels here")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []DType{Q8_0, Q4_0, Q5_0} {
		w := randomMat(rng, dt, 16, 256)
		rb, _ := dt.RowBytes(256)
		got, want := make([]byte, 8*panel32Bytes), make([]byte, 8*panel32Bytes)
		qKernelsAVX512.types[dt].pack(&w.Q[0], rb, 8, &want[0], uintptr(unsafe.Pointer(&w.Q[0])))
		panel32Go(w, 0, 0, 8, got)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: panel32Go differs from the pack kernel", dt)
		}
	}
}

// TestAMXKernelUnderBochs runs qamx32R16 itself, in the Bochs emulator's
// Sapphire Rapids, on random Q8_0, Q4_0 and Q5_0 weights and activations,
// and compares every output bit with the definition (qmmGo): two groups of
// 16 activation rows, the blocks in two calls that continue the chains.
func TestAMXKernelUnderBochs(t *testing.T) {
	var cases []amxBochsCase
	for _, dt := range []DType{Q8_0, Q4_0, Q5_0} {
		cases = append(cases, amxBochsCase{dt, qamx32R16Entry(), amxConfig32, 32, panel32Bytes, func(w *Mat, nb int) []byte {
			panel := make([]byte, nb*panel32Bytes)
			panel32Go(w, 0, 0, nb, panel)
			return panel
		}})
	}
	// 13 blocks: calls of 5 and 8, odd and even (the kernel takes them in
	// pairs).
	checkAMXInt8UnderBochs(t, cases, 13*32, 5, 5)
}

// amxBochsCase is one format for checkAMXInt8UnderBochs: its AMX kernel's
// entry and configuration, the weights of a block, the bytes of a block of
// its panel and the panel of a matrix's first 16 rows (nb blocks).
type amxBochsCase struct {
	dt         DType
	entry      *byte
	cfg        [64]byte
	elems      int
	blockBytes int
	panel      func(w *Mat, nb int) []byte
}

// checkAMXInt8UnderBochs runs each case's AMX kernel in the Bochs
// emulator's Sapphire Rapids on a random 16-row matrix of k weights and 32
// random activation rows (two groups of 16), the blocks in two calls (the
// first split blocks, then the rest) that continue the chains, and
// compares every output bit with the definition (qmmGo).
func checkAMXInt8UnderBochs(t *testing.T, cases []amxBochsCase, k, split int, seed uint64) {
	const m, n = 32, 16
	rng := rand.New(rand.NewPCG(seed, seed+1))
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	p := bochs.NewProgram()
	tile := p.Alloc(16*1024, 64)
	var wants [][]float32
	for _, c := range cases {
		code, err := bochs.FuncCode(c.entry)
		if err != nil {
			t.Fatal(err)
		}
		nb := k / c.elems
		w := randomMat(rng, c.dt, n, k)
		a := &qAct{}
		(&Pool{threads: 1}).quantizeActs(defaultSet(), a, c.dt, x, m, k)
		want := make([]float32, m*n)
		qmmGo(a, w, 0, n, want)
		if a.prepareAMX(); a.amxRows != m {
			t.Fatal("prepareAMX took fewer rows")
		}
		words, _ := metaWords(c.dt)
		xq := unsafe.Slice((*byte)(unsafe.Pointer(&a.xq[0])), len(a.xq))
		metaBytes := make([]byte, 4*len(a.amxMeta))
		for i, v := range a.amxMeta {
			binary.LittleEndian.PutUint32(metaBytes[4*i:], v)
		}
		fn, pc := p.Put(code, 64), p.Put(c.cfg[:], 64)
		px, pm, pp := p.Put(xq, 64), p.Put(metaBytes, 64), p.Put(c.panel(w, nb), 64)
		acc := p.Alloc(4*m*16, 64)
		for g := range m / amxGroup {
			for _, part := range [][2]int{{0, split}, {split, nb}} {
				b0, b1 := part[0], part[1]
				p.Call(fn, px+uint64(g*amxGroup*k+c.elems*b0), uint64(k), pm+uint64(4*(g*nb+b0)*amxGroup*words),
					pp+uint64(b0*c.blockBytes), uint64(b1-b0), acc+uint64(4*g*amxGroup*16), pc, tile)
			}
		}
		p.Dump(acc, 4*m*16)
		wants = append(wants, want)
	}
	out := bochs.RunTest(t, p)
	for i, c := range cases {
		for row := range m {
			for col := range n {
				got := math.Float32frombits(binary.LittleEndian.Uint32(out[i][4*(16*row+col):]))
				if want := wants[i][row*n+col]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s: activation row %d, weight row %d: %g (%#x), want %g (%#x)", c.dt, row, col, got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
		}
	}
}

// TestAMXDriversMatchVNNI runs the AMX drivers (rows and panels, Q8_0,
// Q4_0 and Q5_0, groups of 16 activation rows and the rest, chunks of
// blocks) with the kernel's contract in Go where the CPU has no AMX, and
// with qamx32R16 itself where it has: every output must be the AVX512-VNNI
// kernels' bits.
func TestAMXDriversMatchVNNI(t *testing.T) {
	if !hasPanelKernels {
		t.Skip("no AVX512-VNNI kernels here")
	}
	if !amxAvailable() {
		defer func(d32, dK, d6K amxKernel) { amxDot32, amxDotK, amxDot6K = d32, dK, d6K }(amxDot32, amxDotK, amxDot6K)
		amxDot32, amxDotK, amxDot6K = qamx32Go, qamxKByRows(qdotKAVX512R1, pkBytesGo), qamxKByRows(qdot6KAVX512R1, p6BytesGo)
		t.Log("no AMX here: the drivers run the kernels' contracts (in Go, or by the VNNI kernels row by row)")
	}
	if err := amxCompare(qmmAMX, qmmAVX512, qmmPanelsAMX, qmmPanels); err != nil {
		t.Fatal(err)
	}
}

// TestAMXSelfCheck runs the self-check the calibration runs before it
// times the AMX kernels: where the CPU has AMX it must pass, elsewhere
// it must refuse them and say why.
func TestAMXSelfCheck(t *testing.T) {
	err := amxSelfCheck()
	if amxAvailable() && hasPanelKernels {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err == nil {
		t.Fatal("the self-check passed on a CPU without AMX")
	}
	if _, err := withQuant(defaultSet(), "amx"); err == nil {
		t.Fatal(`withQuant "amx" succeeded without AMX`)
	}
	t.Log(err)
}

// The widened K-quant panels' bytes a super-block of 16 rows (asmgen's
// quantk.go: pkBytes for Q4_K/Q5_K, p6Bytes for Q6_K).
const (
	pkBytesGo = 78 * 64
	p6BytesGo = 89 * 64
)

// qamxKByRows returns qamxKR16's (or qamx6KR16's) contract carried out by
// the VNNI dot kernel for one activation row (dot1), block by block and
// row by row over the AMX kernel's meta (each row's 64-byte record, the 16
// rows side by side per super-block): the drivers' test where the CPU has
// no AMX.
func qamxKByRows(dot1 qdot, panelBytes int) amxKernel {
	return func(x *int8, ldx int, meta *uint32, panel *byte, nb int, acc *float32, _ *byte, _ *int32) {
		if nb == 0 {
			return
		}
		xs := unsafe.Slice(x, 15*ldx+256*nb)
		ms := unsafe.Slice(meta, nb*amxGroup*16)
		ps := unsafe.Slice(panel, nb*panelBytes)
		as := unsafe.Slice(acc, 16*16)
		for b := range nb {
			for r := range amxGroup {
				dot1(&xs[r*ldx+256*b], ldx, &ms[(b*amxGroup+r)*16], 64, &ps[b*panelBytes], 1, &as[16*r])
			}
		}
	}
}

// TestAMXKKernelsUnderBochs runs qamxKR16 and qamx6KR16 themselves, in the
// Bochs emulator's Sapphire Rapids, on random Q4_K, Q5_K and Q6_K weights
// (widened by the pack kernels) and activations, and compares every output
// bit with the definition (qmmGo): two groups of 16 activation rows, the
// super-blocks in two calls that continue the chains.
func TestAMXKKernelsUnderBochs(t *testing.T) {
	if !hasPanelKernels {
		t.Skip("the widened K-quant panels come from the AVX-512 pack kernels, which this CPU lacks")
	}
	var cases []amxBochsCase
	for _, dt := range []DType{Q4_K, Q5_K, Q6_K} {
		entry, cfg := qamxKR16Entry(), amxConfig32
		if dt == Q6_K {
			entry, cfg = qamx6KR16Entry(), amxConfig16
		}
		ks := qKernelsAVX512.types[dt]
		cases = append(cases, amxBochsCase{dt, entry, cfg, qk, ks.panelBytes, func(w *Mat, nb int) []byte {
			rb, _ := w.DType.RowBytes(w.Cols)
			panel := make([]byte, nb*ks.panelBytes)
			ks.pack(&w.Q[0], rb, nb, &panel[0], uintptr(unsafe.Pointer(&w.Q[0])))
			return panel
		}})
	}
	checkAMXInt8UnderBochs(t, cases, 3*qk, 1, 17)
}
