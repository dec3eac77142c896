// Package planner sizes the prefill and decode pools from the objectives.
// Given TTFT and TPOT SLOs and the traffic a router sees, it chooses the
// P:D split of the engines (the colocated split, no prefill engine and
// every engine prefilling its own prompts, among them), the conditional
// decider's threshold (the uncached prompt length from which a prompt is
// prefilled remotely) and a prefill cadence for engines that prefill
// beside their decodes (`tandem serve --prefill-schedule-interval`).
//
// It fits the same capacity model `tandem bench report` fits to a saved
// run (model.go: DistServe-style, simplified; internal/bench's PDModel
// calls these functions), but online: from a sliding window of the
// requests the router routed and the engines' scraped costs, refitted at
// every decision. A prefill is priced by a curve, a + b·n + c·n² seconds
// for n tokens, fitted to the measured prefills (ObservePrefill;
// prefillcurve.go), a decode step by a concave curve in its batch with a
// prior for when the batches seen span too little (decodecurve.go). A
// split is valued by the requests' attainment of both objectives
// together, a remote prompt's TTFT counting its decode leg (the wait for
// the decode's step under way and its first step). A decode's capacity
// counts what its own prefills cost
// it (capacity.go, stalls.go): their share of its time stretches its
// steps, they queue for their first token, and the streams running beside
// them miss the TPOT objective when the stalls they wait through exceed
// their slack. Arrivals seen in bursts (burst.go) bound a decode's batch
// and the local prefills its streams wait through by its share of a
// burst: a burst's requests do not arrive for as long as its streams
// live. When the traffic mix shifts (shift.go), the model is fitted
// to the requests since the shift rather than to a window that still holds
// the old mix.
//
// Like the scheduler, the planner is a pure state machine in the manner of
// etcd's raft: it never reads a clock, touches the network or starts a
// goroutine. The caller feeds it observations (ObserveRequest,
// ObserveEngine) with their times and asks for a decision (Decide(now));
// acting on the decision (moving engines between pools, scaling
// Deployments) is the caller's. Decisions are guarded against flapping: a
// new split must beat the current one's predicted goodput by a margin
// (Config.Hysteresis), at least Config.MinDwell must have passed since the
// last change when the split turns back (Config.StepDwell when it goes on
// in the same direction), and a change moves one engine at a time (half
// the way to the best right after a shift of the traffic mix, or, where
// the step is predicted worse than now, straight to the best). Nor does
// it move again before the last change is measured (settle.go): most of
// the requests a decision is fitted to must have been routed since that
// change took effect (the caller may say when: Applied), and every engine
// scraped since; only after a shift of the traffic mix does a move the
// model predicts far ahead go at once. A move
// must also lead where the decode fit's residual is taken as the scrapes'
// noise rather than the steps' spread, and with the fit's slope turned
// within its standard error (uncertain.go): a noisy early fit does not
// send the split toward the most decodes. Nor may it run the decodes at
// more than twice the largest batch their step was measured at
// (trust.go): an early fit from small batches does not send the split
// to one decode at many times them.
// The threshold is chosen for the split that runs after the decision (a
// threshold fitted to the best split would not suit the one running) and
// has a hysteresis and dwell of its own (threshold.go). Engine samples
// older than Config.MaxAge are ignored, and a decision with
// too few fresh samples holds the current split and says why.
package planner
