package planner

import (
	"fmt"
	"slices"
)

// noiseLeads is the lead, in hystereses, from which a move is not
// weighed against the window's noise (withinNoise): a split predicted
// twice the hysteresis ahead moves on the whole window's word. A bursty
// window's halves differ by more than noise (one holds a burst, the other
// its tail), and a colocated split the bursts' queues leave at half the
// goodput of one with a prefill pool was held there by one half's sample.
const noiseLeads = 2

// minHalfRequests is the fewest requests each half of the window must hold
// for withinNoise to weigh it; with fewer the halves are not compared.
const minHalfRequests = 10

// withinNoise says why a move from the current split (valued at threshold
// curTh) to target (at targetTh) is within the window's noise, "" when it
// is not: the model refitted to each half of the window's requests in
// arrival order (the engines' costs as they are) must predict target
// ahead of the current split on both. A short window's requests are a small sample (the P/D
// experiment's planner sees one level, 20–60 requests, in each), and the
// best split's lead over the runner-up swings by more than the hysteresis
// from one window to the next where the two are close: a move on one such
// swing is undone on the next (the planner moved 9–11 times a run between
// 0P:4D and 1P:3D, each within noise of the other). A lead that both
// halves show is one the traffic has held for the whole window (halves
// of every other request, each spanning the window, agree with the whole
// as often as it agrees with itself: they held none of the swings back). Decide
// asks only for a lead under noiseLeads hystereses.
func (pl *Planner) withinNoise(f Fit, cur Split, curTh int, target Split, targetTh int) string {
	win := pl.win
	defer func() { pl.win = win }()
	half := len(win) / 2
	if half < minHalfRequests {
		return ""
	}
	byTime := slices.SortedStableFunc(slices.Values(win), func(a, b Request) int { return a.At.Compare(b.At) })
	for i, h := range [][]Request{byTime[:half], byTime[half:]} {
		pl.win = h
		gc := pl.model(f, curTh).split(cur.P, cur.D).Goodput
		gt := pl.model(f, targetTh).split(target.P, target.D).Goodput
		if gt <= gc {
			return fmt.Sprintf("noise: %dP:%dD is predicted %.2f req/s against %.2f now on the window's %s half of the requests (%.2f against %.2f on all of them)",
				target.P, target.D, gt, gc, [2]string{"first", "second"}[i], target.Goodput, cur.Goodput)
		}
	}
	return ""
}
