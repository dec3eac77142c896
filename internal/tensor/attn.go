package tensor

import "fmt"

// The bf16 attention kernels: the three steps of attention over a bf16 KV
// cache when the activations are rounded to bf16 (the avx512bf16 ISA), for
// internal/model's attention, which documents the order of operations they
// implement. They exist only where AttnBF16 reports so.
//
// Keys are scored from a packed copy ("pair-transposed", PackKeysBF16) so
// that one VDPBF16PS yields 16 partial scores without horizontal sums; the
// scores are nevertheless bit-identical to DotRowsBF16's (see asmgen's
// attn.go for why). Values are read in place, two rows at a time, and the
// softmax weights are rounded to bf16 to multiply them with VDPBF16PS.

// AttnChunk is the largest number of keys AttnSoftmaxBF16 handles per
// call, and the number of bf16 weights it writes per row.
const AttnChunk = 64

// AttnBF16 reports whether the active ISA has the bf16 attention kernels
// (AttnScoresBF16, AttnSoftmaxBF16, AttnPVBF16). It implies
// BF16Activations.
func AttnBF16() bool { return active.Load().attnPV != nil }

// AttnKeyPairs is the number of bf16 pairs of a packed key and of a padded
// query row for head dimension hd: 16·⌈hd/32⌉, as many as the dot-product
// kernels' steps of 32 elements cover (the pairs past hd are zero).
func AttnKeyPairs(hd int) int { return 16 * ((hd + 31) / 32) }

// PackedKeysLen is the length of a packed-key buffer holding n keys of
// head dimension hd (whole groups of 16).
func PackedKeysLen(n, hd int) int { return (n + 15) / 16 * 16 * AttnKeyPairs(hd) }

// PackKeysBF16 writes n bf16 keys of hd elements, rows ldk apart in k, as
// keys j0..j0+n-1 of the packed buffer dst: key j goes to group j/16, and
// its pair p (elements 2p and 2p+1, zero past hd) to dst[(j/16)·16·P +
// 16p + j%16], P = AttnKeyPairs(hd). With k nil the keys are zero (the
// padding of the last group).
func PackKeysBF16(dst []uint32, j0 int, k []uint16, ldk, n, hd int) {
	if n <= 0 {
		return
	}
	P := AttnKeyPairs(hd)
	if j0 < 0 || len(dst) < PackedKeysLen(j0+n, hd) || (k != nil && (len(k) < (n-1)*ldk+hd || (n > 1 && ldk < hd))) {
		panic(fmt.Sprintf("tensor: PackKeysBF16 of %d keys from %d (hd %d) with len(dst)=%d, len(k)=%d, ldk=%d", n, j0, hd, len(dst), len(k), ldk))
	}
	half := hd / 2
	for i := range n {
		j := j0 + i
		col := dst[(j/16)*16*P+j%16:]
		if k == nil {
			for p := range P {
				col[16*p] = 0
			}
			continue
		}
		row := k[i*ldk : i*ldk+hd]
		for p := range half {
			col[16*p] = uint32(row[2*p]) | uint32(row[2*p+1])<<16
		}
		p := half
		if hd%2 == 1 {
			col[16*p] = uint32(row[hd-1])
			p++
		}
		for ; p < P; p++ {
			col[16*p] = 0
		}
	}
}

// AttnScoresBF16 computes out[r·ldo + j] = q_r · key_j for rows query rows
// and the keys of groups packed groups (j < 16·groups): query row r is
// q[r·ldq:][:2·AttnKeyPairs(hd)], bf16, zero past hd. Every score is
// bit-identical to what DotRowsBF16 computes for the same query and key
// rows. It panics if a slice is too short.
func AttnScoresBF16(out []float32, ldo int, q []uint16, ldq, rows int, keys []uint32, groups, hd int) {
	if rows <= 0 || groups <= 0 {
		return
	}
	P := AttnKeyPairs(hd)
	if len(q) < (rows-1)*ldq+2*P || (rows > 1 && ldq < 2*P) || len(keys) < groups*16*P ||
		len(out) < (rows-1)*ldo+16*groups || (rows > 1 && ldo < 16*groups) {
		panic(fmt.Sprintf("tensor: AttnScoresBF16 with short operands (rows=%d groups=%d hd=%d; len q=%d keys=%d out=%d; ldq=%d ldo=%d)",
			rows, groups, hd, len(q), len(keys), len(out), ldq, ldo))
	}
	ks := active.Load()
	steps := P / 16
	for r0 := 0; r0 < rows; r0 += maxTileRows {
		r := min(maxTileRows, rows-r0)
		ks.attnScores[r-1](&q[r0*ldq], ldq, &keys[0], groups, steps, &out[r0*ldo], ldo)
	}
}

// AttnSoftmaxBF16 runs one online-softmax step over a chunk of n keys (1 ≤
// n ≤ AttnChunk) for rows rows. For row r, with s = s[r·lds:][:n] its
// scores, m[r] and l[r] its running maximum and sum and a = acc[r·lda:][:hd]
// its unnormalised outputs:
//
//	mc = max s; if mc > m[r] { f = e^(m[r]−mc); l[r] ·= f; a[t] ·= f }; m[r] = max(m[r], mc)
//	w[r·ldw + j] = bf16(e^(s[j] − m[r])) for j < n, 0 for n ≤ j < AttnChunk
//	l[r] += Σ_j w[r·ldw + j], summed in a fixed order
//
// Start a row with m = −Inf, l = 0 and a = 0. It panics if a slice is too
// short.
func AttnSoftmaxBF16(s []float32, lds, rows, n int, m, l, acc []float32, lda, hd int, w []uint16, ldw int) {
	if rows <= 0 {
		return
	}
	if n < 1 || n > AttnChunk || hd < 1 || len(s) < (rows-1)*lds+n || len(m) < rows || len(l) < rows ||
		len(acc) < (rows-1)*lda+hd || len(w) < (rows-1)*ldw+AttnChunk || (rows > 1 && (lds < n || lda < hd || ldw < AttnChunk)) {
		panic(fmt.Sprintf("tensor: AttnSoftmaxBF16 with bad operands (rows=%d n=%d hd=%d; len s=%d m=%d l=%d acc=%d w=%d; lds=%d lda=%d ldw=%d)",
			rows, n, hd, len(s), len(m), len(l), len(acc), len(w), lds, lda, ldw))
	}
	active.Load().attnSoftmax(&s[0], lds, rows, n, &m[0], &l[0], &acc[0], lda, hd, &w[0], ldw)
}

// AttnPVBF16 adds to rows accumulator rows acc[r·lda:][:hd] the n value
// rows v[offs[j]:][:hd] (anywhere in v: the blocks of a paged pool)
// weighted by the bf16 weights w[r·ldw + j], over key pairs: for j = 0, 2,
// 4, ... < n in order, one VDPBF16PS lane per element,
//
//	acc[r·lda+t] += w[r·ldw+j]·v[offs[j]+t] + w[r·ldw+j+1]·v[offs[j+1]+t]
//
// With n odd the last pair's second value is zero and no row is read for
// it; its weight w[r·ldw+n] must be zero (AttnSoftmaxBF16 writes it so).
// Splitting the keys at even counts across calls does not change the
// result. It panics if a slice is too short or an offset out of range.
func AttnPVBF16(acc []float32, lda int, w []uint16, ldw, rows int, v []uint16, offs []int, n, hd int) {
	if rows <= 0 || n <= 0 || hd <= 0 {
		return
	}
	checkPV(acc, lda, w, ldw, rows, v, offs, n, hd)
	active.Load().attnPV(&acc[0], lda, &w[0], ldw, rows, &v[0], &offs[0], n, hd)
}

// checkPV panics where AttnPVBF16's operands are too short or an offset
// is out of range (rows, n and hd positive).
func checkPV(acc []float32, lda int, w []uint16, ldw, rows int, v []uint16, offs []int, n, hd int) {
	if len(acc) < (rows-1)*lda+hd || len(w) < (rows-1)*ldw+(n+1)/2*2 || len(offs) < n ||
		(rows > 1 && (lda < hd || ldw < n)) {
		panic(fmt.Sprintf("tensor: AttnPVBF16 with short operands (rows=%d n=%d hd=%d; len acc=%d w=%d offs=%d; lda=%d ldw=%d)",
			rows, n, hd, len(acc), len(w), len(offs), lda, ldw))
	}
	for _, o := range offs[:n] {
		if o < 0 || o > len(v)-hd {
			panic(fmt.Sprintf("tensor: AttnPVBF16 with value row offset %d for rows of %d in %d elements", o, hd, len(v)))
		}
	}
}
