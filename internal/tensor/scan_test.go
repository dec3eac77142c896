package tensor

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refArgMax is ArgMax written plainly.
func refArgMax(x []float32) (int, float32) {
	if len(x) == 0 {
		return 0, float32(math.Inf(-1))
	}
	best, bv := 0, float32(math.Inf(-1))
	for i, v := range x {
		if v > bv {
			best, bv = i, v
		}
	}
	return best, x[best]
}

// refAppendAbove is AppendAbove written plainly.
func refAppendAbove(dst []int32, x []float32, t float32) []int32 {
	for i, v := range x {
		if v > t {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// scanRows returns rows of every length 0..70 and some long ones, drawn
// from a few small value sets (so ties are common) and with ±Inf, NaN and
// signed zeros mixed in.
func scanRows(rng *rand.Rand) [][]float32 {
	special := []float32{
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.MaxFloat32,
	}
	var lens []int
	for n := range 71 {
		lens = append(lens, n, n)
	}
	lens = append(lens, 255, 256, 257, 1000, 4099, 49152, 49152+13)
	var rows [][]float32
	for r, n := range lens {
		x := make([]float32, n)
		levels := 1 + r%7 // few distinct values: many ties
		for i := range x {
			switch u := rng.Float64(); {
			case r%5 == 0:
				x[i] = rng.Float32()*20 - 10
			case u < 0.05:
				x[i] = special[rng.IntN(len(special))]
			default:
				x[i] = float32(rng.IntN(levels)) - 2
			}
		}
		rows = append(rows, x)
		if r%9 == 0 { // all -Inf and NaN: nothing above -Inf
			y := make([]float32, n)
			for i := range y {
				y[i] = float32(math.Inf(-1))
				if rng.IntN(3) == 0 {
					y[i] = float32(math.NaN())
				}
			}
			rows = append(rows, y)
		}
	}
	return rows
}

func TestArgMaxMatchesPlainLoop(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, x := range scanRows(rng) {
			i, v := ArgMax(x)
			wi, wv := refArgMax(x)
			if i != wi || math.Float32bits(v) != math.Float32bits(wv) {
				t.Fatalf("len %d: ArgMax = %d, %v; want %d, %v", len(x), i, v, wi, wv)
			}
		}
	})
}

func TestArgMaxKeepsFirstOfTiedSignedZeros(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		for n := 1; n < 70; n++ {
			for at := range n {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(math.Inf(-1))
				}
				x[at] = float32(math.Copysign(0, -1))
				for i := at + 1; i < n; i++ {
					x[i] = 0
				}
				if i, v := ArgMax(x); i != at || !math.Signbit(float64(v)) {
					t.Fatalf("len %d: ArgMax = %d, %v; want %d, -0", n, i, v, at)
				}
			}
		}
	})
}

func TestAppendAboveMatchesPlainLoop(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		thresholds := []float32{
			float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN()), // all but NaN, none, none
			-math.MaxFloat32, -3, -1, 0, float32(math.Copysign(0, -1)), 1, 2, 9.5,
		}
		for _, x := range scanRows(rng) {
			for _, th := range thresholds {
				prefix := []int32{7, 8} // appends after what dst holds
				got := AppendAbove(slices.Clone(prefix), x, th)
				want := refAppendAbove(slices.Clone(prefix), x, th)
				if !slices.Equal(got, want) {
					t.Fatalf("len %d, t %v: got %d indices, want %d\ngot  %v\nwant %v", len(x), th, len(got), len(want), got, want)
				}
			}
		}
	})
}

func TestAppendAboveNextBelowIsAtLeast(t *testing.T) {
	x := []float32{-1, float32(math.Copysign(0, -1)), 0, math.SmallestNonzeroFloat32, 1, float32(math.Inf(1)), float32(math.NaN())}
	for _, th := range x {
		var want []int32
		for i, v := range x {
			if v >= th {
				want = append(want, int32(i))
			}
		}
		got := AppendAbove(nil, x, math.Nextafter32(th, float32(math.Inf(-1))))
		if !slices.Equal(got, want) {
			t.Errorf("t %v: got %v, want %v", th, got, want)
		}
	}
}

// BenchmarkScan measures ArgMax and AppendAbove over a vocabulary-sized row
// of logits, AppendAbove keeping about 1 in 16 entries.
//
//	go test -run '^$' -bench Scan ./internal/tensor
func BenchmarkScan(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 49152)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	thr := float32(1.53) // about 1 in 16 above
	for _, isa := range ISAs() {
		if err := SetISA(isa); err != nil {
			b.Fatal(err)
		}
		b.Run("ArgMax/"+isa, func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				ArgMax(x)
			}
		})
		b.Run("AppendAbove/"+isa, func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			dst := make([]int32, 0, len(x))
			for b.Loop() {
				dst = AppendAbove(dst[:0], x, thr)
			}
		})
	}
	if err := SetISA(ISAs()[0]); err != nil {
		b.Fatal(err)
	}
}
