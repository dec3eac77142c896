package sample

import (
	"math"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// block is the granularity of a draw from dense weights: it picks a block
// by its sum before walking the tokens inside it.
const block = 256

// sumBlock is the granularity at which exponentials are summed: the raw
// top-N search skips blocks by their sums, and summing float32 block sums
// in float64 keeps totals accurate to about 1e-7. Raw and sampling rows
// use the same blocks, so that a total does not depend on which of them
// computed it (logprobs must not change the tokens drawn).
const sumBlock = 512

// ones is the second operand of Dot when it sums a block.
var ones = func() (o [block]float32) {
	for i := range o {
		o[i] = 1
	}
	return o
}()

// padded returns n rounded up to whole blocks.
func padded(n int) int { return (n + block - 1) / block * block }

// shiftSamples is about how many logits estimate a row's maximum. The
// estimate only has to keep the weights from overflowing, and a sample
// misses an outstanding maximum whatever its size, so it is small.
const shiftSamples = 256

// expRow is one row of exponentials, w[i] = e^(x[i]·invT - shift), with
// shift close to max(x)·invT, computed with the tensor package's vector
// exponential (tensor.ExpSum, per sumBlock) and, at a temperature other
// than 1, its vector multiply-add for the scaling. The results depend on
// the ISA tensor runs with (see tensor.ISA), like the model's logits do.
type expRow struct {
	// x is the row the weights were computed from: the caller's, or a
	// copy with NaN replaced by -Inf when it held any.
	x []float32
	// w has len(x) rounded up to whole blocks; entries past len(x) are 0.
	w     []float32
	sums  []float32 // per sumBlock of w, as tensor.ExpSum returned them
	total float64   // Σ sums
	shift float32
	// ok is false when x has no finite maximum: max is then -Inf (every
	// logit -Inf or NaN) or +Inf, and w is not set.
	ok  bool
	max float32

	clean []float32 // buffer for the NaN-free copy of x
}

// fill computes r from x and the inverse temperature invT. It first takes
// the shift from the largest of a strided sample of x, which saves a pass
// over the row to find its maximum: the largest weight is then e^(gap·invT)
// for the gap between the maximum and the sample's, finite unless the gap
// is huge. If a block sum comes out NaN (a NaN logit) or too large (the
// sample missed the maximum by far, or a logit is +Inf), fill redoes the row
// from a copy with NaN as -Inf and the exact maximum. Either way the result
// depends only on x and invT.
func (r *expRow) fill(x []float32, invT float32) {
	r.x = x
	mx := sampleMax(x)
	if invT > 4 {
		// Below temperature 0.25 a gap of a few logits overflows often
		// enough that a pass to find the maximum pays.
		mx = maxOf(x)
	}
	if !math.IsInf(float64(mx), 0) && r.exp(mx*invT, invT) {
		r.ok = true
		return
	}
	r.clean = resize(r.clean, len(x))
	for i, v := range x {
		if v != v {
			v = negInf
		}
		r.clean[i] = v
	}
	r.x = r.clean
	r.max = maxOf(r.x)
	r.ok = !math.IsInf(float64(r.max), 0)
	if r.ok {
		r.exp(r.max*invT, invT) // cannot overflow: every exponent is <= 0
	}
}

// maxSum bounds a block sum so that sums of many blocks, and of their
// weights in any order, stay far from float32 overflow.
const maxSum = 1 << 64

// exp computes the weights with the given shift and reports whether every
// block sum is finite and at most maxSum.
func (r *expRow) exp(shift, invT float32) bool {
	x := r.x
	n := len(x)
	r.w = resize(r.w, padded(n))
	w := r.w[:n]
	if invT == 1 {
		copy(w, x)
	} else {
		// w = invT·x, rounded as the float32 product (Axpy adds it to 0).
		clear(w)
		tensor.Axpy(invT, x, w)
	}
	clear(r.w[n:])
	r.sums = resize(r.sums, (n+sumBlock-1)/sumBlock)
	var total float64
	for b := range r.sums {
		s := tensor.ExpSum(w[b*sumBlock:min(n, (b+1)*sumBlock)], shift)
		if !(s <= maxSum) { // also NaN
			return false
		}
		r.sums[b] = s
		total += float64(s)
	}
	r.total, r.shift = total, shift
	return true
}

// sampleMax returns the largest of about shiftSamples evenly spaced
// entries of x, ignoring NaN; -Inf if there is none.
func sampleMax(x []float32) float32 {
	stride := max(1, len(x)/shiftSamples)
	m := negInf
	for i := 0; i < len(x); i += stride {
		if v := x[i]; v > m {
			m = v
		}
	}
	return m
}

// maxOf returns the largest entry of x, ignoring NaN; -Inf if there is
// none.
func maxOf(x []float32) float32 {
	_, v := tensor.ArgMax(x) // x[0] when nothing beats -Inf
	return v
}

// drawDense draws a token from the weights w (a whole number of blocks)
// with probability proportional to its weight, walking in id order until
// the running sum passes u times the total. Blocks are summed with
// tensor.Dot and the walk skips whole blocks by their sums, so the draw
// costs one vector pass over w plus one block. It returns -1 if every
// weight is 0.
//
// The result depends only on the values in w and u: zero entries, and
// trailing all-zero blocks, change nothing. So draw, which scatters a
// candidate list into zeros and walks that, draws exactly what drawDense
// draws from dense weights with the same nonzero entries.
func drawDense(w []float32, u float64, sc *scratch) int32 {
	sc.sums = resize(sc.sums, len(w)/block)
	var total float64
	for b := range sc.sums {
		s := tensor.Dot(w[b*block:(b+1)*block], ones[:])
		sc.sums[b] = s
		total += float64(s)
	}
	return walk(w, sc.sums, total, u)
}

// walk finds the token at u·total in w's running sum, given the block
// sums and their total (summed in order).
func walk(w, sums []float32, total float64, u float64) int32 {
	target := u * total
	var acc float64
	last := -1 // last block with any weight
	for b, s := range sums {
		if s == 0 {
			continue
		}
		last = b
		next := acc + float64(s)
		if next > target {
			return walkBlock(w[b*block:(b+1)*block], b, acc, target)
		}
		acc = next
	}
	if last < 0 {
		return -1
	}
	// Rounding left target at or beyond the total: the last weighted token.
	return walkBlock(w[last*block:(last+1)*block], last, 0, math.Inf(1))
}

// walkBlock walks block b of weights from the running sum acc until it
// passes target. If rounding leaves the block's own sum short of its block
// sum, it returns the block's last weighted token.
func walkBlock(w []float32, b int, acc, target float64) int32 {
	last := -1
	for j, v := range w {
		if v > 0 {
			acc += float64(v)
			if acc > target {
				return int32(b*block + j)
			}
			last = j
		}
	}
	return int32(b*block + last)
}

// draw picks from non-empty cs with probability proportional to weight.
// It scatters the weights into a zeroed dense row and draws from it as
// drawDense does (only the blocks holding candidates are summed), so a
// candidate list and the dense weights it was taken from draw the same
// token for the same u, whatever the list's order.
func draw(cs []cand, u float64) int32 {
	maxID := int32(0)
	for _, c := range cs {
		maxID = max(maxID, c.id)
	}
	sc := getScratch(0)
	defer putScratch(sc)
	n := padded(int(maxID) + 1)
	sc.dense = resize(sc.dense, n) // all zero between uses
	sc.sums = resize(sc.sums, n/block)
	dense, sums := sc.dense[:n], sc.sums
	clear(sums)
	for _, c := range cs {
		dense[c.id] = c.w
		sums[c.id/block] = 1 // marks the block for summing below
	}
	var total float64
	for b, s := range sums {
		if s != 0 {
			s = tensor.Dot(dense[b*block:(b+1)*block], ones[:])
			sums[b] = s
			total += float64(s)
		}
	}
	tok := walk(dense, sums, total, u)
	for _, c := range cs {
		dense[c.id] = 0
	}
	if tok < 0 {
		return cs[0].id // no weight at all
	}
	return tok
}
