package tensor

import "fmt"

// Decode's attention value sums with their prefetches inside the kernels.
//
// A decode token reads every key and value row of its sequence once, from
// KV blocks scattered over the pool, and at long contexts those reads are
// most of its attention: the caller knows which rows its later calls will
// read, and where the kernels allow it asks for them from inside the
// kernels' row loops, one cache line beside each step of the arithmetic,
// rather than in a burst of prefetches before the call that waits on the
// core's miss buffers (AttnKeyScoresBF16Prefetch does the same for the
// scores). The kernels walk the bytes to prefetch as one run of
// consecutive lines (measured faster than the same lines in the kernels'
// reading order, a head's slice of every row), so the caller hands on
// contiguous KV: a block's rows for every KV head.

// AttnDecodePrefetch reports whether the active ISA's decode attention
// kernels issue the prefetches that AttnKeyScoresBF16Prefetch and
// AttnValuesBF16 are given (the avx2 set); elsewhere both prefetch nothing
// and report 0 bytes.
func AttnDecodePrefetch() bool { return active.Load().attnKeysPf[0] != nil }

// AttnValuesBF16 is AxpyRowsBF16Group (the same results, bit for bit) that
// also asks for the bytes a later call will read, consecutive from pf bytes
// past v's first element. Where AttnDecodePrefetch holds, 2 ≤ g ≤ 4 and n
// is a multiple of 32, the kernel prefetches rows·n·2 bytes from there (as
// many as it reads), a cache line at a time among its arithmetic, and it
// returns that count; otherwise it prefetches nothing and returns 0. The
// caller prefetches the rest of what it wants. Prefetches are hints: the
// addresses need not be valid. It panics if a slice is too short.
func AttnValuesBF16(g, n int, y []float32, ldy int, alpha []float32, lda, rows int, v []uint16, ldv, pf int) int {
	ks := active.Load()
	if g < 2 || g > maxTileRows || n <= 0 || n%32 != 0 || rows <= 0 || ks.attnValues[g-2] == nil {
		AxpyRowsBF16Group(g, n, y, ldy, alpha, lda, rows, v, ldv)
		return 0
	}
	if len(y) < (g-1)*ldy+n || len(alpha) < (g-1)*lda+rows || ldy < n || lda < rows ||
		len(v) < (rows-1)*ldv+n || (rows > 1 && ldv < n) {
		panic(fmt.Sprintf("tensor: AttnValuesBF16 with short operands (g=%d n=%d rows=%d; len y=%d alpha=%d v=%d; ldy=%d lda=%d ldv=%d)",
			g, n, rows, len(y), len(alpha), len(v), ldy, lda, ldv))
	}
	ks.attnValues[g-2](&alpha[0], lda, &v[0], ldv, rows, &y[0], ldy, n, pf)
	return rows * n * 2
}
