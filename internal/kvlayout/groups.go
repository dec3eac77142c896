package kvlayout

import (
	"cmp"
	"slices"
)

// KeyChunk is the number of key positions attention walks at once: chunk c
// holds positions [c·KeyChunk, (c+1)·KeyChunk). A sliding-window layer
// reads its keys from the start of the chunk holding its window's first
// position (the keys before that start are read and masked), so that is
// where the blocks it keeps begin (see FirstNeeded).
const KeyChunk = 64

// Group is one KV-cache group (vLLM's KVCacheGroupSpec): layers of one
// attention type that share a block table. A block (page) holds the K and V
// of every layer of one group, so the groups of a model share one pool of
// pages of the same byte size (Layout.Layers layer slots each; a group with
// fewer layers leaves the rest of each page unused).
type Group struct {
	// Window is the attention window W of the group's layers (a query at
	// position p sees keys (p−W, p]); 0 means full attention.
	Window int
	// Layers are the model layers of the group, in order; layer Layers[j]
	// sits in layer slot j of the group's pages.
	Layers []int
}

// FirstNeeded returns the first position whose KV a layer with window
// (0: full attention) still reads when it computes position p or any later
// one: 0 for full attention, else the start of the key chunk holding
// p−window+1. A group's blocks wholly before it can be freed.
func FirstNeeded(window, p int) int {
	if window <= 0 || p-window+1 <= 0 {
		return 0
	}
	return (p - window + 1) / KeyChunk * KeyChunk
}

// Single returns one group holding every layer of a model whose layer i has
// window windows[i] (0: full attention): the layout of a pool without
// hybrid grouping, where a block holds all layers. Its window is the
// layers' common window, or 0 (full) when they differ.
func Single(windows []int) []Group {
	g := Group{Layers: make([]int, len(windows))}
	for i := range windows {
		g.Layers[i] = i
	}
	if len(windows) > 0 && !slices.ContainsFunc(windows, func(w int) bool { return w != windows[0] }) {
		g.Window = max(windows[0], 0)
	}
	return []Group{g}
}

// Grouped returns the KV-cache groups of a model whose layer i has window
// windows[i] (0: full attention), after vLLM's uniform-page-size grouping:
// layers are sorted by window, every group has G layers, G being the
// smallest number of layers of one window (or the largest, when the
// counts are within 25% of each other), and a window's layers fill
// ceil(n/G) groups in layer order, the last one padded. Full attention
// comes first, then windows in increasing order. A model whose layers all
// share one window gets Single's one group.
func Grouped(windows []int) []Group {
	byWin := map[int][]int{}
	for i, w := range windows {
		w = max(w, 0)
		byWin[w] = append(byWin[w], i)
	}
	if len(byWin) <= 1 {
		return Single(windows)
	}
	wins := make([]int, 0, len(byWin))
	lo, hi := len(windows), 0
	for w, ls := range byWin {
		wins = append(wins, w)
		lo, hi = min(lo, len(ls)), max(hi, len(ls))
	}
	slices.SortFunc(wins, cmp.Compare)
	size := lo
	if float64(hi) < 1.25*float64(lo) {
		size = hi
	}
	var groups []Group
	for _, w := range wins {
		ls := byWin[w]
		for i := 0; i < len(ls); i += size {
			groups = append(groups, Group{Window: w, Layers: ls[i:min(i+size, len(ls))]})
		}
	}
	return groups
}

// PageLayers returns the number of layer slots a page needs for groups: the
// size of the largest group.
func PageLayers(groups []Group) int {
	n := 0
	for _, g := range groups {
		n = max(n, len(g.Layers))
	}
	return n
}

// LayerSlot is where a model layer's KV sits: its group (which block table
// addresses it) and its layer slot within the group's pages.
type LayerSlot struct{ Group, Slot int }

// LayerSlots returns the slot of each of n model layers in groups. Every
// layer must be in exactly one group (Single and Grouped guarantee it).
func LayerSlots(groups []Group, n int) []LayerSlot {
	out := make([]LayerSlot, n)
	for g, gr := range groups {
		for j, li := range gr.Layers {
			out[li] = LayerSlot{Group: g, Slot: j}
		}
	}
	return out
}

// Windows returns the window of each group, in order (nil for one
// full-attention group): what a scheduler needs to know of them.
func Windows(groups []Group) []int {
	if len(groups) == 1 && groups[0].Window == 0 {
		return nil
	}
	w := make([]int, len(groups))
	for i, g := range groups {
		w[i] = g.Window
	}
	return w
}

// NullBlock is the block table entry of a block a sliding-window group
// freed (or never allocated) because its window has moved past it: the
// model never reads it (vLLM's null block).
const NullBlock int32 = -1

// SeqBlocks is the most blocks one sequence of tokens tokens holds at once
// in a pool of groups with windows (Windows; nil: one full-attention group)
// and blockSize-token blocks, computing at most batch tokens a step: a
// full-attention group's table covers every token, a sliding-window
// group's at most its window, a key chunk and a step's tokens. It is what
// sizing and the scheduler count per token instead of every layer's block.
func SeqBlocks(windows []int, blockSize, tokens, batch int) int {
	all := (tokens + blockSize - 1) / blockSize
	if windows == nil {
		return all
	}
	n := 0
	for _, w := range windows {
		if w > 0 {
			n += min(all, (w+KeyChunk+batch+blockSize-1)/blockSize+1)
		} else {
			n += all
		}
	}
	return n
}
