package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// expSumISA selects the avx2 kernel set (its exponential's 8-lane
// accumulator is what the tests below model) or skips.
func expSumISA(t testing.TB) {
	t.Helper()
	if !slices.Contains(ISAs(), "avx2") {
		t.Skip("no avx2 on this CPU")
	}
	def := ISA()
	t.Cleanup(func() { _ = SetISA(def) })
	if err := SetISA("avx2"); err != nil {
		t.Fatal(err)
	}
}

// TestExpSumMatchesItsOrder checks the avx2 ExpSum, whose full vectors are
// summed from registers and whose partial vector from memory, against its
// documented order: every x[t] is the exponential one element at a time
// gives (the masked path, the same lane arithmetic), and the sum is an
// 8-lane accumulator that takes x[t] in lane t%8 in order from +0, reduced
// by ((L0+L4)+(L2+L6)) + ((L1+L5)+(L3+L7)). Lengths 1–200 cover whole
// vectors, partial ones and both; the data include scores far below the
// maximum (underflow to zero and subnormals) and equal to it.
func TestExpSumMatchesItsOrder(t *testing.T) {
	expSumISA(t)
	r := rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 200; n++ {
		x := make([]float32, n)
		for i := range x {
			switch r.IntN(8) {
			case 0:
				x[i] = -90 - 20*r.Float32() // e^x underflows or is subnormal
			case 1:
				x[i] = 0
			default:
				x[i] = float32(r.NormFloat64() * 4)
			}
		}
		mx := float32(r.NormFloat64())
		want := make([]float32, n)
		var lanes [8]float32
		for i, v := range x {
			one := []float32{v}
			ExpSum(one, mx)
			want[i] = one[0]
			lanes[i%8] += one[0]
		}
		wantSum := ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
		got := slices.Clone(x)
		sum := ExpSum(got, mx)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d: x[%d] = %g (%#x), one element at a time %g (%#x)", n, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
		if math.Float32bits(sum) != math.Float32bits(wantSum) {
			t.Fatalf("n %d: sum %g (%#x), the pinned order gives %g (%#x)", n, sum, math.Float32bits(sum), wantSum, math.Float32bits(wantSum))
		}
	}
}

// BenchmarkExpSum times, in cache, one decode chunk's exponentials (64
// scores, attention's key chunk) and a partial one.
func BenchmarkExpSum(b *testing.B) {
	expSumISA(b)
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{64, 61} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(r.NormFloat64() * 4)
		}
		x := make([]float32, n)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for b.Loop() {
				copy(x, src)
				ExpSum(x, 3)
			}
		})
	}
}
