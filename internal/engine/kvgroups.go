package engine

import (
	"fmt"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// KVGrouper is implemented by a Forwarder that can lay its KV pool out in
// hybrid KV-cache groups (*model.Model): layers grouped by attention type,
// a block holding one group's layers, so that a sliding-window group keeps
// only the blocks its window sees.
type KVGrouper interface {
	// KVGroups returns the model's KV-cache groups, by attention type with
	// hybrid, else one group of every layer.
	KVGroups(hybrid bool) []kvlayout.Group
	// GroupedKVLayout is KVLayoutOf for a pool of KVGroups(true).
	GroupedKVLayout(blockSize int, dt kvlayout.ElemType) kvlayout.Layout
}

// PoolLayout returns the layout of the KV pool an engine of model m with
// blockSize-token blocks (0: kvcache.DefaultBlockSize) and KV element type
// kvDType (--kv-cache-dtype) makes, and the windows of its KV-cache groups
// (nil: one full-attention group, every layer in every block). The groups
// are hybrid (by attention type: a sliding-window group keeps only its
// window's blocks) when m can group them and has sliding-window layers,
// unless disableHybrid; the engines of a P/D pair must agree (the side
// channel's handshake compares their layouts).
func PoolLayout(m Forwarder, blockSize int, kvDType string, disableHybrid bool) (kvlayout.Layout, []int, error) {
	if blockSize == 0 {
		blockSize = kvcache.DefaultBlockSize
	}
	layout := m.KVLayout(blockSize)
	if dt, set, err := kvlayout.ParseElemType(kvDType); err != nil {
		return layout, nil, fmt.Errorf("engine: %w", err)
	} else if set {
		layout = m.KVLayoutOf(blockSize, dt)
	}
	g, ok := m.(KVGrouper)
	if !ok || disableHybrid {
		return layout, nil, nil
	}
	windows := kvlayout.Windows(g.KVGroups(true))
	if windows == nil {
		return layout, nil, nil
	}
	return g.GroupedKVLayout(layout.BlockSize, layout.DType), windows, nil
}

// KVGroupWindows returns the attention window of each of the pool's
// KV-cache groups (0: full attention), nil for one full-attention group: a
// KV connector sends and pulls one block list per group, a sliding-window
// group's clipped to its window.
func (e *Engine) KVGroupWindows() []int { return e.sched.Config().GroupWindows }
