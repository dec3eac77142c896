package main

// Addressing the rows of the panel kernels (rowSet: the weight rows a pack
// kernel reads, AVX-512 or AVX2, and the activation rows or their metadata
// a dot kernel reads), and loading across the 16 weight rows of the
// AVX-512 ones (quant.go) by transposes and gathers.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowSet addresses n rows L bytes apart from base: row l at bases[l/4] +
// (l%4)·L, with 3L in a register (L3) once there are more than 3 rows.
type rowSet struct {
	bases []GPVirtual
	L, L3 GPVirtual
}

// newRowSet emits the registers of n rows L bytes apart from base: 3L
// (n > 3), then the base of each further group of 4 rows, 4L after the
// one before.
func newRowSet(base, L GPVirtual, n int) rowSet {
	r := rowSet{bases: []GPVirtual{base}, L: L}
	if n > 3 {
		r.L3 = GP64()
		LEAQ(Mem{Base: L, Index: L, Scale: 2}, r.L3)
	}
	for g := 1; g < (n+3)/4; g++ {
		b := GP64()
		LEAQ(Mem{Base: r.bases[g-1], Index: L, Scale: 4}, b)
		r.bases = append(r.bases, b)
	}
	return r
}

// at returns the address of row l at displacement disp.
func (r rowSet) at(l, disp int) Mem {
	m := Mem{Base: r.bases[l/4], Disp: disp}
	switch l % 4 {
	case 1:
		m.Index, m.Scale = r.L, 1
	case 2:
		m.Index, m.Scale = r.L, 2
	case 3:
		m.Index, m.Scale = r.L3, 1
	}
	return m
}

// advance moves every row on by bytes.
func (r rowSet) advance(bytes int) {
	for _, b := range r.bases {
		ADDQ(U32(bytes), b)
	}
}

// rows16 addresses the 16 weight rows of an AVX-512 pack kernel.
type rows16 struct{ rowSet }

// newRows16 emits the registers of 16 rows L bytes apart from base.
func newRows16(base, L GPVirtual) rows16 { return rows16{newRowSet(base, L, 16)} }

// transpose16x8 loads 8 dwords at disp of each of the 16 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose16x8(r rows16, disp int) [8]VecVirtual {
	// z[g] holds rows g and g+4 (g < 4), z[4+g] rows 8+g and 12+g.
	var z [8]VecVirtual
	for g := range 4 {
		for h := range 2 {
			z[4*h+g] = ZMM()
			// A broadcast writes the whole register (a YMM load would
			// leave the upper half live for the register allocator).
			VBROADCASTI64X4(r.at(8*h+g, disp), z[4*h+g])
			VINSERTI64X4(U8(1), r.at(8*h+g+4, disp), z[4*h+g], z[4*h+g])
		}
	}
	var t [8]VecVirtual
	for h := range 2 {
		b := transpose4x4(avx512, [4]VecVirtual(z[4*h:4*h+4]))
		// b[i] 128-bit lanes: rows 4h·2+0..3 dword i, dword 4+i, then
		// rows +4.. dword i, dword 4+i.
		for i := range 4 {
			if h == 0 {
				t[i], t[4+i] = b[i], ZMM()
				continue
			}
			lo, hi := ZMM(), ZMM()
			VSHUFI32X4(U8(0x88), b[i], t[i], lo)
			VSHUFI32X4(U8(0xDD), b[i], t[i], hi)
			t[i], t[4+i] = lo, hi
		}
	}
	return t
}

// transpose16x4 loads 4 dwords at disp of each of the 16 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose16x4(r rows16, disp int) [4]VecVirtual {
	// z[g] holds rows g, 4+g, 8+g, 12+g in its 128-bit lanes.
	var z [4]VecVirtual
	for g := range 4 {
		z[g] = ZMM()
		VBROADCASTI32X4(r.at(g, disp), z[g])
		for k := 1; k < 4; k++ {
			VINSERTI32X4(U8(k), r.at(4*k+g, disp), z[g], z[g])
		}
	}
	return transpose4x4(avx512, z)
}

// transpose4x4 transposes the dwords of 4 vectors of s within each 128-bit
// lane: dword j of lane m of t[i] is dword i of lane m of z[j].
func transpose4x4(s isa, z [4]VecVirtual) [4]VecVirtual {
	a := [4]VecVirtual{s.vec(), s.vec(), s.vec(), s.vec()}
	VPUNPCKLDQ(z[1], z[0], a[0])
	VPUNPCKHDQ(z[1], z[0], a[1])
	VPUNPCKLDQ(z[3], z[2], a[2])
	VPUNPCKHDQ(z[3], z[2], a[3])
	t := [4]VecVirtual{s.vec(), s.vec(), s.vec(), s.vec()}
	VPUNPCKLQDQ(a[2], a[0], t[0])
	VPUNPCKHQDQ(a[2], a[0], t[1])
	VPUNPCKLQDQ(a[3], a[1], t[2])
	VPUNPCKHQDQ(a[3], a[1], t[3])
	return t
}

// gatherD returns the dword at disp of each of the 16 rows.
func gatherD(r rows16, idx VecVirtual, disp int) VecVirtual {
	k := K()
	KXNORW(k, k, k)
	g := ZMM()
	VPGATHERDD(Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, k, g)
	return g
}

// gatherF16 returns the f16 at disp of each of the 16 rows widened to f32:
// a dword gather (the two bytes after the f16 must be readable) whose low
// halves are converted.
func gatherF16(r rows16, idx VecVirtual, disp int, high bool) VecVirtual {
	k := K()
	KXNORW(k, k, k)
	g := ZMM()
	VPGATHERDD(Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, k, g)
	if high {
		VPSRLD(U8(16), g, g)
	}
	h := YMM()
	VPMOVDW(g, h)
	f := ZMM()
	VCVTPH2PS(h, f)
	return f
}

// rowIndex returns the gather index vector l·L for l < 16.
func rowIndex(L GPVirtual) VecVirtual {
	b := ZMM()
	VPBROADCASTD(L.As32(), b)
	idx := ZMM()
	VPMULLD(iotaTable(), b, idx)
	return idx
}
