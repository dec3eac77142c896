package planner

// SetSplit makes the current split prefill of n engines, as the pools are
// when something other than the planner set them (discovery delivered them
// at start), within the bounds. It is not a change: the dwell does not
// restart.
func (pl *Planner) SetSplit(prefill, n int) {
	pl.prefill = prefill
	pl.SetEngines(n)
}
