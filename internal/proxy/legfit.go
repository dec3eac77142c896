package proxy

import "math"

// prefillCurve is an engine's prefill seconds for a prompt of n computed
// tokens: A + B·n + C·n², every coefficient non-negative. The zero curve is
// unmeasured.
type prefillCurve struct {
	A, B, C float64
}

// seconds is the curve at n tokens.
func (c prefillCurve) seconds(n float64) float64 { return c.A + c.B*n + c.C*n*n }

// measured reports whether the curve prices anything.
func (c prefillCurve) measured() bool { return c.A > 0 || c.B > 0 || c.C > 0 }

// curveScale is the token unit of the fit: n/curveScale keeps the normal
// equations' entries near one for prompts of hundreds to thousands of tokens.
const curveScale = 1024

// fitCurve fits seconds = A + B·n + C·n² to the points (n[i], s[i]) by least
// squares with every coefficient non-negative. With three unknowns the
// non-negative solution is the best of the unconstrained solutions on the
// seven subsets of {A, B, C} whose coefficients are all non-negative (the
// optimum of a non-negative least squares problem is the unconstrained
// optimum on its support). ok is false when no subset has a solution (no
// points, or every n zero and every s zero).
func fitCurve(n, s []float64) (c prefillCurve, ok bool) {
	if len(n) == 0 || len(n) != len(s) {
		return prefillCurve{}, false
	}
	best := 0.0
	for mask := 1; mask < 8; mask++ {
		coef, fine := solveSubset(n, s, mask)
		if !fine {
			continue
		}
		if r := residual(n, s, coef); !ok || r < best*(1-1e-12) {
			best, c, ok = r, coef, true
		}
	}
	return c, ok
}

// solveSubset solves the unconstrained least squares problem on the terms
// of mask (bit 0: A, bit 1: B, bit 2: C) in scaled tokens, and reports
// whether its solution exists and is non-negative.
func solveSubset(n, s []float64, mask int) (prefillCurve, bool) {
	var idx []int
	for k := range 3 {
		if mask&(1<<k) != 0 {
			idx = append(idx, k)
		}
	}
	m := len(idx)
	// Normal equations: (XᵀX) β = Xᵀy over the chosen columns 1, x, x².
	var ata [3][3]float64
	var aty [3]float64
	for i := range n {
		x := n[i] / curveScale
		cols := [3]float64{1, x, x * x}
		for r := range m {
			aty[r] += cols[idx[r]] * s[i]
			for q := range m {
				ata[r][q] += cols[idx[r]] * cols[idx[q]]
			}
		}
	}
	beta, ok := solve(ata, aty, m)
	if !ok {
		return prefillCurve{}, false
	}
	var full [3]float64
	for r := range m {
		if beta[r] < 0 || math.IsNaN(beta[r]) {
			return prefillCurve{}, false
		}
		full[idx[r]] = beta[r]
	}
	return prefillCurve{A: full[0], B: full[1] / curveScale, C: full[2] / (curveScale * curveScale)}, true
}

// solve solves the m×m system a·x = b by Gaussian elimination with partial
// pivoting; ok is false when a is singular (or nearly: a pivot below 1e-12
// of the largest diagonal entry).
func solve(a [3][3]float64, b [3]float64, m int) (x [3]float64, ok bool) {
	scale := 0.0
	for i := range m {
		scale = max(scale, math.Abs(a[i][i]))
	}
	if scale == 0 {
		return x, false
	}
	for col := range m {
		p := col
		for r := col + 1; r < m; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if math.Abs(a[p][col]) <= 1e-12*scale {
			return x, false
		}
		a[col], a[p] = a[p], a[col]
		b[col], b[p] = b[p], b[col]
		for r := col + 1; r < m; r++ {
			f := a[r][col] / a[col][col]
			for q := col; q < m; q++ {
				a[r][q] -= f * a[col][q]
			}
			b[r] -= f * b[col]
		}
	}
	for r := m - 1; r >= 0; r-- {
		v := b[r]
		for q := r + 1; q < m; q++ {
			v -= a[r][q] * x[q]
		}
		x[r] = v / a[r][r]
	}
	return x, true
}

// residual is the sum of squared errors of c on the points.
func residual(n, s []float64, c prefillCurve) float64 {
	r := 0.0
	for i := range n {
		d := c.seconds(n[i]) - s[i]
		r += d * d
	}
	return r
}
