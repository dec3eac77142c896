package tensor

import (
	"math"
	"sync"
)

// Placeholder pure-Go implementations of the kernel API. The kernels issue
// replaces these with assembly-backed versions behind the same signatures.

// BF16ToF32 widens a bfloat16 bit pattern.
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds to nearest even.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE half bit pattern.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		for mant&0x400 == 0 {
			mant <<= 1
			exp--
		}
		exp++
		mant &= 0x3ff
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// Pool is a persistent set of worker goroutines that run data-parallel kernels.
type Pool struct {
	threads int
}

// NewPool starts a pool of threads workers (at least 1).
func NewPool(threads int) *Pool {
	if threads < 1 {
		threads = 1
	}
	return &Pool{threads: threads}
}

// Threads reports the pool's parallelism.
func (p *Pool) Threads() int { return p.threads }

// Close stops the workers.
func (p *Pool) Close() {}

// Parallel splits [0,n) into contiguous ranges and runs fn on them across
// the workers, returning when all are done.
func (p *Pool) Parallel(n int, fn func(lo, hi int)) {
	if p.threads == 1 || n < 2 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + p.threads - 1) / p.threads
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() { defer wg.Done(); fn(lo, hi) }()
	}
	wg.Wait()
}

// MatMul computes out[i*w.Rows+j] = Σ_k x[i*w.Cols+k]·W[j][k] for i < m.
// Each output element is computed with the same reduction order whatever m
// is and whichever worker computes it (batch invariance).
func (p *Pool) MatMul(out, x []float32, m int, w *Mat) {
	p.Parallel(w.Rows, func(lo, hi int) {
		row := make([]float32, w.Cols)
		for j := lo; j < hi; j++ {
			w.Row(j, row)
			for i := 0; i < m; i++ {
				out[i*w.Rows+j] = Dot(x[i*w.Cols:(i+1)*w.Cols], row)
			}
		}
	})
}

// Dot returns Σ a[i]·b[i] over len(a).
func Dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// Axpy computes y += a·x.
func Axpy(a float32, x, y []float32) {
	for i := range x {
		y[i] += a * x[i]
	}
}

// RMSNorm writes x/rms(x)·w into out (one row).
func RMSNorm(out, x, w []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
	for i, v := range x {
		out[i] = v * inv * w[i]
	}
}

// SiLUMul computes gate[i] = silu(gate[i])·up[i].
func SiLUMul(gate, up []float32) {
	for i, g := range gate {
		gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}

// Softmax normalises x in place.
func Softmax(x []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] *= inv
	}
}
