// Package soak is the engine-independent half of `tandem bench soak`:
// bounded load for a fixed time with faults injected on a schedule, and the
// invariants checked after it — no request hung, no KV block still held
// once the load has drained, no engine's memory growing.
//
// The package never starts or signals a process itself: the caller gives
// Run an Inject function for the faults and a Sample function for memory,
// so the schedule, the error classification, the /metrics parsing and the
// verdict are plain functions tested on their own (experiment.RunSoak, in
// internal/bench/experiment, owns the processes).
package soak
