package main

import "testing"

// TestInt16Group checks the int16 sums of the AVX2 dot kernels: the most
// VPMADDUBSW results whose sum cannot overflow int16, for each level range.
func TestInt16Group(t *testing.T) {
	for _, c := range []struct{ maxLevel, steps, want int }{
		{15, 8, 8}, {31, 8, 4}, {63, 4, 2}, {127, 8, 1}, {15, 4, 4},
	} {
		g := int16Group(c.maxLevel, c.steps)
		if g != c.want {
			t.Errorf("int16Group(%d, %d) = %d, want %d", c.maxLevel, c.steps, g, c.want)
		}
		if g*2*127*c.maxLevel > 32767 && g > 1 {
			t.Errorf("int16Group(%d, %d) = %d overflows int16", c.maxLevel, c.steps, g)
		}
	}
}
