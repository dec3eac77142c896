package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// The KV pattern. A simulated forward pass writes, for a token t at
// position p, into the K and V rows of every layer l, element e:
//
//	mix(rowSeed(t, p, l, kv) + e·φ)
//
// truncated to the element's width (16 bits for bf16, 32 for f32) and
// stored as raw bits, never as a float, so nothing rounds it. Every
// element depends on the token, its position, the layer and K|V, so a block
// that lands in the wrong place, a block from another prompt or another
// request, a stale block, a half-written block or a flipped byte all fail
// the check; zeros (fresh memory) never pass. The pattern does not depend on
// the simulator's seed: engines with different seeds still agree on KV.

const phi = 0x9e3779b97f4a7c15

// mix is SplitMix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func rowSeed(tok int32, pos, layer, kv int) uint64 {
	return mix(uint64(uint32(tok)) ^ uint64(pos)<<32 ^ mix(uint64(layer)<<1|uint64(kv)+phi))
}

// writeRow stores the pattern of (tok, pos, layer, kv) at element offset off
// of pool.
func writeRow(pool []byte, l kvlayout.Layout, off int, tok int32, pos, layer, kv int) {
	seed := rowSeed(tok, pos, layer, kv)
	n := l.TokenElems()
	if l.DType == kvlayout.F32 {
		b := pool[4*off : 4*(off+n)]
		for e := range n {
			binary.LittleEndian.PutUint32(b[4*e:], uint32(mix(seed+uint64(e)*phi)))
		}
		return
	}
	b := pool[2*off : 2*(off+n)]
	for e := range n {
		binary.LittleEndian.PutUint16(b[2*e:], uint16(mix(seed+uint64(e)*phi)))
	}
}

// rowOK reports whether the row at element offset off holds the pattern of
// (tok, pos, layer, kv).
func rowOK(pool []byte, l kvlayout.Layout, off int, tok int32, pos, layer, kv int) bool {
	seed := rowSeed(tok, pos, layer, kv)
	n := l.TokenElems()
	if l.DType == kvlayout.F32 {
		b := pool[4*off : 4*(off+n)]
		for e := range n {
			if binary.LittleEndian.Uint32(b[4*e:]) != uint32(mix(seed+uint64(e)*phi)) {
				return false
			}
		}
		return true
	}
	b := pool[2*off : 2*(off+n)]
	for e := range n {
		if binary.LittleEndian.Uint16(b[2*e:]) != uint16(mix(seed+uint64(e)*phi)) {
			return false
		}
	}
	return true
}

// writeToken stores the pattern of token tok at position pos, every layer,
// K and V, in its slot of blocks.
func writeToken(pool []byte, l kvlayout.Layout, blocks []int32, tok int32, pos int) {
	b, slot := int(blocks[pos/l.BlockSize]), pos%l.BlockSize
	for layer := range l.Layers {
		for kv := range 2 {
			writeRow(pool, l, l.Offset(b, layer, kv, slot), tok, pos, layer, kv)
		}
	}
}

// PatternError is a KV check's finding: the first wrong row of each bad
// block.
type PatternError struct {
	// Blocks are the physical ids of the blocks that failed, in position
	// order.
	Blocks []int32
	// Pos, Token, Layer and KV locate the first wrong row.
	Pos, Layer, KV int
	Token          int32
}

// Error names the bad blocks and the first wrong row.
func (e *PatternError) Error() string {
	kv := "K"
	if e.KV == 1 {
		kv = "V"
	}
	return fmt.Sprintf("KV pattern check failed in %d block(s) %v: block %d holds other bytes than token %d at position %d (layer %d, %s); the KV landed in the wrong place or was damaged on the way",
		len(e.Blocks), e.Blocks, e.Blocks[0], e.Token, e.Pos, e.Layer, kv)
}

// checkRange checks positions [from, to) of a sequence whose token at
// position p is tokenAt(p). It returns nil or a *PatternError naming every
// bad block.
func checkRange(pool []byte, l kvlayout.Layout, blocks []int32, tokenAt func(int) int32, from, to int) *PatternError {
	var perr *PatternError
	for p := from; p < to; p++ {
		bi := p / l.BlockSize
		tok := tokenAt(p)
		layer, kv, ok := tokenOK(pool, l, int(blocks[bi]), p%l.BlockSize, tok, p)
		if ok {
			continue
		}
		if perr == nil {
			perr = &PatternError{Pos: p, Token: tok, Layer: layer, KV: kv}
		}
		perr.Blocks = append(perr.Blocks, blocks[bi])
		p = (bi+1)*l.BlockSize - 1 // the rest of this block is not worth reading
	}
	return perr
}

// tokenOK checks every row of one token's slot, returning the first wrong
// one.
func tokenOK(pool []byte, l kvlayout.Layout, block, slot int, tok int32, pos int) (layer, kv int, ok bool) {
	for layer := range l.Layers {
		for kv := range 2 {
			if !rowOK(pool, l, l.Offset(block, layer, kv, slot), tok, pos, layer, kv) {
				return layer, kv, false
			}
		}
	}
	return 0, 0, true
}
