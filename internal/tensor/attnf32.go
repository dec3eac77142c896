package tensor

import "fmt"

// Attention scores from keys packed transposed in f32, for prefill on the
// ISAs whose activations stay f32 (avx2). A key group is 8 keys: for each
// element t of the head dimension one 8-lane vector holds element t of the
// group's keys, so one FMA gives a partial sum for 8 scores and no score
// needs a horizontal reduction. The kernels nevertheless reproduce
// DotRowsBF16 (over a bf16 pool) and DotRows (over an f32 pool) bit for bit
// on the same ISA — the same FMAs per lane in the same order, the same
// reduction tree across lanes (see asmgen's attnavx2.go) — so a prefill
// scoring packed keys and a decode scoring the pool agree exactly.

// attnF32Rows is the largest number of query rows one packed-key scores
// kernel handles.
const attnF32Rows = 3

// AttnPackedF32 reports whether the active ISA has AttnScoresF32 (the avx2
// set; it is not there when activations are rounded to bf16, see
// AttnBF16).
func AttnPackedF32() bool { return active.Load().attnScoresF32[0] != nil }

// PackedKeysF32Len is the length of an f32 packed-key buffer holding n keys
// of head dimension hd: whole pairs of groups (16 keys), hd·16 elements
// each.
func PackedKeysF32Len(n, hd int) int { return (n + 15) / 16 * 16 * hd }

// PackKeysF32FromBF16 writes n bf16 keys of hd elements, rows ldk apart in
// k, widened exactly to f32, as keys j0..j0+n-1 of the packed buffer dst:
// element t of key j goes to dst[(j/8)·8·hd + 8t + j%8]. With k nil the
// keys are zero (the padding of the last pair of groups).
func PackKeysF32FromBF16(dst []float32, j0 int, k []uint16, ldk, n, hd int) {
	if !packArgsOK(len(dst), j0, k == nil, len(k), ldk, n, hd) {
		panic(fmt.Sprintf("tensor: PackKeysF32FromBF16 of %d keys from %d (hd %d) with len(dst)=%d, len(k)=%d, ldk=%d", n, j0, hd, len(dst), len(k), ldk))
	}
	for i := range n {
		j := j0 + i
		col := dst[(j/8)*8*hd+j%8:]
		if k == nil {
			for t := range hd {
				col[8*t] = 0
			}
			continue
		}
		for t, b := range k[i*ldk : i*ldk+hd] {
			col[8*t] = BF16ToF32(b)
		}
	}
}

// PackKeysF32 is PackKeysF32FromBF16 for f32 keys.
func PackKeysF32(dst []float32, j0 int, k []float32, ldk, n, hd int) {
	if !packArgsOK(len(dst), j0, k == nil, len(k), ldk, n, hd) {
		panic(fmt.Sprintf("tensor: PackKeysF32 of %d keys from %d (hd %d) with len(dst)=%d, len(k)=%d, ldk=%d", n, j0, hd, len(dst), len(k), ldk))
	}
	for i := range n {
		j := j0 + i
		col := dst[(j/8)*8*hd+j%8:]
		if k == nil {
			for t := range hd {
				col[8*t] = 0
			}
			continue
		}
		for t, v := range k[i*ldk : i*ldk+hd] {
			col[8*t] = v
		}
	}
}

// packArgsOK reports whether a packing call's operands are in range.
func packArgsOK(lenDst, j0 int, zero bool, lenK, ldk, n, hd int) bool {
	if n <= 0 {
		return n == 0
	}
	if j0 < 0 || hd < 1 || lenDst < PackedKeysF32Len(j0+n, hd) {
		return false
	}
	return zero || (lenK >= (n-1)*ldk+hd && (n == 1 || ldk >= hd))
}

// AttnScoresF32 computes out[r·ldo + j] = q_r · key_j for rows query rows
// (q_r = q[r·ldq:][:hd], f32) and the keys of pairs pairs of packed groups
// (j < 16·pairs, see PackKeysF32FromBF16). Every score is bit-identical to
// what DotRowsBF16 (for keys packed from bf16) or DotRows (from f32)
// computes for the same query and key rows under the active ISA. It panics
// if a slice is too short or the ISA has no such kernel (AttnPackedF32).
func AttnScoresF32(out []float32, ldo int, q []float32, ldq, rows int, keys []float32, pairs, hd int) {
	if rows <= 0 || pairs <= 0 {
		return
	}
	if hd < 1 || len(q) < (rows-1)*ldq+hd || (rows > 1 && ldq < hd) || len(keys) < pairs*16*hd ||
		len(out) < (rows-1)*ldo+16*pairs || (rows > 1 && ldo < 16*pairs) {
		panic(fmt.Sprintf("tensor: AttnScoresF32 with short operands (rows=%d pairs=%d hd=%d; len q=%d keys=%d out=%d; ldq=%d ldo=%d)",
			rows, pairs, hd, len(q), len(keys), len(out), ldq, ldo))
	}
	ks := active.Load()
	if ks.attnScoresF32[0] == nil {
		panic(fmt.Sprintf("tensor: AttnScoresF32 under ISA %q, which has no packed-key scores kernel (check AttnPackedF32)", ks.name))
	}
	for r0 := 0; r0 < rows; r0 += attnF32Rows {
		r := min(attnF32Rows, rows-r0)
		ks.attnScoresF32[r-1](&q[r0*ldq], ldq, &keys[0], pairs, hd, &out[r0*ldo], ldo)
	}
}
