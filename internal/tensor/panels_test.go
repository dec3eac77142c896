package tensor

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// A Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K matrix stored as panels gives MatMul's bits and Row's
// values of the same matrix in ggml's rows, for one and several activation
// rows and threads, and its rows read back byte for byte.
func TestPanelsAreTheSameMatrix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		dt   DType
		n, k int
	}{{Q8_0, 64, 2048}, {Q8_0, 48, 256}, {Q8_0, 16, 8192}, {Q4_K, 64, 2048}, {Q4_K, 48, 256}, {Q4_K, 16, 8192},
		{Q4_0, 64, 2048}, {Q4_0, 48, 64}, {Q4_0, 16, 8192}, {Q5_K, 64, 2048}, {Q5_K, 48, 256}, {Q5_K, 16, 8192},
		{Q5_0, 64, 2048}, {Q5_0, 48, 64}, {Q5_0, 16, 8192}, {Q6_K, 64, 2048}, {Q6_K, 48, 256}, {Q6_K, 16, 8192}} {
		n, k := c.n, c.k
		src := make([]float32, n*k)
		for i := range src {
			src[i] = rng.Float32()*0.2 - 0.1
		}
		q, err := QuantizeRows(c.dt, src, n, k)
		if err != nil {
			t.Fatal(err)
		}
		m := &Mat{DType: c.dt, Rows: n, Cols: k, Q: q}
		size := PanelBytes(m)
		if !panelKernels() {
			if size != 0 {
				t.Fatalf("PanelBytes %d where no kernel reads panels", size)
			}
			t.Skip("this CPU has no AVX512-VNNI kernels to read panels")
		}
		pm, err := PackPanels(m, make([]byte, size))
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := c.dt.RowBytes(k)
		for r := range n {
			if got := panelRow(pm, r, make([]byte, rb)); !bytes.Equal(got, q[r*rb:(r+1)*rb]) {
				t.Fatalf("%s %d×%d: row %d read back from the panels differs", c.dt, n, k, r)
			}
			if a, b := m.Row(r, make([]float32, k)), pm.Row(r, make([]float32, k)); !slices.Equal(a, b) {
				t.Fatalf("%s %d×%d: Row(%d) differs", c.dt, n, k, r)
			}
		}
		for _, threads := range []int{1, 2} {
			p := NewPool(threads)
			// 17 and 33 rows take the widened panels of the formats
			// that have them (above 16 and 32 rows).
			for _, rows := range []int{1, 2, 3, 7, 9, 17, 33} {
				x := make([]float32, rows*k)
				for i := range x {
					x[i] = rng.Float32()*2 - 1
				}
				want, got := make([]float32, rows*n), make([]float32, rows*n)
				p.MatMul(want, x, rows, m)
				p.MatMul(got, x, rows, pm)
				if !slices.Equal(want, got) {
					t.Errorf("%s %d×%d, %d activation rows, %d threads: the panels' product differs", c.dt, n, k, rows, threads)
				}
			}
			p.Close()
		}
	}
	odd := &Mat{DType: Q8_0, Rows: 24, Cols: 256, Q: make([]byte, 24*8*34)}
	if PanelBytes(odd) != 0 {
		t.Error("24 rows (not a multiple of 16) reported packable")
	}
	if _, err := PackPanels(&Mat{DType: F16, Rows: 16, Cols: 256, U16: make([]uint16, 16*256)}, make([]byte, 1<<20)); err == nil {
		t.Error("an f16 matrix packed as panels")
	}
}

// panelRow writes row r of a panel-stored m in ggml's layout into dst
// (its row bytes) and returns it: the panel layout of panels.go, read back.
func panelRow(m *Mat, r int, dst []byte) []byte {
	elems, bytes := m.DType.BlockSize()
	for b := range m.Cols / elems {
		panelBlockReaders[m.DType](m, r, b, dst[bytes*b:bytes*(b+1)])
	}
	return dst
}
