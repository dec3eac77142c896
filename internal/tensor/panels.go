package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Q8_0 weights stored as panels. Decode streams every weight once a token;
// the one-row kernels (rowquant.go) read ggml's rows at ~75% of the read
// limit on a Zen 4, while the AVX-512 dot kernel for one activation row
// reads the pack kernel's panels at 90–93% of it (docs/performance-log.md,
// 2026-12-06 09:00). A model can therefore keep its Q8_0 matrices as
// panels, packed once at load: decode and prefill then read them without
// packing, with the same bits.
//
// A panel block (panelQ8Block bytes) holds one 32-weight block of 16 rows:
// 8 vectors of 64 bytes, vector i holding levels 4i..4i+3 of each row r at
// bytes 4r..4r+3 as unsigned (level + 128), then the 16 rows' scales as
// f32. A 16-row group's nb blocks follow each other; the groups follow
// each other.

// panelQ8Block is the bytes of one panel block of Q8_0.
const panelQ8Block = 9 * 64

// PanelBytes returns the bytes m takes as panels, or 0 when m cannot be
// stored so (not Q8_0, rows not a multiple of 16, or this CPU has no
// kernels that read panels: AVX512-VNNI).
func PanelBytes(m *Mat) int {
	if m.DType != Q8_0 || m.Panels || m.Rows%16 != 0 || m.Cols%32 != 0 || !panelKernels() {
		return 0
	}
	return m.Rows / 16 * (m.Cols / 32) * panelQ8Block
}

// PackPanels returns m with its weights packed as panels into dst
// (PanelBytes(m) bytes).
func PackPanels(m *Mat, dst []byte) (*Mat, error) {
	n := PanelBytes(m)
	if n == 0 {
		return nil, fmt.Errorf("tensor: a %s %d×%d matrix cannot be stored as panels with the %s kernels", m.DType, m.Rows, m.Cols, QuantKernels())
	}
	if len(dst) < n {
		return nil, fmt.Errorf("tensor: PackPanels needs %d bytes, got %d", n, len(dst))
	}
	checkQuant(m)
	packQ8Panels(m, dst[:n])
	c := *m
	c.Q, c.Panels = dst[:n:n], true
	return &c, nil
}

// dequantizePanelRow writes row r of a panel-stored m, dequantized, into
// dst (Cols values): DequantizeRow's q·d, d the panel's f32 scale, which
// holds the block's f16 scale exactly.
func dequantizePanelRow(m *Mat, r int, dst []float32) {
	nb := m.Cols / 32
	group := m.Q[r/16*nb*panelQ8Block:]
	lane := r % 16
	for b := range nb {
		blk := group[b*panelQ8Block:]
		s := math.Float32frombits(binary.LittleEndian.Uint32(blk[512+4*lane:]))
		y := dst[b*32 : (b+1)*32]
		for i := range 8 {
			for j := range 4 {
				y[4*i+j] = float32(int8(blk[64*i+4*lane+j]^0x80)) * s
			}
		}
	}
}
