package tensor

import (
	"fmt"
	"unsafe"
)

// Decode attention's KV prefetches on the avx512bf16 path.
//
// A decode token reads every key and value row of its sequence once, from
// KV blocks scattered over the pool, and at long contexts those reads are
// most of its attention. As on the avx2 set (attnvalues.go), the caller
// knows which bytes its later calls read and the kernels ask for them one
// cache line beside each step of their arithmetic, rather than in bursts
// before the calls that wait on the core's miss buffers. The bf16 path's
// value sum reads a whole key chunk, several blocks, in one call, so a
// call's share of the stream is rarely one run of consecutive bytes: the
// kernels take a KVStream, a list of runs, and walk it a few lines at a
// time (a step's worth, into L2), moving to the next run at each run's end.

// KVStream is a list of runs of consecutive bytes for a decode attention
// kernel to prefetch (DotRowsBF16Stream, AttnPVBF16Stream). The zero value
// is an empty list; it keeps its memory across Reset.
type KVStream struct {
	runs []uintptr // start and end of each run, then the kernel's end run
}

// Reset empties the list.
func (s *KVStream) Reset() { s.runs = s.runs[:0] }

// Add appends the run of the bytes bytes from b's first element (b is
// where they are, not a bound on them: prefetches are hints).
func (s *KVStream) Add(b []uint16, bytes int) {
	if bytes <= 0 {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	s.runs = append(s.runs, p, p+uintptr(bytes))
}

// start ends the list with a run from own (the call's own rows, which
// cost nothing to ask for again) that the kernel never reaches the end of,
// and returns the kernel's starting position: its first line, the end of
// that line's run and the address of the run after.
func (s *KVStream) start(own unsafe.Pointer) (pf, end, next uintptr) {
	s.runs = append(s.runs, uintptr(own), ^uintptr(0))
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.runs)))
	return s.runs[0], s.runs[1], base + 2*unsafe.Sizeof(uintptr(0))
}

// AttnStreamBF16 reports whether the active ISA's bf16 attention kernels
// prefetch the KVStream that DotRowsBF16Stream and AttnPVBF16Stream are
// given (the avx512bf16 set); elsewhere both prefetch nothing and report 0
// bytes.
func AttnStreamBF16() bool { return active.Load().attnPVStream != nil }

// DotRowsBF16Stream is DotRowsBF16 (the same results, bit for bit) that
// also prefetches the runs of s. Where AttnStreamBF16 holds and q is
// rounded to bf16, the kernel prefetches a cache line per weight row per
// step of 32 elements, n·64·⌊k/32⌋ bytes (as many as it reads when k is a
// multiple of 32), from s's runs on and then from w's own rows, and it
// returns that count; otherwise it prefetches nothing and returns 0. Query
// rows past the first 4 are scored without prefetches.
func DotRowsBF16Stream(out []float32, ldo int, q *BF16Query, w []uint16, ldw, n int, s *KVStream) int {
	rows, k := q.rows, q.k
	ks := active.Load()
	if ks.attnKeysStream[0] == nil || !q.rounded || n == 0 || rows == 0 || k < 32 {
		DotRowsBF16(out, ldo, q, w, ldw, n)
		return 0
	}
	if len(out) < (rows-1)*ldo+n || (rows > 1 && ldo < n) || ldw < k || len(w) < (n-1)*ldw+k {
		panic(fmt.Sprintf("tensor: DotRowsBF16Stream with short operands (rows=%d n=%d k=%d; len out=%d w=%d; ldo=%d ldw=%d)",
			rows, n, k, len(out), len(w), ldo, ldw))
	}
	if q.rounded != (ks.toBF16 != nil) {
		panic("tensor: DotRowsBF16Stream with a query prepared under another ISA")
	}
	r := min(maxTileRows, rows)
	pf, end, next := s.start(unsafe.Pointer(&w[0]))
	ks.attnKeysStream[r-1](&q.xb[0], k, &w[0], ldw, k, n, &out[0], ldo, pf, end, next)
	if r < rows {
		rest := q.Rows(r, rows-r)
		DotRowsBF16(out[r*ldo:], ldo, &rest, w, ldw, n)
	}
	return n * (k / 32) * 64
}

// AttnPVBF16Stream is AttnPVBF16 (the same results, bit for bit) that also
// prefetches the runs of s. Where AttnStreamBF16 holds, the kernel
// prefetches per pair of keys as many cache lines as the pair's two value
// rows span (two per 32 elements of hd, one per 16 or fewer left), for
// every block of 8 query rows, from s's runs on and then from the first
// value row's own bytes, and it returns that count in bytes; otherwise it
// prefetches nothing and returns 0.
func AttnPVBF16Stream(acc []float32, lda int, w []uint16, ldw, rows int, v []uint16, offs []int, n, hd int, s *KVStream) int {
	if rows <= 0 || n <= 0 || hd <= 0 {
		return 0
	}
	ks := active.Load()
	if ks.attnPVStream == nil {
		AttnPVBF16(acc, lda, w, ldw, rows, v, offs, n, hd)
		return 0
	}
	checkPV(acc, lda, w, ldw, rows, v, offs, n, hd)
	pf, end, next := s.start(unsafe.Pointer(&v[offs[0]]))
	ks.attnPVStream(&acc[0], lda, &w[0], ldw, rows, &v[0], &offs[0], n, hd, pf, end, next)
	lines := 2 * (hd / 32)
	if hd%32 >= 16 {
		lines++
	}
	if hd%16 != 0 {
		lines++
	}
	return (rows + 7) / 8 * (n / 2) * lines * 64
}
