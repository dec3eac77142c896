package planner

// The engines the split divides and its bounds: set from outside
// (SetSplit, SetEngines, SetPinned) and kept within them (bounded, clamp).

// SetSplit makes the current split prefill of n engines, as the pools are
// when something other than the planner set them (discovery delivered them
// at start), within the bounds. It is not a change: the dwell does not
// restart.
func (pl *Planner) SetSplit(prefill, n int) {
	pl.prefill = prefill
	pl.SetEngines(n)
}

// SetEngines changes how many engines the split divides (an engine came or
// went); the split keeps its prefill count within the bounds.
func (pl *Planner) SetEngines(n int) {
	pl.cfg.Engines = max(n, pl.cfg.MinPrefill+pl.cfg.MinDecode, 2)
	pl.clamp()
}

// SetPinned says how many engines of the prefill and of the decode pool
// cannot move to the other (they serve one role only): the split keeps at
// least that many in each.
func (pl *Planner) SetPinned(prefill, decode int) {
	pl.pinPrefill, pl.pinDecode = prefill, decode
	pl.clamp()
}

// bounded is the configuration with the split's bounds raised to the
// pinned engines.
func (pl *Planner) bounded() Config {
	c := pl.cfg
	c.MinPrefill, c.MinDecode = max(c.MinPrefill, pl.pinPrefill), max(c.MinDecode, pl.pinDecode)
	c.MinPrefill = min(c.MinPrefill, c.Engines-c.MinDecode)
	return c
}

// clamp keeps the split within its bounds.
func (pl *Planner) clamp() {
	c := pl.bounded()
	pl.prefill = max(min(pl.prefill, c.Engines-c.MinDecode), c.MinPrefill)
}
