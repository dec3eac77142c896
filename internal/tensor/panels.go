package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Weights stored as panels: 16 rows interleaved so that one vector holds
// the same levels of 16 rows. Decode streams every weight once a token;
// the one-row kernels (rowquant.go) read ggml's rows at 56–83% of the read
// limit on a Zen 4, while the AVX-512 dot kernels for one activation row
// read the panels at ~90% of it (docs/performance-log.md,
// 2026-12-06). A model can therefore keep its quantized matrices (Q8_0,
// Q4_0, Q5_0, Q4_K, Q5_K, Q6_K) as panels, packed once at load: decode and
// prefill then read them without packing, with the same bits. Every layout
// puts what a kernel reads first earlier in memory: a kernel that first
// touches a panel's lines out of order reads a tenth to two thirds less.
//
// A panel block (panelQ8Block bytes) holds one 32-weight block of 16 rows:
// 8 vectors of 64 bytes, vector i holding levels 4i..4i+3 of each row r at
// bytes 4r..4r+3 as unsigned (level + 128), then the 16 rows' scales as
// f32. A 16-row group's nb blocks follow each other; the groups follow
// each other.

// panelQ8Block is the bytes of one panel block of Q8_0.
const panelQ8Block = 9 * 64

// Q4_0 weights stored as panels keep their nibbles in the bytes of ggml's
// blocks: per pair of blocks of 16 rows (panelQ40Block bytes), 4 vectors
// of each block's nibbles, vector 4h+t holding ggml's bytes qs[4t..4t+3]
// of block h of each row r at bytes 4r..4r+3 (low nibbles levels 4t..4t+3,
// high ones 16+4t..16+4t+3), then the two blocks' scales as f16, 16 each.
const (
	panelQ40D     = 8 * 64
	panelQ40Block = panelQ40D + 64
)

// Q5_0 weights stored as panels are Q4_0's with each block's fifth bits
// before its nibbles, in the bytes of ggml's blocks (panelQ50Block bytes a
// pair of blocks of 16 rows): for block h a vector of fifth bits at
// q50Qh(h) (bytes 4r..4r+3: row r's qh with its bits reordered by q50Bit,
// so that a byte holds the fifth bits of the levels a nibble byte holds)
// and its 4 vectors of nibbles at q50Level(h, t), then the scales as f16
// at panelQ50D.
const (
	panelQ50D     = 10 * 64
	panelQ50Block = panelQ50D + 64
)

// q50Qh returns the offset of block h's fifth-bit vector in a Q5_0 panel
// block.
func q50Qh(h int) int { return 320 * h }

// q50Level returns the offset of block h's nibble vector t.
func q50Level(h, t int) int { return q50Qh(h) + 64 + 64*t }

// q50Bit returns the bit of a Q5_0 panel's reordered qh that holds bit j
// of ggml's qh (the fifth bit of level j): bit t of byte i for level 4t+i,
// bit 4+t for level 16+4t+i.
func q50Bit(j int) int {
	hh, t, i := j/16, j%16/4, j%4
	return 8*i + 4*hh + t
}

// Q4_K weights stored as panels keep their nibbles: the unpacked panels of
// the pack kernel take 2.2 times the blocks' bytes, these 2.8% more (a
// block of 16 rows and 256 weights, panelQ4KBlock bytes, laid out as
// asmgen's quantkdot.go describes): 32 vectors of levels, vector 8p+t
// holding ggml's bytes qs[32p+4t..32p+4t+3] of each row r at bytes
// 4r..4r+3 (low nibbles sub-block 2p's levels, high ones 2p+1's); the 8
// sub-blocks' 6-bit scales as bytes, 16 a sub-block; the mins as bytes, 32
// a pair of sub-blocks (min 2i of row r at byte 2r, min 2i+1 at 2r+1);
// then the rows' d and dmin as f16.
const (
	panelQ4KScales = 32 * 64
	panelQ4KMins   = panelQ4KScales + 8*16
	panelQ4KD      = panelQ4KMins + 4*32
	panelQ4KDmin   = panelQ4KD + 32
	panelQ4KBlock  = panelQ4KDmin + 32
)

// Q5_K weights stored as panels (2.3% over ggml's blocks, laid out as
// asmgen's quantk5n.go describes) start with a header of the mins, d,
// dmin and scales as Q4_K's panels hold them (q5KHeader); then for t < 8
// the vector of fifth bits t, holding ggml's bytes qh[4t..4t+3] of each row
// r at bytes 4r..4r+3 (bit j the fifth bit of sub-block j's levels), at
// q5KQh(t), and the 4 nibble vectors 8p+t (as Q4_K's) that need it at
// q5KLevel(8p+t): a one-row kernel reads every line once, in order.
const (
	panelQ5KBody  = 5 * 64
	panelQ5KBlock = panelQ5KBody + 40*64
)

// q5KHeader is where a Q5_K panel block keeps its mins, d, dmin and scales.
var q5KHeader = kHeader{mins: 0, d: 128, dmin: 160, scales: 192}

// q5KQh returns the offset of fifth-bit vector t in a Q5_K panel block.
func q5KQh(t int) int { return panelQ5KBody + 320*t }

// q5KLevel returns the offset of nibble vector v = 8p+t in a Q5_K panel
// block.
func q5KLevel(v int) int { return q5KQh(v%8) + 64 + 64*(v/8) }

// kHeader is where a K-quant panel block that keeps the nibbles holds the
// rows' 6-bit scales as bytes (16 a sub-block), the mins as bytes in pairs
// (32 a pair of sub-blocks: min 2i of row r at byte 2r, 2i+1 at 2r+1), and
// d and dmin as f16.
type kHeader struct{ scales, mins, d, dmin int }

// q4KHeader is where a Q4_K panel block keeps them.
var q4KHeader = kHeader{scales: panelQ4KScales, mins: panelQ4KMins, d: panelQ4KD, dmin: panelQ4KDmin}

// Q6_K weights stored as panels keep ggml's bytes (a super-block of 16 rows
// in panelQ6KBlock bytes, 1% over the blocks, laid out as asmgen's
// quantk6n.go describes): ql vector v (ggml's ql[4v..4v+3] of each row r at
// bytes 4r..4r+3) at q6KQl(v), qh vector u likewise at q6KQh(u), in groups
// of four qh vectors each followed by the two ql vectors whose top bits it
// holds, each group followed by a line of the 4 sub-block scales it
// completes (q6KScales: 16 bytes a sub-block, one a row), then d as f32.
const (
	panelQ6KGroup = 13 * 64
	panelQ6KD     = 4 * panelQ6KGroup
	panelQ6KBlock = panelQ6KD + 64
)

// q6KQh returns the offset of qh vector u in a Q6_K panel block.
func q6KQh(u int) int {
	n, q := u/8, u%8
	return panelQ6KGroup*(2*n+q/4) + 192*(q%4)
}

// q6KQl returns the offset of ql vector v in a Q6_K panel block.
func q6KQl(v int) int { return q6KQh(v/16*8+v%8) + 64 + 64*(v%16/8) }

// q6KScales returns the offset of sub-block s's scales in a Q6_K panel
// block: in the line of group (s/8, s%2), slot (s%8)/2.
func q6KScales(s int) int { return panelQ6KGroup*(2*(s/8)+s%2) + 12*64 + 16*(s%8/2) }

// panelBlock returns the bytes of one panel block of dtype dt and the
// weights of a row it covers, or 0, 0 for a dtype never stored as panels.
func panelBlock(dt DType) (bytes, elems int) {
	switch dt {
	case Q8_0:
		return panelQ8Block, 32
	case Q4_0:
		return panelQ40Block, 64
	case Q5_0:
		return panelQ50Block, 64
	case Q4_K:
		return panelQ4KBlock, qk
	case Q5_K:
		return panelQ5KBlock, qk
	case Q6_K:
		return panelQ6KBlock, qk
	}
	return 0, 0
}

// PanelBytes returns the bytes m takes as panels, or 0 when m cannot be
// stored so (not quantized, rows not a multiple of 16, or this CPU has no
// kernels that read panels: AVX512-VNNI).
func PanelBytes(m *Mat) int {
	bytes, elems := panelBlock(m.DType)
	if bytes == 0 || m.Panels || m.Rows%16 != 0 || m.Cols%elems != 0 || !panelKernels() {
		return 0
	}
	return m.Rows / 16 * (m.Cols / elems) * bytes
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
	packPanels(m, dst[:n])
	c := *m
	c.Q, c.Panels = dst[:n:n], true
	return &c, nil
}

// q40PanelBlock writes block b of row r of a Q4_0 panel-stored m into dst
// (18 bytes) in ggml's layout: the panel read back.
func q40PanelBlock(m *Mat, r, b int, dst []byte) {
	np := m.Cols / 64
	blk := m.Q[(r/16*np+b/2)*panelQ40Block:][:panelQ40Block]
	lane, h := r%16, b%2
	copy(dst[0:2], blk[panelQ40D+32*h+2*lane:])
	for t := range 4 {
		copy(dst[2+4*t:6+4*t], blk[64*(4*h+t)+4*lane:])
	}
}

// q50PanelBlock writes block b of row r of a Q5_0 panel-stored m into dst
// (22 bytes) in ggml's layout: the panel read back.
func q50PanelBlock(m *Mat, r, b int, dst []byte) {
	np := m.Cols / 64
	blk := m.Q[(r/16*np+b/2)*panelQ50Block:][:panelQ50Block]
	lane, h := r%16, b%2
	copy(dst[0:2], blk[panelQ50D+32*h+2*lane:])
	q := binary.LittleEndian.Uint32(blk[q50Qh(h)+4*lane:])
	var qh uint32
	for j := range 32 {
		qh |= (q >> q50Bit(j) & 1) << j
	}
	binary.LittleEndian.PutUint32(dst[2:6], qh)
	for t := range 4 {
		copy(dst[6+4*t:10+4*t], blk[q50Level(h, t)+4*lane:])
	}
}

// q6KPanelBlock writes super-block b of row r of a Q6_K panel-stored m
// into dst (210 bytes) in ggml's layout: the panel read back.
func q6KPanelBlock(m *Mat, r, b int, dst []byte) {
	nb := m.Cols / qk
	blk := m.Q[(r/16*nb+b)*panelQ6KBlock:][:panelQ6KBlock]
	lane := r % 16
	for v := range 32 {
		copy(dst[4*v:4*v+4], blk[q6KQl(v)+4*lane:])
	}
	for u := range 16 {
		copy(dst[128+4*u:132+4*u], blk[q6KQh(u)+4*lane:])
	}
	for s := range 16 {
		dst[192+s] = blk[q6KScales(s)+lane]
	}
	d := math.Float32frombits(binary.LittleEndian.Uint32(blk[panelQ6KD+4*lane:]))
	binary.LittleEndian.PutUint16(dst[208:], F32ToF16(d))
}

// q4KPanelBlock writes super-block b of row r of a Q4_K panel-stored m
// into dst (144 bytes) in ggml's layout: the panel read back.
func q4KPanelBlock(m *Mat, r, b int, dst []byte) {
	nb := m.Cols / qk
	q4KPanel(m.Q[(r/16*nb+b)*panelQ4KBlock:][:panelQ4KBlock], q4KHeader, r%16, dst)
}

// q5KPanelBlock writes super-block b of row r of a Q5_K panel-stored m
// into dst (176 bytes) in ggml's layout: the panel read back.
func q5KPanelBlock(m *Mat, r, b int, dst []byte) {
	nb := m.Cols / qk
	blk := m.Q[(r/16*nb+b)*panelQ5KBlock:][:panelQ5KBlock]
	lane := r % 16
	// ggml's Q5_K block is a Q4_K block with qh[32] between the scales
	// and the nibbles.
	q4KPanel(blk, q5KHeader, lane, dst[:16])
	for t := range 8 {
		copy(dst[16+4*t:20+4*t], blk[q5KQh(t)+4*lane:])
	}
	for v := range 32 {
		copy(dst[48+4*v:52+4*v], blk[q5KLevel(v)+4*lane:])
	}
}

// q4KPanel writes lane's header (d, dmin, scales and mins, where h says)
// of the panel block blk into dst[:16] in ggml's layout, and when dst holds
// a whole Q4_K block (144 bytes) its nibbles too.
func q4KPanel(blk []byte, h kHeader, lane int, dst []byte) {
	copy(dst[0:2], blk[h.d+2*lane:])
	copy(dst[2:4], blk[h.dmin+2*lane:])
	clear(dst[4:16])
	for j := range 8 {
		putScaleMinK4(dst[4:16], j, blk[h.scales+16*j+lane], blk[h.mins+32*(j/2)+2*lane+j%2])
	}
	if len(dst) < 144 {
		return
	}
	for v := range 32 {
		copy(dst[16+4*v:20+4*v], blk[64*v+4*lane:])
	}
}

// panelBlockReaders write block b (ggml's) of row r of a panel-stored m of
// their dtype into dst in ggml's layout: the panel read back.
var panelBlockReaders = map[DType]func(m *Mat, r, b int, dst []byte){
	Q8_0: q80PanelBlock, Q4_0: q40PanelBlock, Q5_0: q50PanelBlock,
	Q4_K: q4KPanelBlock, Q5_K: q5KPanelBlock, Q6_K: q6KPanelBlock,
}

// q80PanelBlock writes block b of row r of a Q8_0 panel-stored m into dst
// (34 bytes) in ggml's layout: the panel's f32 scale holds the block's f16
// scale exactly.
func q80PanelBlock(m *Mat, r, b int, dst []byte) {
	nb := m.Cols / 32
	blk := m.Q[(r/16*nb+b)*panelQ8Block:][:panelQ8Block]
	lane := r % 16
	scale := math.Float32frombits(binary.LittleEndian.Uint32(blk[512+4*lane:]))
	binary.LittleEndian.PutUint16(dst, F32ToF16(scale))
	for i := range 8 {
		for j := range 4 {
			dst[2+4*i+j] = blk[64*i+4*lane+j] ^ 0x80
		}
	}
}

// dequantizePanelRow writes row r of a panel-stored m, dequantized, into
// dst (Cols values), as DequantizeRow does from the blocks read back.
func dequantizePanelRow(m *Mat, r int, dst []float32) {
	read := panelBlockReaders[m.DType]
	elems, bytes := m.DType.BlockSize()
	var buf [210]byte // the largest block (Q6_K)
	blk := buf[:bytes]
	for b := range m.Cols / elems {
		read(m, r, b, blk)
		DequantizeRow(m.DType, blk, dst[b*elems:(b+1)*elems])
	}
}
