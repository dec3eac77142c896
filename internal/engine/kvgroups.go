package engine

import "github.com/tandem-serve/tandem/internal/kvlayout"

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

// kvGroups decides the pool's KV-cache groups: hybrid (by attention type)
// when the model can and has layers of more than one kind or sliding-window
// layers, unless the configuration disables it (the engines of a P/D pair
// must agree: the side channel's handshake compares their layouts). It sets *layout to the groups' page layout and
// returns the groups' windows for the scheduler (nil: one full-attention
// group, today's layout).
func kvGroups(cfg Config, layout *kvlayout.Layout) []int {
	g, ok := cfg.Model.(KVGrouper)
	if !ok || cfg.DisableHybridKVCache {
		return nil
	}
	windows := kvlayout.Windows(g.KVGroups(true))
	if windows == nil {
		return nil
	}
	*layout = g.GroupedKVLayout(layout.BlockSize, layout.DType)
	return windows
}

// KVGroupWindows returns the attention window of each of the pool's
// KV-cache groups (0: full attention), nil for one full-attention group: a
// KV connector sends and pulls one block list per group, a sliding-window
// group's clipped to its window.
func (e *Engine) KVGroupWindows() []int { return e.sched.Config().GroupWindows }
