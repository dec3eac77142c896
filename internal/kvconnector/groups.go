package kvconnector

import (
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// KV-cache groups in P/D (vLLM's hybrid KV cache with its NIXL connector):
// remote_block_ids lists one block list per group of the engines' pools
// (engine.Engine.KVGroupWindows). A full-attention group sends the blocks
// of every token; a sliding-window group only its in-window tail
// (get_exchange_clipped_blocks): the blocks from the one holding what the
// window reads from the last token on (the receiver recomputes the
// prompt's last token, or continues from the conversation's last one).
// The side channel moves blocks, not groups: a hold, a grant's signature
// and a pull cover the groups' lists concatenated in group order.

// window is the attention window of group g of windows (0: full).
func window(windows []int, g int) int {
	if g < len(windows) {
		return windows[g]
	}
	return 0
}

// numGroups is the number of KV-cache groups windows describes.
func numGroups(windows []int) int { return max(len(windows), 1) }

// clipStart is the index of the first block of a group with window w that
// the exchange of the KV of n tokens sends.
func clipStart(w, n, blockSize int) int { return kvlayout.FirstNeeded(w, max(n-1, 0)) / blockSize }

// exchangeBlocks returns, per group, the blocks of tables that the exchange
// of the KV of the first n tokens sends: blocks [clipStart, blocksFor(n)).
// It reports false when a table lacks one of them (too short, or null).
func exchangeBlocks(tables [][]int32, windows []int, n, blockSize int) ([][]int, bool) {
	nb := (n + blockSize - 1) / blockSize
	if len(tables) != numGroups(windows) {
		return nil, false
	}
	out := make([][]int, len(tables))
	for g, t := range tables {
		first := clipStart(window(windows, g), n, blockSize)
		if len(t) < nb {
			return nil, false
		}
		ids := make([]int, 0, nb-first)
		for _, b := range t[first:nb] {
			if b == kvlayout.NullBlock {
				return nil, false
			}
			ids = append(ids, int(b))
		}
		out[g] = ids
	}
	return out, true
}

// flatten concatenates per-group block lists in group order: what a hold,
// a grant and a pull cover.
func flatten(groups [][]int) []int {
	if len(groups) == 1 {
		return groups[0]
	}
	var out []int
	for _, ids := range groups {
		out = append(out, ids...)
	}
	return out
}

// pullPairs returns the remote blocks (of the groups' lists groups, for KV
// of numTokens tokens) and the local blocks (of tables) that a load of
// blocks [first, last) needs: every group's non-null local entries, each
// paired with the remote block at the same position. It reports false when
// the remote lists lack a block a local entry needs.
func pullPairs(groups [][]int, tables [][]int32, numTokens, blockSize, first, last int) (remote []int, local []int32, ok bool) {
	if len(groups) != len(tables) {
		return nil, nil, false
	}
	nb := (numTokens + blockSize - 1) / blockSize
	for g, t := range tables {
		off := nb - len(groups[g]) // the block the list starts at
		for j := first; j < last; j++ {
			if j >= len(t) {
				return nil, nil, false
			}
			if t[j] == kvlayout.NullBlock {
				continue
			}
			ri := j - off
			if ri < 0 || ri >= len(groups[g]) {
				return nil, nil, false
			}
			remote = append(remote, groups[g][ri])
			local = append(local, t[j])
		}
	}
	return remote, local, true
}
