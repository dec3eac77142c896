package main

// Attention's scores on AVX2 from keys packed transposed.
//
// attnScoresAVX2R1..3 score 1..3 f32 query rows against keys packed 8 to a
// group: group G holds, for each element t of the head dimension, one
// vector whose lane j is element t of key 8G+j (f32, the pool's bf16
// widened exactly), so group G is hd vectors (32·hd bytes) and one FMA
// yields a partial sum for 8 keys at once, with no horizontal reduction
// per score.
//
// Every score is bit-identical to gemmAVX2BF16R* / gemmAVX2F32R*
// (DotRowsBF16 and DotRows on AVX2): there lane i of a key's accumulator
// takes the FMAs of elements i, i+8, i+16, ... in that order (acc =
// fma(w, x, acc) from +0), the 8 lanes are added by the tree
// ((L0+L4)+(L2+L6)) + ((L1+L5)+(L3+L7)), and the hd%8 tail elements are
// added after that with scalar FMAs in order. Here the accumulator P_i of
// a group takes lane i's FMAs for 8 keys at once (the same operands in
// the same order: FMA and addition are commutative in their operands),
// the P_i are added by the same tree and the tail FMAs follow the same
// way.
//
// The kernels walk keys two groups (16 keys) at a time and compute the
// leaves in pairs (P_i, P_{i+4}): 2 leaves × 2 groups × 3 rows = 12
// accumulators, so each key vector load serves 3 rows and each broadcast
// query element 2 groups, and 12 independent FMA chains cover the FMA
// latency. The partial sums of the tree that wait for their partner go to
// a stack slot (P_0+P_4 and P_1+P_5) or to the output (the left half of the
// tree).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// attnScoresAVX2 emits the scores kernel for rows (1..3) query rows: for
// key pairs of groups P < pairs and j < 16, out[r·ldo + 16P + j] = q_r ·
// key_{16P+j}, query row r at q + r·ldq (hd f32 elements), the pair's
// groups at k + 2P·8·hd and k + (2P+1)·8·hd (elements).
func attnScoresAVX2(rows int) {
	name := fmt.Sprintf("attnScoresAVX2R%d", rows)
	TEXT(name, NOSPLIT, "func(q *float32, ldq int, k *float32, pairs int, hd int, out *float32, ldo int)")
	Doc(fmt.Sprintf("%s computes the scores of %d f32 query rows against groups of 8 transposed keys, 16 keys per pair (see asmgen).", name, rows))
	spill := AllocLocal(32 * 2 * rows)
	q := Load(Param("q"), GP64())
	ldq := Load(Param("ldq"), GP64())
	SHLQ(U8(2), ldq)
	kp := Load(Param("k"), GP64())
	pairs := Load(Param("pairs"), GP64())
	hd := Load(Param("hd"), GP64())
	gs := GP64() // bytes per group: 8 keys × hd elements × 4
	MOVQ(hd, gs)
	SHLQ(U8(5), gs)
	steps := GP64() // full steps of 8 elements
	MOVQ(hd, steps)
	SHRQ(U8(3), steps)
	out := Load(Param("out"), GP64())
	ldo := Load(Param("ldo"), GP64())
	SHLQ(U8(2), ldo)
	kr, qp, cnt := GP64(), GP64(), GP64()

	// Row r of a matrix whose rows are ld bytes apart: base + r·ld.
	rowMem := func(base, ld Register, r, disp int) Mem {
		m := Mem{Base: base, Disp: disp}
		if r > 0 {
			m.Index, m.Scale = ld, uint8(r)
		}
		return m
	}
	// Group g (0, 1) of the current pair at kr, plus disp bytes.
	keyMem := func(g, disp int) Mem {
		m := Mem{Base: kr, Disp: disp}
		if g == 1 {
			m.Index, m.Scale = gs, 1
		}
		return m
	}

	TESTQ(pairs, pairs)
	JE(LabelRef("done"))
	Label("pair")
	// pass computes A = P_i + P_{i+4} for both groups and every row.
	pass := func(i int) [][]VecVirtual {
		acc := make([][][]VecVirtual, 2) // [leaf][group][row]
		for l := range acc {
			acc[l] = make([][]VecVirtual, 2)
			for g := range acc[l] {
				acc[l][g] = make([]VecVirtual, rows)
				for r := range rows {
					acc[l][g][r] = YMM()
					VXORPS(acc[l][g][r], acc[l][g][r], acc[l][g][r])
				}
			}
		}
		lbl := fmt.Sprintf("leaf%d", i)
		MOVQ(kp, kr)
		ADDQ(U32(32*i), kr)
		LEAQ(Mem{Base: q, Disp: 4 * i}, qp)
		MOVQ(steps, cnt)
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "end"))
		Label(lbl)
		for l := range 2 {
			// Leaf i+4l: element 8s+i+4l, 4l vectors (128·l bytes) and
			// 4l query elements (16·l bytes) on from leaf i.
			k := []VecVirtual{YMM(), YMM()}
			for g := range 2 {
				VMOVUPS(keyMem(g, 128*l), k[g])
			}
			for r := range rows {
				b := YMM()
				VBROADCASTSS(rowMem(qp, ldq, r, 16*l), b)
				for g := range 2 {
					VFMADD231PS(k[g], b, acc[l][g][r])
				}
			}
		}
		ADDQ(U32(256), kr)
		ADDQ(U32(32), qp)
		DECQ(cnt)
		JNE(LabelRef(lbl))
		Label(lbl + "end")
		for g := range 2 {
			for r := range rows {
				VADDPS(acc[1][g][r], acc[0][g][r], acc[0][g][r])
			}
		}
		return acc[0]
	}
	slot := func(g, r int) Mem { return spill.Offset(32 * (g*rows + r)) }

	// Left half of the tree: (P0+P4) + (P2+P6), left in the output.
	a := pass(0)
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], slot(g, r))
		}
	}
	a = pass(2)
	for g := range 2 {
		for r := range rows {
			VADDPS(slot(g, r), a[g][r], a[g][r])
			VMOVUPS(a[g][r], rowMem(out, ldo, r, 32*g))
		}
	}
	// Right half, (P1+P5) + (P3+P7), then the root.
	a = pass(1)
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], slot(g, r))
		}
	}
	a = pass(3)
	for g := range 2 {
		for r := range rows {
			VADDPS(slot(g, r), a[g][r], a[g][r])
			VADDPS(rowMem(out, ldo, r, 32*g), a[g][r], a[g][r])
		}
	}
	// The hd%8 tail elements, in order, one FMA each.
	MOVQ(steps, kr)
	SHLQ(U8(8), kr)
	ADDQ(kp, kr)
	MOVQ(steps, qp)
	SHLQ(U8(5), qp)
	ADDQ(q, qp)
	MOVQ(hd, cnt)
	ANDQ(U32(7), cnt)
	JE(LabelRef("store"))
	Label("tail")
	k := []VecVirtual{YMM(), YMM()}
	for g := range 2 {
		VMOVUPS(keyMem(g, 0), k[g])
	}
	for r := range rows {
		b := YMM()
		VBROADCASTSS(rowMem(qp, ldq, r, 0), b)
		for g := range 2 {
			VFMADD231PS(k[g], b, a[g][r])
		}
	}
	ADDQ(U32(32), kr)
	ADDQ(U32(4), qp)
	DECQ(cnt)
	JNE(LabelRef("tail"))
	Label("store")
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], rowMem(out, ldo, r, 32*g))
		}
	}
	LEAQ(Mem{Base: kp, Index: gs, Scale: 2}, kp)
	ADDQ(U32(64), out)
	DECQ(pairs)
	JNE(LabelRef("pair"))
	Label("done")
	VZEROUPPER()
	RET()
}

// Decode's scores on AVX2 straight from the pool's bf16 key rows.
//
// attnKeysAVX2R1..3 score 1..3 f32 query rows against keys stored as rows
// (a KV block's key rows, ldk elements apart), 8 keys at a time, with the
// head dimension a multiple of 8. Each key keeps its own accumulator, as in
// gemmAVX2BF16R*: lane i takes the FMAs of elements i, i+8, i+16, ... in
// that order (acc = fma(key, q, acc) from +0, the key widened exactly,
// the same instruction with the same operand roles). What changes is the
// reduction across lanes: gemmAVX2BF16R* sums one accumulator at a time
// (the high half onto the low, lanes 2–3 onto 0–1, lane 1 onto 0: the
// tree ((L0+L4)+(L2+L6)) + ((L1+L5)+(L3+L7))); here 8 keys' accumulators
// are reduced together into one vector of 8 scores by the same additions,
// each with the same left operand:
//
//   - level 1, keys a and e in one vector: [a.lo | e.lo] + [a.hi | e.hi]
//     (VPERM2F128) gives x_i = L_i + L_{i+4} of both keys;
//   - level 2, two such vectors (a, e) and (b, f): [x0, x1] of both + [x2,
//     x3] of both (VSHUFPS) gives y0 = x0+x2 and y1 = x1+x3 of four keys;
//   - level 3, two level-2 vectors: the y0s + the y1s (VSHUFPS) gives the
//     8 scores, keys 0..3 in the low half and 4..7 in the high one when
//     the level-2 vectors hold keys {0, 1, 4, 5} and {2, 3, 6, 7}.
//
// So every score is bit-identical to DotRowsBF16's (NaN payloads included:
// each addition keeps its operand order), at 21 shuffles and additions a
// row for 8 keys rather than 6 and a scalar store per key. With 2 or 3 rows
// the keys go in two passes of 4 ({0, 1, 4, 5}, then {2, 3, 6, 7}: 4·rows
// accumulators, the query vectors and one key vector in 16 registers), the
// first pass's level-2 vectors waiting in a stack slot; one row takes all 8
// keys in one pass.
//
// With prefetch it emits attnKeysPfAVX2R1..3 instead: the same operations
// in the same order (so the same bits), and it also prefetches consecutive
// cache lines from k + pf bytes on (the KV bytes a later call will read,
// handed on by the caller), one line at a time among the arithmetic: the
// step loop runs 4 steps (64 bytes of each of a pass's 4 keys) a trip, and
// each step of a trip prefetches the next line (two with one row, whose
// pass takes both halves' 8 keys). So a group of 8 keys prefetches
// 8·⌊hd/32⌋ lines, as many bytes as it reads when hd is a multiple of 32,
// each PREFETCHT0 beside 4·rows FMAs. Steps beyond a multiple of 4
// (hd%32 ≠ 0) run one at a time and prefetch nothing; without prefetch
// every step runs that way.
func attnKeysAVX2(rows int, prefetch bool) {
	if prefetch {
		name := fmt.Sprintf("attnKeysPfAVX2R%d", rows)
		TEXT(name, NOSPLIT, "func(q *float32, ldq int, k *uint16, ldk int, groups int, hd int, out *float32, ldo int, pf int)")
		Doc(fmt.Sprintf("%s computes the scores of %d f32 query rows against groups of 8 bf16 key rows, prefetching lines from k+pf bytes on (see asmgen).", name, rows))
	} else {
		name := fmt.Sprintf("attnKeysAVX2R%d", rows)
		TEXT(name, NOSPLIT, "func(q *float32, ldq int, k *uint16, ldk int, groups int, hd int, out *float32, ldo int)")
		Doc(fmt.Sprintf("%s computes the scores of %d f32 query rows against groups of 8 bf16 key rows (see asmgen).", name, rows))
	}
	spill := AllocLocal(32 * rows)
	// One row needs neither ldq nor ldo; the kernels without prefetch
	// load them all the same (two dead loads kept so that their code
	// stays as it was generated).
	loadStrides := rows > 1 || !prefetch
	q := Load(Param("q"), GP64())
	var ldq, ldo Register
	if loadStrides {
		ldq = Load(Param("ldq"), GP64())
		SHLQ(U8(2), ldq)
	}
	kp := Load(Param("k"), GP64())
	ldk := Load(Param("ldk"), GP64())
	SHLQ(U8(1), ldk)
	groups := Load(Param("groups"), GP64())
	steps := Load(Param("hd"), GP64())
	SHRQ(U8(3), steps)
	out := Load(Param("out"), GP64())
	if loadStrides {
		ldo = Load(Param("ldo"), GP64())
		SHLQ(U8(2), ldo)
	}
	// The next line to prefetch.
	var pw Register
	if prefetch {
		pw = Load(Param("pf"), GP64())
		ADDQ(kp, pw)
	}
	p0, p4, qp, cnt := GP64(), GP64(), GP64(), GP64()
	// The bf16 → f32 widening's byte shuffle: with 3 rows the registers
	// are all taken and it is read from memory.
	var widen Op = attnWidenTable()
	if rows < 3 {
		w := YMM()
		VMOVDQU(attnWidenTable(), w)
		widen = w
	}

	qMem := func(r int) Mem {
		m := Mem{Base: qp}
		if r > 0 {
			m.Index, m.Scale = ldq, uint8(r)
		}
		return m
	}
	// Key off (0..7) of the group: p0 + (off%4 − base)·ldk for off < 4,
	// p4 likewise for off ≥ 4, where p0 and p4 point at keys base and
	// base+4 (base 0 or 2) plus the current step.
	keyMem := func(off, base int) Mem {
		m := Mem{Base: p0}
		if off >= 4 {
			m.Base = p4
		}
		if (off%4)-base == 1 {
			m.Index, m.Scale = ldk, 1
		}
		return m
	}
	type half struct {
		base int    // 0: keys {0, 1, 4, 5}; 2: keys {2, 3, 6, 7}
		keys [4]int // a, b, e, f: level 1 pairs (a, e) and (b, f)
	}
	halves := []half{{0, [4]int{0, 1, 4, 5}}, {2, [4]int{2, 3, 6, 7}}}
	// level12 reduces the accumulators of keys a, b, e, f (one row) into
	// the level-2 vector [a.y0, a.y1, b.y0, b.y1 | e.y0, e.y1, f.y0, f.y1].
	level12 := func(acc [4]VecVirtual) VecVirtual {
		v := make([]VecVirtual, 2)
		for i := range 2 {
			lo, hi := YMM(), YMM()
			VPERM2F128(U8(0x20), acc[2+i], acc[i], lo)
			VPERM2F128(U8(0x31), acc[2+i], acc[i], hi)
			VADDPS(hi, lo, lo)
			v[i] = lo
		}
		s0, s1 := YMM(), YMM()
		VSHUFPS(U8(0x44), v[1], v[0], s0)
		VSHUFPS(U8(0xEE), v[1], v[0], s1)
		VADDPS(s1, s0, s0)
		return s0
	}
	// pass runs the K loop for the given halves and returns, per half and
	// row, the accumulators of the half's keys a, b, e, f.
	pass := func(lbl string, hs []half) [][][4]VecVirtual {
		acc := make([][][4]VecVirtual, len(hs))
		for h := range hs {
			acc[h] = make([][4]VecVirtual, rows)
			for r := range rows {
				for kk := range 4 {
					acc[h][r][kk] = YMM()
					VXORPS(acc[h][r][kk], acc[h][r][kk], acc[h][r][kk])
				}
			}
		}
		// With two halves in one pass (one row) the key pointers are the
		// group's keys 0 and 4, and keys 2, 3, 6, 7 are 2·ldk on: keep
		// the second half's pointers apart.
		var p2, p6 GPVirtual
		if hs[0].base == 0 {
			MOVQ(kp, p0)
		} else {
			LEAQ(Mem{Base: kp, Index: ldk, Scale: uint8(hs[0].base)}, p0)
		}
		LEAQ(Mem{Base: p0, Index: ldk, Scale: 4}, p4)
		if len(hs) == 2 {
			p2, p6 = GP64(), GP64()
			LEAQ(Mem{Base: p0, Index: ldk, Scale: 2}, p2)
			LEAQ(Mem{Base: p4, Index: ldk, Scale: 2}, p6)
		}
		// step emits step i of a trip (i·16 bytes into the keys, i·32
		// into the queries), prefetching with it the trip's line i (lines
		// 2i and 2i+1 with two halves) unless pre is false.
		step := func(i int, pre bool) {
			qv := make([]VecVirtual, rows)
			for r := range rows {
				qv[r] = YMM()
				m := qMem(r)
				m.Disp = 32 * i
				VMOVUPS(m, qv[r])
			}
			for h, hf := range hs {
				for kk, off := range hf.keys {
					m := keyMem(off, hf.base)
					if h == 1 {
						m.Base = p2
						if off >= 4 {
							m.Base = p6
						}
					}
					m.Disp = 16 * i
					if pre && kk == i {
						PREFETCHT0(Mem{Base: pw, Disp: 64 * (i*len(hs) + h)})
					}
					kv := YMM()
					VBROADCASTI128(m, kv)
					VPSHUFB(widen, kv, kv)
					for r := range rows {
						VFMADD231PS(kv, qv[r], acc[h][r][kk])
					}
				}
			}
		}
		advance := func(i int) {
			ADDQ(U32(16*i), p0)
			ADDQ(U32(16*i), p4)
			if len(hs) == 2 {
				ADDQ(U32(16*i), p2)
				ADDQ(U32(16*i), p6)
			}
			ADDQ(U32(32*i), qp)
		}
		// single emits the loop of one step a trip, over cnt (≥ 1) steps.
		single := func(loop string) {
			Label(loop)
			step(0, false)
			advance(1)
			DECQ(cnt)
			JNE(LabelRef(loop))
		}
		MOVQ(q, qp)
		MOVQ(steps, cnt)
		if !prefetch {
			single(lbl)
			return acc
		}
		SHRQ(U8(2), cnt)
		JE(LabelRef(lbl + "one"))
		Label(lbl)
		for i := range 4 {
			step(i, true)
		}
		advance(4)
		ADDQ(U32(256*len(hs)), pw)
		DECQ(cnt)
		JNE(LabelRef(lbl))
		Label(lbl + "one")
		MOVQ(steps, cnt)
		ANDQ(U8(3), cnt)
		JE(LabelRef(lbl + "end"))
		single(lbl + "1")
		Label(lbl + "end")
		return acc
	}
	// final combines the level-2 vectors of keys {0, 1, 4, 5} (w0) and
	// {2, 3, 6, 7} (w1) into the 8 scores and stores them for row r.
	final := func(w0, w1 VecVirtual, r int) {
		t0, t1 := YMM(), YMM()
		VSHUFPS(U8(0x88), w1, w0, t0)
		VSHUFPS(U8(0xDD), w1, w0, t1)
		VADDPS(t1, t0, t0)
		m := Mem{Base: out}
		if r > 0 {
			m.Index, m.Scale = ldo, uint8(r)
		}
		VMOVUPS(t0, m)
	}

	TESTQ(groups, groups)
	JE(LabelRef("done"))
	Label("group")
	if rows == 1 {
		acc := pass("both", halves)
		final(level12(acc[0][0]), level12(acc[1][0]), 0)
	} else {
		acc := pass("first", halves[:1])
		for r := range rows {
			VMOVUPS(level12(acc[0][r]), spill.Offset(32*r))
		}
		acc = pass("second", halves[1:])
		for r := range rows {
			w1 := level12(acc[0][r])
			w0 := YMM()
			VMOVUPS(spill.Offset(32*r), w0)
			final(w0, w1, r)
		}
	}
	LEAQ(Mem{Base: kp, Index: ldk, Scale: 8}, kp)
	ADDQ(U32(32), out)
	DECQ(groups)
	JNE(LabelRef("group"))
	Label("done")
	VZEROUPPER()
	RET()
}

// attnWidenMem is the data of attnWidenTable, once emitted.
var attnWidenMem *Mem

// attnWidenTable returns the VPSHUFB control that widens 8 bf16 values
// broadcast to both halves of a register (VBROADCASTI128) to 8 f32 lanes
// exactly: lane i (dword i) takes bytes 2i and 2i+1 of its 128-bit half's
// copy (element i) in its top 16 bits and zero in its bottom 16. One
// shuffle per 8 elements where VPMOVZXWD and VPSLLD took two.
func attnWidenTable() Mem {
	if attnWidenMem != nil {
		return *attnWidenMem
	}
	t := GLOBL("attnwiden", RODATA|NOPTR)
	attnWidenMem = &t
	for i := range 8 {
		DATA(4*i, U32(0x8080|uint32(2*i)<<16|uint32(2*i+1)<<24))
	}
	return t
}
