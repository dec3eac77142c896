package tensor

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Dot returns Σ a[i]·b[i] over len(a). b must be at least as long as a. The
// reduction order is fixed for a given ISA and length.
func Dot(a, b []float32) float32 {
	if len(b) < len(a) {
		panic(fmt.Sprintf("tensor: Dot with len(b)=%d < len(a)=%d", len(b), len(a)))
	}
	if len(a) == 0 {
		return 0
	}
	return active.Load().dot(&a[0], &b[0], len(a))
}

// Axpy computes y[i] += a·x[i] for i < len(x). y must be at least as long
// as x.
func Axpy(a float32, x, y []float32) {
	if len(y) < len(x) {
		panic(fmt.Sprintf("tensor: Axpy with len(y)=%d < len(x)=%d", len(y), len(x)))
	}
	if len(x) == 0 {
		return
	}
	active.Load().axpy(a, &x[0], &y[0], len(x))
}

// AxpyRows adds the rows of v weighted by alpha to y: for r <
// len(alpha) in order, y[t] += alpha[r]·v[r*ldv+t] for t < len(y). The
// result is bit-identical to calling Axpy(alpha[r], v[r*ldv:][:len(y)], y)
// for each r in turn; it is just faster for short rows (attention's value
// sum). It panics if v is too short.
func AxpyRows(y, alpha, v []float32, ldv int) {
	if len(alpha) == 0 || len(y) == 0 {
		return
	}
	if need := (len(alpha)-1)*ldv + len(y); (len(alpha) > 1 && ldv < len(y)) || len(v) < need {
		panic(fmt.Sprintf("tensor: AxpyRows with len(v)=%d, ldv=%d for %d rows of %d", len(v), ldv, len(alpha), len(y)))
	}
	ks := active.Load()
	if ks.axpyRows != nil {
		ks.axpyRows(&alpha[0], &v[0], ldv, len(alpha), &y[0], len(y))
		return
	}
	for r, a := range alpha {
		ks.axpy(a, &v[r*ldv], &y[0], len(y))
	}
}

// DotRows computes out[j] = Σ_t x[t]·w[j*ldw+t] for j < len(out), t <
// len(x): the product of one f32 row with len(out) f32 weight rows spaced
// ldw apart, as MatMul would compute it for an F32 Mat holding those rows
// (bit-identical, whatever MatMul's m). It runs on the calling goroutine.
// It panics if w is too short or ldw < len(x).
func DotRows(out, x, w []float32, ldw int) {
	k, n := len(x), len(out)
	if n == 0 {
		return
	}
	if k == 0 {
		clear(out)
		return
	}
	if ldw < k || len(w) < (n-1)*ldw+k {
		panic(fmt.Sprintf("tensor: DotRows with len(w)=%d, ldw=%d for %d rows of %d", len(w), ldw, n, k))
	}
	active.Load().f32[0](&x[0], k, &w[0], ldw, k, n, &out[0], n, 0)
}

// RMSNorm writes x/rms(x)·w into out for one row: out[i] = x[i]·w[i] /
// sqrt(mean(x²)+eps). w and out must be at least as long as x; out may be x.
func RMSNorm(out, x, w []float32, eps float32) {
	if len(w) < len(x) || len(out) < len(x) {
		panic(fmt.Sprintf("tensor: RMSNorm with len(x)=%d, len(w)=%d, len(out)=%d", len(x), len(w), len(out)))
	}
	if len(x) == 0 {
		return
	}
	ss := Dot(x, x)
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
	w, out = w[:len(x)], out[:len(x)]
	for i, v := range x {
		out[i] = float32(v*inv) * w[i]
	}
}

// SiLUMul computes gate[i] = silu(gate[i])·up[i] = gate[i]/(1+e^-gate[i])·up[i]
// for i < len(gate). up must be at least as long as gate. Each element's
// result depends only on its inputs, not on its position or len(gate).
func SiLUMul(gate, up []float32) {
	if len(up) < len(gate) {
		panic(fmt.Sprintf("tensor: SiLUMul with len(up)=%d < len(gate)=%d", len(up), len(gate)))
	}
	if len(gate) == 0 {
		return
	}
	active.Load().silu(&gate[0], &up[0], len(gate))
}

// Softmax normalises x in place: x[i] = e^(x[i]-max) / Σ e^(x[j]-max). The
// exponentials and their sum are computed in a fixed order for a given ISA
// and length, so the result depends only on x.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	inv := 1 / active.Load().expSum(&x[0], len(x), mx)
	for i := range x {
		x[i] *= inv
	}
}

// ExpSum replaces x[i] by e^(x[i]-mx) for i < len(x) and returns the sum of
// the results, with the active ISA's vector exponential (relative error a
// few ulp). The sum is accumulated in a fixed order for a given ISA and
// length.
func ExpSum(x []float32, mx float32) float32 {
	if len(x) == 0 {
		return 0
	}
	return active.Load().expSum(&x[0], len(x), mx)
}

// AxpyRowsBF16 is AxpyRows over bf16 value rows: for r < len(alpha) in
// order, y[t] += alpha[r]·v[r*ldv+t] for t < len(y), each v widened exactly
// to f32 — bit-identical to AxpyRows over the widened rows.
func AxpyRowsBF16(y, alpha []float32, v []uint16, ldv int) {
	if len(alpha) == 0 || len(y) == 0 {
		return
	}
	if need := (len(alpha)-1)*ldv + len(y); (len(alpha) > 1 && ldv < len(y)) || len(v) < need {
		panic(fmt.Sprintf("tensor: AxpyRowsBF16 with len(v)=%d, ldv=%d for %d rows of %d", len(v), ldv, len(alpha), len(y)))
	}
	ks := active.Load()
	if ks.axpyRowsBF16 != nil {
		ks.axpyRowsBF16(&alpha[0], &v[0], ldv, len(alpha), &y[0], len(y))
		return
	}
	buf := rowScratch.Get().(*[]float32)
	defer rowScratch.Put(buf)
	if cap(*buf) < len(y) {
		*buf = make([]float32, len(y))
	}
	row := (*buf)[:len(y)]
	for r, a := range alpha {
		for t, b := range v[r*ldv : r*ldv+len(y)] {
			row[t] = BF16ToF32(b)
		}
		ks.axpy(a, &row[0], &y[0], len(y))
	}
}

// rowScratch holds the widened rows of AxpyRowsBF16's fallback path.
var rowScratch = sync.Pool{New: func() any { return new([]float32) }}

// BF16Query is rows query vectors of length k prepared for DotRowsBF16:
// rounded to bf16 once when MatMul rounds activations (BF16Activations),
// kept f32 otherwise. The zero value is ready for Set; reuse it to avoid
// allocations.
type BF16Query struct {
	x       []float32
	xb      []uint16
	rows, k int
	rounded bool
}

// Set prepares the rows×k row-major queries in x (which must stay
// unchanged while the query is used).
func (q *BF16Query) Set(x []float32, rows, k int) {
	if rows < 0 || k < 0 || len(x) < rows*k {
		panic(fmt.Sprintf("tensor: BF16Query.Set with %d elements for %d rows of %d", len(x), rows, k))
	}
	q.x, q.rows, q.k = x[:rows*k], rows, k
	ks := active.Load()
	q.rounded = ks.toBF16 != nil
	if !q.rounded || rows*k == 0 {
		return
	}
	if cap(q.xb) < rows*k {
		q.xb = make([]uint16, rows*k)
	}
	q.xb = q.xb[:rows*k]
	ks.toBF16(&x[0], &q.xb[0], rows*k)
}

// Rows returns the query rows [r0, r0+rows) of q as a query of their own
// (sharing q's memory).
func (q *BF16Query) Rows(r0, rows int) BF16Query {
	if r0 < 0 || rows < 0 || r0+rows > q.rows {
		panic(fmt.Sprintf("tensor: BF16Query.Rows(%d, %d) of %d rows", r0, rows, q.rows))
	}
	sub := BF16Query{x: q.x[r0*q.k : (r0+rows)*q.k], rows: rows, k: q.k, rounded: q.rounded}
	if q.rounded {
		sub.xb = q.xb[r0*q.k : (r0+rows)*q.k]
	}
	return sub
}

// DotRowsBF16 computes out[r*ldo+j] = Σ_t x_r[t]·w[j*ldw+t] for the query
// rows x_r prepared in q, j < n and t < k, over bf16 weight rows spaced ldw
// apart: exactly what MatMul computes for a BF16 Mat holding those rows
// (bit-identical whatever MatMul's m, including the rounding of x to bf16
// when BF16Activations). It runs on the calling goroutine and panics if a
// slice is too short or ldw < k.
func DotRowsBF16(out []float32, ldo int, q *BF16Query, w []uint16, ldw, n int) {
	rows, k := q.rows, q.k
	if n == 0 || rows == 0 {
		return
	}
	if len(out) < (rows-1)*ldo+n || (rows > 1 && ldo < n) {
		panic(fmt.Sprintf("tensor: DotRowsBF16 with len(out)=%d, ldo=%d for %d rows of %d", len(out), ldo, rows, n))
	}
	if k == 0 {
		for r := range rows {
			clear(out[r*ldo : r*ldo+n])
		}
		return
	}
	if ldw < k || len(w) < (n-1)*ldw+k {
		panic(fmt.Sprintf("tensor: DotRowsBF16 with len(w)=%d, ldw=%d for %d rows of %d", len(w), ldw, n, k))
	}
	ks := active.Load()
	if q.rounded != (ks.toBF16 != nil) {
		panic("tensor: DotRowsBF16 with a query prepared under another ISA")
	}
	pf := uintptr(unsafe.Pointer(&w[0])) // nothing else to warm: re-touch the rows
	for r0 := 0; r0 < rows; r0 += maxTileRows {
		r := min(maxTileRows, rows-r0)
		if q.rounded {
			ks.bf16x[r-1](&q.xb[r0*k], k, &w[0], ldw, k, n, &out[r0*ldo], ldo, pf)
		} else {
			ks.bf16[r-1](&q.x[r0*k], k, &w[0], ldw, k, n, &out[r0*ldo], ldo, pf)
		}
	}
}

// AxpyRowsBF16Group is AxpyRowsBF16 for g outputs that share the value
// rows (the query heads of one GQA group): for h < g, y[h*ldy:][:n] gets
// the rows of v weighted by alpha[h*lda:][:rows], bit-identical to g calls
// of AxpyRowsBF16 but loading each value row once. It panics if a slice is
// too short.
func AxpyRowsBF16Group(g, n int, y []float32, ldy int, alpha []float32, lda, rows int, v []uint16, ldv int) {
	if g <= 0 || n <= 0 || rows <= 0 {
		return
	}
	if len(y) < (g-1)*ldy+n || len(alpha) < (g-1)*lda+rows || (g > 1 && (ldy < n || lda < rows)) ||
		len(v) < (rows-1)*ldv+n || (rows > 1 && ldv < n) {
		panic(fmt.Sprintf("tensor: AxpyRowsBF16Group with short operands (g=%d n=%d rows=%d; len y=%d alpha=%d v=%d; ldy=%d lda=%d ldv=%d)",
			g, n, rows, len(y), len(alpha), len(v), ldy, lda, ldv))
	}
	ks := active.Load()
	for h0 := 0; h0 < g; h0 += maxTileRows {
		gg := min(maxTileRows, g-h0)
		if gg > 1 && ks.axpyRowsBF16G[gg-2] != nil {
			ks.axpyRowsBF16G[gg-2](&alpha[h0*lda], lda, &v[0], ldv, rows, &y[h0*ldy], ldy, n)
			continue
		}
		for h := h0; h < h0+gg; h++ {
			AxpyRowsBF16(y[h*ldy:h*ldy+n], alpha[h*lda:h*lda+rows], v, ldv)
		}
	}
}

// AxpyRowsGroup is AxpyRows for g outputs that share the value rows (the
// query heads of one GQA group over an f32 KV cache): for h < g,
// y[h*ldy:][:n] gets the rows of v weighted by alpha[h*lda:][:rows],
// bit-identical to g calls of AxpyRows but loading each value row once. It
// panics if a slice is too short.
func AxpyRowsGroup(g, n int, y []float32, ldy int, alpha []float32, lda, rows int, v []float32, ldv int) {
	if g <= 0 || n <= 0 || rows <= 0 {
		return
	}
	if len(y) < (g-1)*ldy+n || len(alpha) < (g-1)*lda+rows || (g > 1 && (ldy < n || lda < rows)) ||
		len(v) < (rows-1)*ldv+n || (rows > 1 && ldv < n) {
		panic(fmt.Sprintf("tensor: AxpyRowsGroup with short operands (g=%d n=%d rows=%d; len y=%d alpha=%d v=%d; ldy=%d lda=%d ldv=%d)",
			g, n, rows, len(y), len(alpha), len(v), ldy, lda, ldv))
	}
	ks := active.Load()
	for h0 := 0; h0 < g; h0 += maxTileRows {
		gg := min(maxTileRows, g-h0)
		if gg > 1 && ks.axpyRowsG[gg-2] != nil {
			ks.axpyRowsG[gg-2](&alpha[h0*lda], lda, &v[0], ldv, rows, &y[h0*ldy], ldy, n)
			continue
		}
		for h := h0; h < h0+gg; h++ {
			AxpyRows(y[h*ldy:h*ldy+n], alpha[h*lda:h*lda+rows], v, ldv)
		}
	}
}

// StoreBF16 is ToBF16 for a destination that will not be read again soon
// (a KV cache row): where the CPU allows, whole aligned groups are written
// with non-temporal stores, which skip the read for ownership of cold lines
// and leave the cache to the data in use. The values written are the same.
func StoreBF16(dst []uint16, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("tensor: StoreBF16 with len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	ks := active.Load()
	if ks.toBF16Stream != nil && len(src) > 0 && len(src)%16 == 0 && uintptr(unsafe.Pointer(&dst[0]))%32 == 0 {
		ks.toBF16Stream(&src[0], &dst[0], len(src))
		return
	}
	ToBF16(dst, src)
}

// ToBF16 rounds src to bf16 (nearest even, as F32ToBF16) into dst, which
// must be at least as long as src.
func ToBF16(dst []uint16, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("tensor: ToBF16 with len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	if len(src) == 0 {
		return
	}
	if ks := active.Load(); ks.toBF16 != nil {
		ks.toBF16(&src[0], &dst[0], len(src))
		return
	}
	for i, v := range src {
		dst[i] = F32ToBF16(v)
	}
}
