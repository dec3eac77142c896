package router

// Curve is seconds by tokens, A + B·n + C·n² with every coefficient
// non-negative, fitted to an engine's measured legs (its prefill seconds
// for a prompt of n computed tokens, its KV pull seconds for n pulled
// tokens). The zero curve is unmeasured.
type Curve struct {
	A, B, C float64
}

// Seconds is the curve at n tokens.
func (c Curve) Seconds(n int) float64 {
	x := float64(n)
	return c.A + c.B*x + c.C*x*x
}

// Measured reports whether the curve prices anything.
func (c Curve) Measured() bool { return c.A > 0 || c.B > 0 || c.C > 0 }
