package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

var quantTypes = []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K}

func TestDTypeNamesAndBlockSizes(t *testing.T) {
	want := []struct {
		d            DType
		name         string
		elems, bytes int
		quant        bool
	}{
		{F32, "f32", 1, 4, false}, {BF16, "bf16", 1, 2, false}, {F16, "f16", 1, 2, false},
		{Q8_0, "q8_0", 32, 34, true}, {Q4_0, "q4_0", 32, 18, true}, {Q4_K, "q4_k", 256, 144, true},
		{Q6_K, "q6_k", 256, 210, true}, {Q5_K, "q5_k", 256, 176, true}, {Q5_0, "q5_0", 32, 22, true},
	}
	for _, w := range want {
		e, b := w.d.BlockSize()
		if w.d.String() != w.name || e != w.elems || b != w.bytes || w.d.Quantized() != w.quant {
			t.Errorf("%d: got %q %d/%d quantized=%v, want %q %d/%d %v", w.d, w.d, e, b, w.d.Quantized(), w.name, w.elems, w.bytes, w.quant)
		}
		if d, err := ParseDType(strings.ToUpper(w.name)); err != nil || d != w.d {
			t.Errorf("ParseDType(%q) = %v, %v", w.name, d, err)
		}
	}
	if DType(42).String() != "unknown" || DType(42).Quantized() {
		t.Error("DType(42) is known")
	}
	if _, err := ParseDType("q3_k"); err == nil {
		t.Error("ParseDType(q3_k) succeeded")
	}
	if rb, err := Q4_K.RowBytes(512); err != nil || rb != 288 {
		t.Errorf("Q4_K.RowBytes(512) = %d, %v", rb, err)
	}
	for _, bad := range []struct {
		d    DType
		cols int
	}{{Q4_K, 100}, {Q8_0, 48}, {Q6_K, -256}, {DType(42), 32}} {
		if _, err := bad.d.RowBytes(bad.cols); err == nil {
			t.Errorf("%s.RowBytes(%d) succeeded", bad.d, bad.cols)
		}
	}
}

// randBlocks returns n random blocks of dtype d: random level bits and
// finite f16 scales of either sign (the K-quants' d and dmin positive, as
// the quantizer makes them, and also negative ones).
func randBlocks(rng *rand.Rand, d DType, n int) []byte {
	_, bytes := d.BlockSize()
	buf := make([]byte, n*bytes)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	scale := func(off int, blk []byte) {
		v := float32(math.Ldexp(rng.Float64()+0.5, -rng.IntN(12)))
		if rng.IntN(4) == 0 {
			v = -v
		}
		binary.LittleEndian.PutUint16(blk[off:], F32ToF16(v))
	}
	for b := range n {
		blk := buf[b*bytes : (b+1)*bytes]
		switch d {
		case Q8_0, Q4_0, Q5_0:
			scale(0, blk)
		case Q4_K, Q5_K:
			scale(0, blk)
			scale(2, blk)
		case Q6_K:
			scale(208, blk)
		}
	}
	return buf
}

// blockValues64 decodes one block of d from its fields, independently of
// the package's decoder (straight from the layout documented on the DType
// constants), as float64: the weights and, per weight, the magnitude of the
// terms (for error bounds).
func blockValues64(d DType, blk []byte) (vals, mag []float64) {
	h := func(off int) float64 { return float64(F16ToF32(binary.LittleEndian.Uint16(blk[off:]))) }
	switch d {
	case Q8_0:
		for i := range 32 {
			v := float64(int8(blk[2+i])) * h(0)
			vals, mag = append(vals, v), append(mag, math.Abs(v))
		}
	case Q4_0:
		for i := range 32 {
			nib := blk[2+i%16] >> (4 * (i / 16)) & 15
			v := (float64(nib) - 8) * h(0)
			vals, mag = append(vals, v), append(mag, math.Abs(v))
		}
	case Q5_0:
		qh := uint32(blk[2]) | uint32(blk[3])<<8 | uint32(blk[4])<<16 | uint32(blk[5])<<24
		for i := range 32 {
			nib := blk[6+i%16] >> (4 * (i / 16)) & 15
			v := (float64(nib) + 16*float64(qh>>i&1) - 16) * h(0)
			vals, mag = append(vals, v), append(mag, math.Abs(v))
		}
	case Q4_K, Q5_K:
		// The 12 scale bytes as a table: bits of scale j and min j.
		s := blk[4:16]
		six := func(j int, mins bool) float64 {
			if j < 4 {
				if mins {
					return float64(s[j+4] & 63)
				}
				return float64(s[j] & 63)
			}
			lo := s[j+4] & 15
			hiSrc := s[j-4]
			if mins {
				lo, hiSrc = s[j+4]>>4, s[j]
			}
			return float64(lo) + 16*float64(hiSrc>>6)
		}
		qs := blk[16:144]
		if d == Q5_K {
			qs = blk[48:176]
		}
		for i := range 256 {
			j := i / 32
			c, l := i/64, i%32
			q := float64(qs[32*c+l] >> (4 * (j % 2)) & 15)
			if d == Q5_K {
				q += 16 * float64(blk[16+l]>>j&1)
			}
			a, b := h(0)*six(j, false)*q, h(2)*six(j, true)
			vals, mag = append(vals, a-b), append(mag, math.Abs(a)+math.Abs(b))
		}
	case Q6_K:
		for i := range 256 {
			half, l := i/128, i%128
			quarter, p := l/32, l%32
			lowByte := blk[64*half+32*(quarter%2)+p]
			low := lowByte >> (4 * (quarter / 2)) & 15
			high := blk[128+32*half+p] >> (2 * quarter) & 3
			q := float64(int(low)|int(high)<<4) - 32
			v := h(208) * float64(int8(blk[192+i/16])) * q
			vals, mag = append(vals, v), append(mag, math.Abs(v))
		}
	}
	return vals, mag
}

func TestDequantizeRowMatchesBlockFields(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range quantTypes {
		elems, _ := d.BlockSize()
		const nb = 40
		src := randBlocks(rng, d, nb)
		dst := make([]float32, nb*elems)
		DequantizeRow(d, src, dst)
		_, bytes := d.BlockSize()
		for b := range nb {
			vals, mag := blockValues64(d, src[b*bytes:(b+1)*bytes])
			for i, want := range vals {
				got := float64(dst[b*elems+i])
				// float32 rounding of at most three operations.
				if math.Abs(got-want) > 3*0x1p-24*mag[i] {
					t.Fatalf("%s block %d weight %d = %g, want %g", d, b, i, got, want)
				}
			}
		}
		// Mat.Row dequantizes the same way.
		w := &Mat{DType: d, Rows: nb / 8, Cols: 8 * elems, Q: src}
		row := w.Row(2, make([]float32, w.Cols))
		for i, v := range row {
			if math.Float32bits(v) != math.Float32bits(dst[2*w.Cols+i]) {
				t.Fatalf("%s Row(2)[%d] = %g, DequantizeRow gave %g", d, i, v, dst[2*w.Cols+i])
			}
		}
	}
}

func TestDequantizeRowPanicsOnBadLengths(t *testing.T) {
	for _, c := range []struct {
		name string
		d    DType
		src  []byte
		dst  []float32
	}{
		{"not a block multiple", Q8_0, make([]byte, 68), make([]float32, 48)},
		{"short source", Q4_K, make([]byte, 143), make([]float32, 256)},
		{"not quantized", BF16, make([]byte, 64), make([]float32, 32)},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("DequantizeRow did not panic")
				}
			}()
			DequantizeRow(c.d, c.src, c.dst)
		})
	}
}

// roundTrip quantizes x (rows×cols) to d and dequantizes it.
func roundTrip(t *testing.T, d DType, x []float32, rows, cols int) []float32 {
	t.Helper()
	q, err := QuantizeRows(d, x, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := d.RowBytes(cols)
	if len(q) != rows*rb {
		t.Fatalf("%s: %d bytes for %d rows of %d", d, len(q), rows, rb)
	}
	y := make([]float32, rows*cols)
	for r := range rows {
		DequantizeRow(d, q[r*rb:(r+1)*rb], y[r*cols:(r+1)*cols])
	}
	return y
}

func TestQuantizeRowsRoundTripError(t *testing.T) {
	// llama.cpp's test-quantize-fns: data 0.1 + 2·cos(i + offset) over
	// 32·128 values, error sqrt(Σ diff²)/n, bound 0.002 for every type of
	// 4 bits or more.
	const n = 32 * 128
	synth := make([]float32, n)
	for i := range synth {
		synth[i] = float32(0.1 + 2*math.Cos(float64(i)+0.1))
	}
	// Our own, tighter: Gaussian rows (σ varied per row), RMS error
	// relative to each row's RMS; bounds about 1.2× what these quantizers
	// reach (measured: q8_0 0.54%, q6_K 1.8%, q5_K 3.6%, q4_K 7.1%, q4_0
	// 8.6%, q5_0 4.3%, in line with the step sizes: q8_0's max/127 per 32, q4_0's
	// max/8, the K-quants' range/15 or /31 per 32 and max/32 per 16).
	relBound := map[DType]float64{Q8_0: 0.0065, Q6_K: 0.022, Q5_K: 0.044, Q4_K: 0.085, Q4_0: 0.104, Q5_0: 0.052}
	rng := rand.New(rand.NewPCG(5, 5))
	const rows, cols = 64, 1024
	gauss := make([]float32, rows*cols)
	for r := range rows {
		sigma := math.Ldexp(1, rng.IntN(16)-10)
		for c := range cols {
			gauss[r*cols+c] = float32(rng.NormFloat64() * sigma)
		}
	}
	for _, d := range quantTypes {
		y := roundTrip(t, d, synth, 1, n)
		var s float64
		for i := range synth {
			s += sq(float64(y[i] - synth[i]))
		}
		if e := math.Sqrt(s) / n; e > 0.002 {
			t.Errorf("%s: llama.cpp's total error %.5f > 0.002", d, e)
		}
		y = roundTrip(t, d, gauss, rows, cols)
		var num, den float64
		for r := range rows {
			var rn, rd float64
			for c := range cols {
				i := r*cols + c
				rn += sq(float64(y[i] - gauss[i]))
				rd += sq(float64(gauss[i]))
			}
			num += rn / rd // each row counts the same whatever its σ
			den++
		}
		rel := math.Sqrt(num / den)
		t.Logf("%s: relative RMS error %.4f", d, rel)
		if rel > relBound[d] {
			t.Errorf("%s: relative RMS error %.4f > %.4f", d, rel, relBound[d])
		}
	}
}

func sq(v float64) float64 { return v * v }

func TestQuantizeRowsEdgeCases(t *testing.T) {
	for _, d := range quantTypes {
		elems, _ := d.BlockSize()
		cols := 2 * max(elems, 256)
		zeros := make([]float32, cols)
		for i, v := range roundTrip(t, d, zeros, 1, cols) {
			if v != 0 {
				t.Fatalf("%s: zeros came back with %g at %d", d, v, i)
			}
		}
		// Constant, positive and negative, and one outlier per block: the
		// outlier (largest magnitude) must come back within 1% for the
		// types that scale by the largest magnitude.
		for _, c := range []float32{0.75, -3} {
			x := make([]float32, cols)
			for i := range x {
				x[i] = c
			}
			y := roundTrip(t, d, x, 1, cols)
			for i, v := range y {
				if math.Abs(float64(v-c)) > 0.07*math.Abs(float64(c)) {
					t.Fatalf("%s: constant %g came back as %g at %d", d, c, v, i)
				}
			}
		}
		x := make([]float32, cols)
		rng := rand.New(rand.NewPCG(9, uint64(d)))
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 1e-3)
			if i%elems == 7 {
				x[i] = 0.5
			}
		}
		y := roundTrip(t, d, x, 1, cols)
		for i := 7; i < cols; i += elems {
			if math.Abs(float64(y[i]-x[i])) > 0.01*0.5 {
				t.Fatalf("%s: outlier 0.5 at %d came back as %g", d, i, y[i])
			}
		}
	}
	// Q8_0 levels are round(x·127/max|x|) (half away from zero), the
	// scale max|x|/127 in f16.
	x := make([]float32, 32)
	for i := range x {
		x[i] = float32(i) - 12.5
	}
	q, err := QuantizeRows(Q8_0, x, 1, 32)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := binary.LittleEndian.Uint16(q), F32ToF16(18.5/127); got != want {
		t.Fatalf("q8_0 scale %#x, want %#x", got, want)
	}
	for i, v := range x {
		if got, want := int8(q[2+i]), int8(math.Round(float64(v*(127/18.5)))); got != want && math.Abs(float64(got-want)) > 0 {
			t.Fatalf("q8_0 level %d = %d, want %d", i, got, want)
		}
	}
}

func TestQuantizeRowsRejectsBadShapes(t *testing.T) {
	for _, c := range []struct {
		name       string
		d          DType
		n          int
		rows, cols int
	}{
		{"cols not a block multiple", Q8_0, 48, 1, 48},
		{"cols not a super-block multiple", Q4_K, 512, 4, 128},
		{"short source", Q6_K, 255, 1, 256},
		{"negative rows", Q4_0, 32, -1, 32},
		{"not quantized", BF16, 32, 1, 32},
		{"unknown", DType(42), 32, 1, 32},
	} {
		if _, err := QuantizeRows(c.d, make([]float32, c.n), c.rows, c.cols); err == nil {
			t.Errorf("%s: QuantizeRows succeeded", c.name)
		}
	}
}

func ExampleQuantizeRows() {
	x := make([]float32, 2*256)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	q, _ := QuantizeRows(Q4_K, x, 2, 256)
	w := &Mat{DType: Q4_K, Rows: 2, Cols: 256, Q: q}
	row := w.Row(1, make([]float32, 256))
	fmt.Println(len(q), math.Abs(float64(row[3]-x[259])) < 0.05)
	// Output: 288 true
}
