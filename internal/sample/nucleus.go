package sample

import (
	"math"
	"math/bits"
	"slices"
)

// outweighs reports whether the candidates weigh more than target, by a
// margin that float rounding of the sum cannot cross.
func outweighs(cs []cand, target float64) bool {
	var m [4]float64 // four chains of additions rather than one
	i := 0
	for ; i+4 <= len(cs); i += 4 {
		for j, c := range (*[4]cand)(cs[i : i+4]) {
			m[j] += float64(c.w)
		}
	}
	for _, c := range cs[i:] {
		m[0] += float64(c.w)
	}
	return (m[0]+m[1])+(m[2]+m[3]) > target*(1+1e-9)
}

// floorSamples is about how many weights nucleusFloor looks at.
const floorSamples = 2048

// floorShift leaves the exponent and 3 mantissa bits of a weight: the
// buckets of nucleusFloor, eight per power of two.
const floorShift = 20

// minCandidates is about the fewest tokens nucleusFloor lets through: the
// pass that collects them costs the same for a few hundred, and small
// nuclei, where the estimate below is rough, then still fit.
const minCandidates = 256

// nucleusFloor estimates a weight a little below the lightest token of the
// top-p nucleus of w (total weight z) from about floorSamples evenly spaced
// weights: the weight below which the tokens weigh (1-p)·z. Estimating the
// light tail, made of many tokens, rather than the heavy head, made of few,
// keeps the estimate steady. It buckets the sample by the top bits of the
// weights, eight buckets per power of two, and answers three buckets lower
// than the one where the tail's estimated weight reaches (1-p)·z, or lower
// still if fewer than about minCandidates tokens would be above it. It also
// returns about how many tokens are above the floor.
//
// A floor too high is caught by the caller and costs a second pass; too low
// costs candidates. TestNucleusFloorIsTightAndRarelyTooHigh measures both
// over a sweep of distributions: three buckets is the least margin with no
// miss there, and keeps about 1.2 times the nucleus.
func nucleusFloor(w []float32, z, p float64, sc *scratch) (float32, int) {
	stride := max(1, len(w)/floorSamples)
	mass, count := &sc.floorMass, &sc.floorCount // all zero between uses
	lo, hi := uint32(len(mass)-1), uint32(0)
	for i := 0; i < len(w); i += stride {
		v := w[i]
		k := math.Float32bits(v) >> floorShift
		mass[k] += float64(v)
		count[k]++
		lo, hi = min(lo, k), max(hi, k)
	}
	tail := (1 - p) * z / float64(stride)
	k := lo // the bucket where the tail's weight passes tail
	for acc := mass[k]; acc <= tail && k < hi; {
		k++
		acc += mass[k]
	}
	k = max(k, 3) - 3
	// Count the buckets from the top down to k, and on below it until
	// about minCandidates tokens are in.
	above := 0
	floor := float32(0) // if the whole sample is in
	for j := hi; j > lo; j-- {
		if above += int(count[j]) * stride; j <= k && above >= minCandidates {
			floor = math.Float32frombits(j << floorShift)
			break
		}
	}
	clear(mass[lo : hi+1])
	clear(count[lo : hi+1])
	return floor, above
}

// The digits of a weight that byWeight selects on, most significant first:
// the top one (the exponent and 3 mantissa bits; the sign is 0) buckets
// all candidates, the lower ones only those left in play by a query.
const topShift, topWidth = 20, 11

var lowDigits = [...]struct{ shift, width uint }{{10, 10}, {0, 10}}

// byWeight answers where the running weight of a candidate list, taken in
// descending order of weight with ties in ascending id (the order top-p is
// defined in), reaches a given value, without sorting the list. It buckets
// the candidates once by the top bits of their weights (non-negative
// floats order as their bits) and sums the weight per bucket; a query
// walks the buckets from the top to the one where the running weight
// reaches its value, resolves that bucket the same way on the next bits,
// and sorts only the few candidates left.
//
// The per-bucket sums are taken in four interleaved copies: top-p
// candidates crowd into a few buckets, and one copy would chain most
// additions through the same memory word.
type byWeight struct {
	cs     []cand
	sc     *scratch // holds the sums, all zero outside a byWeight's life
	lo, hi uint32   // the top digits in use
}

func (q *byWeight) init(cs []cand, sc *scratch) {
	q.cs, q.sc = cs, sc
	sc.mass = resize(sc.mass, 4<<topWidth)
	mass := sc.mass
	lo, hi := uint32(1<<topWidth-1), uint32(0)
	i := 0
	for ; i+4 <= len(cs); i += 4 {
		for j, c := range (*[4]cand)(cs[i : i+4]) {
			k := math.Float32bits(c.w) >> topShift
			mass[4*k+uint32(j)] += float64(c.w)
			lo, hi = min(lo, k), max(hi, k)
		}
	}
	for _, c := range cs[i:] {
		k := math.Float32bits(c.w) >> topShift
		mass[4*k] += float64(c.w)
		lo, hi = min(lo, k), max(hi, k)
	}
	q.lo, q.hi = lo, hi
	for k := lo; k <= hi; k++ {
		m := (*[4]float64)(mass[4*k : 4*k+4])
		m[0] += m[1] + m[2] + m[3]
	}
}

// release clears the sums for the next byWeight.
func (q *byWeight) release() {
	if q.lo <= q.hi {
		clear(q.sc.mass[4*q.lo : 4*q.hi+4])
	}
}

// total returns the weight of all candidates, summed as at sums it.
func (q *byWeight) total() float64 {
	var acc float64
	for k := q.hi; k+1 > q.lo; k-- { // k >= q.lo, also for q.lo = 0
		acc += q.sc.mass[4*k]
	}
	return acc
}

// at returns the first candidate in the order whose weight brings the
// running weight to at least t (past t if strict), and the running weight
// before it. It returns false if the whole list weighs too little.
func (q *byWeight) at(t float64, strict bool) (cand, float64, bool) {
	reached := func(acc float64) bool { return acc > t || (!strict && acc == t) }
	if len(q.cs) == 0 {
		return cand{}, 0, false
	}
	mass := q.sc.mass
	var acc float64 // weight before the candidates in play
	k := q.hi
	for ; k > q.lo && !reached(acc+mass[4*k]); k-- {
		acc += mass[4*k]
	}
	if !reached(acc + mass[4*k]) {
		return cand{}, 0, false
	}
	r := q.members(k)
	for level, d := range lowDigits {
		if len(r) <= 32 {
			break
		}
		// A histogram of the next digit, for the few candidates in play.
		sums := q.sc.low[:]
		mask := uint32(1)<<d.width - 1
		lo, hi := mask, uint32(0)
		for _, c := range r {
			k := math.Float32bits(c.w) >> d.shift & mask
			sums[k] += float64(c.w)
			lo, hi = min(lo, k), max(hi, k)
		}
		// Rounding of the sums may leave the value past the last digit;
		// it is then reached at the end.
		k := hi
		for ; k > lo && !reached(acc+sums[k]); k-- {
			acc += sums[k]
		}
		clear(sums[lo : hi+1])
		r = digit(r, &q.sc.sub[(level+1)%2], d.shift, mask, k)
	}
	slices.SortFunc(r, func(x, y cand) int {
		switch {
		case x.w > y.w:
			return -1
		case x.w < y.w:
			return 1
		}
		return int(x.id) - int(y.id)
	})
	// If rounding leaves the value past the end of r, it is reached at
	// r's last candidate with any weight (one of them has some).
	last := len(r) - 1
	for last > 0 && r[last].w == 0 {
		last--
	}
	for _, c := range r[:last] {
		if reached(acc + float64(c.w)) {
			return c, acc, true
		}
		acc += float64(c.w)
	}
	return r[last], acc, true
}

// members returns the candidates whose top digit is k, copied into
// sc.sub[0].
func (q *byWeight) members(k uint32) []cand {
	cs := q.cs
	pos := resize(q.sc.pos, len(cs)+8)
	q.sc.pos = pos
	// The top digit is all the bits from topShift up.
	const high = uint32(1<<32 - 1<<topShift)
	want := k << topShift
	n := 0
	i := 0
	for ; i+8 <= len(cs); i += 8 {
		// Positions written always, kept when the digit is k: no branch
		// to mispredict.
		g := (*[8]int32)(pos[n : n+8])
		a := (*[8]cand)(cs[i : i+8])
		id := int32(i)
		m := 0
		m = keepPos(g, m, id, a[0].w, high, want)
		m = keepPos(g, m, id+1, a[1].w, high, want)
		m = keepPos(g, m, id+2, a[2].w, high, want)
		m = keepPos(g, m, id+3, a[3].w, high, want)
		m = keepPos(g, m, id+4, a[4].w, high, want)
		m = keepPos(g, m, id+5, a[5].w, high, want)
		m = keepPos(g, m, id+6, a[6].w, high, want)
		m = keepPos(g, m, id+7, a[7].w, high, want)
		n += m
	}
	for ; i < len(cs); i++ {
		pos[n] = int32(i)
		n += int((math.Float32bits(cs[i].w)&high ^ want - 1) >> 31)
	}
	sub := resize(q.sc.sub[0], n)
	q.sc.sub[0] = sub
	for j, p := range pos[:n] {
		sub[j] = cs[p]
	}
	return sub
}

// keepPos writes p at g[m] and returns m+1 if the bits of w under high
// are want, else m.
func keepPos(g *[8]int32, m int, p int32, w float32, high, want uint32) int {
	g[m&7] = p
	return m + int((math.Float32bits(w)&high^want-1)>>31)
}

// digit returns the candidates of r whose digit (bits >> shift & mask) is
// k, copied into *buf; the candidates of r agree on the bits above the
// digit.
func digit(r []cand, buf *[]cand, shift uint, mask, k uint32) []cand {
	*buf = resize(*buf, len(r)+8)
	sub := *buf
	if len(r) == 0 {
		return sub[:0]
	}
	// The digit is k when the bits from the digit up equal those of a
	// member with digit k: a mask and a compare, the same for every entry.
	high := ^uint32(0) << shift
	above := high << bits.Len32(mask)
	want := math.Float32bits(r[0].w)&above | k<<shift
	n := 0
	i := 0
	for ; i+8 <= len(r); i += 8 {
		// Written always, kept when the digit is k: no branch to
		// mispredict.
		g := (*[8]cand)(sub[n : n+8])
		a := (*[8]cand)(r[i : i+8])
		m := 0
		m = keepIf(g, m, a[0], high, want)
		m = keepIf(g, m, a[1], high, want)
		m = keepIf(g, m, a[2], high, want)
		m = keepIf(g, m, a[3], high, want)
		m = keepIf(g, m, a[4], high, want)
		m = keepIf(g, m, a[5], high, want)
		m = keepIf(g, m, a[6], high, want)
		m = keepIf(g, m, a[7], high, want)
		n += m
	}
	for _, c := range r[i:] {
		sub[n] = c
		n += int((math.Float32bits(c.w)&high ^ want - 1) >> 31)
	}
	return sub[:n]
}

// keepIf writes c at g[m] and returns m+1 if its bits under high are want,
// else m.
func keepIf(g *[8]cand, m int, c cand, high, want uint32) int {
	g[m&7] = c
	return m + int((math.Float32bits(c.w)&high^want-1)>>31)
}

// order is a key that sorts candidates as byWeight counts them:
// descending weight (non-negative floats order as their bits), then
// ascending id.
func (c cand) order() int64 {
	return int64(math.Float32bits(c.w))<<32 | int64(^uint32(c.id))
}

// nucleus reorders cs so that its first n entries are the top-p nucleus and
// returns n: in descending order of weight (ties: ascending id) a token is
// kept while the weight of the tokens before it is below target, so at least
// one token is kept. This is vLLM's rule (drop a token when the cumulative
// probability up to and including it, counted from the least likely, is at
// most 1-p): the last token kept is the one whose weight brings the running
// weight to target, found with byWeight, and one pass moves it and every
// token before it to the front.
func nucleus(cs []cand, target float64) int {
	if !(target > 0) {
		return 0 // nothing weighs less than nothing
	}
	sc := getScratch(0)
	defer putScratch(sc)
	var q byWeight
	q.init(cs, sc)
	defer q.release()
	last, _, ok := q.at(target, false)
	if !ok {
		return len(cs)
	}
	// Without branching on the (unpredictable) comparison.
	n := 0
	key := last.order()
	for i, c := range cs {
		cs[i] = cs[n]
		cs[n] = c
		n += int(1 + (c.order()-key)>>63) // c is at or before last
	}
	return n
}

// drawNucleus draws from the top-p nucleus of cs (see nucleus) with
// probability proportional to weight, walking it in the same descending
// order until the running weight passes u times the nucleus's weight. The
// nucleus is never materialized: both the cut and the draw are byWeight
// queries on all of cs.
func drawNucleus(cs []cand, target, u float64, sc *scratch) int32 {
	var q byWeight
	q.init(cs, sc)
	defer q.release()
	z := q.total()
	if last, before, ok := q.at(target, false); ok {
		z = before + float64(last.w)
	}
	c, _, ok := q.at(u*z, true)
	if !ok {
		// Rounding put u·z at z: the last token of the nucleus.
		c, _, _ = q.at(z, false)
	}
	return c.id
}
