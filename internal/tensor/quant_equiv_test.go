package tensor

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// quantizeRowsRef is QuantizeRows on the reference quantizers of
// quant_ref_test.go, one block at a time.
func quantizeRowsRef(d DType, src []float32, rows, cols int) []byte {
	rb, err := d.RowBytes(cols)
	if err != nil {
		panic(err)
	}
	out := make([]byte, rows*rb)
	elems, size := d.BlockSize()
	for r := range rows {
		for b := range cols / elems {
			x := src[r*cols+b*elems : r*cols+(b+1)*elems]
			y := out[r*rb+b*size : r*rb+(b+1)*size]
			switch d {
			case Q8_0:
				quantizeQ8_0Ref(x, y)
			case Q4_0:
				quantizeQ4_0Ref(x, y)
			case Q5_0:
				quantizeQ5_0Ref(x, y)
			case Q4_K:
				quantizeQ4KRef(x, y, false)
			case Q5_K:
				quantizeQ4KRef(x, y, true)
			case Q6_K:
				quantizeQ6KRef(x, y)
			}
		}
	}
	return out
}

// equivKinds are the kinds of data TestQuantizeMatchesReference feeds the
// quantizers, each filling a run of values (a whole super-block, or one
// sub-block of 16 or 32 in a mixed super-block).
var equivKinds = []struct {
	name string
	fill func(rng *rand.Rand, x []float32)
}{
	{"normal", func(rng *rand.Rand, x []float32) {
		s := math.Ldexp(1, rng.IntN(41)-20)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * s)
		}
	}},
	{"uniform", func(rng *rand.Rand, x []float32) {
		s := math.Ldexp(1, rng.IntN(41)-20)
		for i := range x {
			x[i] = float32((2*rng.Float64() - 1) * s)
		}
	}},
	{"positive only", func(rng *rand.Rand, x []float32) {
		s, off := math.Ldexp(1, rng.IntN(21)-10), rng.Float64()
		for i := range x {
			x[i] = float32((off + rng.Float64()) * s)
		}
	}},
	{"negative only", func(rng *rand.Rand, x []float32) {
		s, off := math.Ldexp(1, rng.IntN(21)-10), rng.Float64()
		for i := range x {
			x[i] = float32(-(off + rng.Float64()) * s)
		}
	}},
	{"all equal", func(rng *rand.Rand, x []float32) {
		c := float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(21)-10))
		for i := range x {
			x[i] = c
		}
	}},
	{"zeros", func(rng *rand.Rand, x []float32) {
		for i := range x {
			x[i] = 0
			if rng.IntN(8) == 0 {
				x[i] = float32(math.Copysign(0, -1))
			}
		}
	}},
	{"single outlier", func(rng *rand.Rand, x []float32) {
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 1e-3)
		}
		x[rng.IntN(len(x))] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(12)))
	}},
	{"sparse", func(rng *rand.Rand, x []float32) {
		for i := range x {
			x[i] = 0
			if rng.IntN(6) == 0 {
				x[i] = float32(rng.NormFloat64())
			}
		}
	}},
	{"tiny", func(rng *rand.Rand, x []float32) {
		s := 1e-30 * math.Ldexp(1, rng.IntN(40)-20)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * s)
		}
	}},
	{"huge", func(rng *rand.Rand, x []float32) {
		s := math.Ldexp(1, 60+rng.IntN(67)) // up to 2¹²⁶, overflowing x² and f16
		for i := range x {
			x[i] = float32(rng.NormFloat64() * s)
		}
	}},
	{"denormal", func(rng *rand.Rand, x []float32) {
		for i := range x {
			x[i] = math.Float32frombits(rng.Uint32() & 0x807fffff)
		}
	}},
	{"random bits", func(rng *rand.Rand, x []float32) {
		for i := range x {
			b := rng.Uint32()
			if b&0x7f800000 == 0x7f800000 {
				b &^= 0x40000000 // finite
			}
			x[i] = math.Float32frombits(b)
		}
	}},
	{"grid", func(rng *rand.Rand, x []float32) {
		// Levels times a power of two, with halves: ties for nearestInt.
		s, m := float32(math.Ldexp(1, rng.IntN(13)-6)), float32(rng.IntN(33)-16)
		for i := range x {
			x[i] = (float32(rng.IntN(64)-32)/2 + m) * s
		}
	}},
	{"non-finite", func(rng *rand.Rand, x []float32) {
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for range 1 + rng.IntN(3) {
			x[rng.IntN(len(x))] = []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}[rng.IntN(3)]
		}
	}},
}

// equivData returns n super-blocks of test data, each either of one kind
// throughout (kind ≥ 0) or, for kind −1, made of sub-blocks of 16 or 32
// of random kinds (non-finite ones only rarely) so that the sub-block
// scales of one super-block differ wildly.
func equivData(rng *rand.Rand, kind, n int) []float32 {
	x := make([]float32, n*qk)
	for b := range n {
		blk := x[b*qk : (b+1)*qk]
		if kind >= 0 {
			equivKinds[kind].fill(rng, blk)
			continue
		}
		sub := 16 << rng.IntN(2)
		for s := 0; s < qk; s += sub {
			k := rng.IntN(len(equivKinds) - 1)
			if rng.IntN(64) == 0 {
				k = len(equivKinds) - 1
			}
			equivKinds[k].fill(rng, blk[s:s+sub])
		}
	}
	return x
}

// fusesMulAdd reports whether this build fuses float32 multiply-adds
// (GOAMD64=v3, arm64, …), which changes the results of the reference copies:
// they write some x·y + z without the conversion that forbids it.
func fusesMulAdd() bool {
	x := float32(1 + 0x1p-12)
	return mulAdd(x, x, -(1+0x1p-11)) != float32(x*x)-(1+0x1p-11)
}

//go:noinline
func mulAdd(x, y, z float32) float32 { return x*y + z }

// TestQuantizeMatchesReference holds QuantizeRows to the bytes the
// quantizers made before they were restructured for speed (the verbatim
// copies in quant_ref_test.go), over every kind of data in equivKinds and
// mixtures of them: 23,000 super-blocks (184,000 blocks of 32) per dtype.
// Where the compiler fuses multiply-adds the copies no longer give the
// default amd64 build's bytes, which QuantizeRows gives on every build
// (see TestQuantizeRowsGolden).
func TestQuantizeMatchesReference(t *testing.T) {
	if fusesMulAdd() {
		t.Skip("this build fuses multiply-adds in the reference copies")
	}
	const perKind, mixed = 800, 23000 - 800*14 // super-blocks
	if len(equivKinds) != 14 {
		t.Fatalf("%d kinds: update the block counts", len(equivKinds))
	}
	rng := rand.New(rand.NewPCG(11, 12))
	type set struct {
		name string
		x    []float32
	}
	var sets []set
	for k, kind := range equivKinds {
		sets = append(sets, set{kind.name, equivData(rng, k, perKind)})
	}
	sets = append(sets, set{"mixed sub-blocks", equivData(rng, -1, mixed)})
	for _, d := range quantTypes {
		for _, s := range sets {
			t.Run(fmt.Sprintf("%s/%s", d, s.name), func(t *testing.T) {
				const cols = 4 * qk
				rows := len(s.x) / cols
				got, err := QuantizeRows(d, s.x, rows, cols)
				if err != nil {
					t.Fatal(err)
				}
				want := quantizeRowsRef(d, s.x, rows, cols)
				if bytes.Equal(got, want) {
					return
				}
				elems, size := d.BlockSize()
				for b := 0; b < len(want)/size; b++ {
					g, w := got[b*size:(b+1)*size], want[b*size:(b+1)*size]
					if !bytes.Equal(g, w) {
						t.Fatalf("block %d differs:\ngot  %x\nwant %x\ninput %v", b, g, w, s.x[b*elems:(b+1)*elems])
					}
				}
			})
		}
	}
}

// TestQuantizeRowsGolden holds QuantizeRows to hashes of the bytes that
// the reference quantizers make, in the default amd64 build, of a fixed
// mixture of equivKinds, so that every build (whatever it fuses) makes
// them too.
func TestQuantizeRowsGolden(t *testing.T) {
	golden := map[DType]string{
		Q8_0: "b7b415060aba65535164d692eb35d2b4e6284e8d5d1ab901750ec02e47c5b1ce",
		Q4_0: "fccb2d61858b34f9636fe23c659590c963870df5032fc387e3451dd670bfe5f2",
		Q5_0: "3d10fa0942bcb885503cc8392a1b7d086d3cdbf1998f7fe4010f28b6291f2775",
		Q4_K: "732ec7262e2822387677f3a4cf6cf934af7e60b7310601f3fe1b97e52f1e27e2",
		Q5_K: "64ea7e98c5314a9d76d1d75d91ef9c1f9e677fec30cfc3f7c4387479cb55c952",
		Q6_K: "7f42dead4f3e2773ecb2ed3b2b2ab990e9d1a3b5b9e6ad4942455f6c38160647",
	}
	rng := rand.New(rand.NewPCG(21, 22))
	var sets [][]float32
	for k := range equivKinds {
		sets = append(sets, equivData(rng, k, 64))
	}
	sets = append(sets, equivData(rng, -1, 1024))
	for _, d := range quantTypes {
		h := sha256.New()
		for _, x := range sets {
			q, err := QuantizeRows(d, x, len(x)/qk, qk)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(q)
		}
		if got := fmt.Sprintf("%x", h.Sum(nil)); got != golden[d] {
			t.Errorf("%s: hash %s, want %s", d, got, golden[d])
		}
	}
}

// FuzzQuantizeMatchesReference holds every dtype's quantizer to the
// reference on one super-block of arbitrary float32 bit patterns.
func FuzzQuantizeMatchesReference(f *testing.F) {
	if fusesMulAdd() {
		f.Skip("this build fuses multiply-adds in the reference copies")
	}
	seed := make([]byte, 4*qk)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 4 {
		for i := 0; i < len(seed); i += 4 {
			binary.LittleEndian.PutUint32(seed[i:], math.Float32bits(float32(rng.NormFloat64())))
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		x := make([]float32, qk)
		for i := range min(qk, len(data)/4) {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		for _, d := range quantTypes {
			got, err := QuantizeRows(d, x, 1, qk)
			if err != nil {
				t.Fatal(err)
			}
			if want := quantizeRowsRef(d, x, 1, qk); !bytes.Equal(got, want) {
				t.Fatalf("%s: got %x, want %x for %v", d, got, want, x)
			}
		}
	})
}
