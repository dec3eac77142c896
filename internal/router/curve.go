package router

// PrefillCurve is an engine's prefill seconds for a prompt of n computed
// tokens: A + B·n + C·n², every coefficient non-negative. The zero curve is
// unmeasured.
type PrefillCurve struct {
	A, B, C float64
}

// Seconds is the curve at n tokens.
func (c PrefillCurve) Seconds(n int) float64 {
	x := float64(n)
	return c.A + c.B*x + c.C*x*x
}

// Measured reports whether the curve prices anything.
func (c PrefillCurve) Measured() bool { return c.A > 0 || c.B > 0 || c.C > 0 }
