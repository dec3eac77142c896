package tensor

import "fmt"

// Decode's attention scores over a bf16 pool on the ISAs whose activations
// stay f32 (avx2): the keys are scored where they are stored, as rows, like
// DotRowsBF16 does, but 8 keys' reductions are done together. DotRowsBF16
// (the matmul kernels' order) keeps one 8-lane accumulator per score and
// sums its lanes with a fixed tree, one score at a time; the kernels behind
// AttnKeyScoresBF16 keep the same accumulators and reduce 8 of them into
// one vector of 8 scores by the same additions (see asmgen's attnavx2.go),
// so every score has DotRowsBF16's bits while the horizontal sums cost
// about a third of the instructions. Unlike the prefill kernels
// (AttnScoresF32) nothing is packed: a decode token reads each key once.

// AttnKeyScores reports whether the active ISA scores keys 8 at a time in
// AttnKeyScoresBF16 (the avx2 set); elsewhere AttnKeyScoresBF16 is
// DotRowsBF16.
func AttnKeyScores() bool { return active.Load().attnKeys[0] != nil }

// AttnKeyScoresBF16 computes what DotRowsBF16 computes, bit for bit:
// out[r·ldo + j] = q_r · k_j for the query rows prepared in q and the n
// bf16 key rows k[j·ldk:][:hd], hd the query's length. Where AttnKeyScores
// holds, a head dimension that is a multiple of 8 and whole groups of 8
// keys go through the 8-keys-a-vector kernels, and the last n%8 keys (or
// all of them otherwise) through DotRowsBF16. It panics if a slice is too
// short.
func AttnKeyScoresBF16(out []float32, ldo int, q *BF16Query, k []uint16, ldk, n int) {
	attnKeyScores(out, ldo, q, k, ldk, n, false, 0)
}

// AttnKeyScoresBF16Prefetch is AttnKeyScoresBF16 that also asks for the
// bytes a later call will read, consecutive from pf bytes past k's first
// element: where the 8-keys-a-vector kernels run, they prefetch cache lines
// from there on, one at a time among their arithmetic, and it returns how
// many bytes they covered: 64·8·⌊hd/32⌋ a group of 8 keys (as many as the
// group's rows hold when hd is a multiple of 32), or 0 where DotRowsBF16
// scores them all. The caller prefetches the rest of what it wants.
// Prefetches are hints: the addresses need not be valid, and no result
// changes (the same bits as without).
func AttnKeyScoresBF16Prefetch(out []float32, ldo int, q *BF16Query, k []uint16, ldk, n, pf int) int {
	return attnKeyScores(out, ldo, q, k, ldk, n, true, pf)
}

// attnKeyScores is AttnKeyScoresBF16, or with prefetch
// AttnKeyScoresBF16Prefetch.
func attnKeyScores(out []float32, ldo int, q *BF16Query, k []uint16, ldk, n int, prefetch bool, pf int) int {
	rows, hd := q.rows, q.k
	ks := active.Load()
	if ks.attnKeys[0] == nil || q.rounded || hd%8 != 0 || hd == 0 || n < 8 || rows == 0 {
		DotRowsBF16(out, ldo, q, k, ldk, n)
		return 0
	}
	if len(out) < (rows-1)*ldo+n || (rows > 1 && ldo < n) || ldk < hd || len(k) < (n-1)*ldk+hd {
		panic(fmt.Sprintf("tensor: AttnKeyScoresBF16 with short operands (rows=%d n=%d hd=%d; len out=%d k=%d; ldo=%d ldk=%d)",
			rows, n, hd, len(out), len(k), ldo, ldk))
	}
	groups := n / 8
	for r0 := 0; r0 < rows; r0 += attnF32Rows {
		r := min(attnF32Rows, rows-r0)
		if prefetch {
			ks.attnKeysPf[r-1](&q.x[r0*hd], hd, &k[0], ldk, groups, hd, &out[r0*ldo], ldo, pf)
		} else {
			ks.attnKeys[r-1](&q.x[r0*hd], hd, &k[0], ldk, groups, hd, &out[r0*ldo], ldo)
		}
	}
	if n8 := groups * 8; n8 < n {
		DotRowsBF16(out[n8:], ldo, q, k[n8*ldk:], ldk, n-n8)
	}
	if !prefetch {
		return 0
	}
	return groups * 8 * (hd / 32) * 64
}
