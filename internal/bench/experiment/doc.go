// Package experiment runs the benchmark experiments that start their own
// servers: `tandem bench experiment pd` (RunPD: P/D against a colocated
// engine on this machine, and the P:D model fitted to it), `tandem bench
// experiment ratio` (RunRatio: the P:D model checked on clusters of
// simulated engines) and `tandem bench soak` (RunSoak: load with faults
// injected, then the invariants).
//
// Each driver starts its engines and proxies as processes through
// internal/launch (pinned to cores, their logs in OUT/logs), runs workloads
// against them with package bench, stops them, and writes its report to
// the configured writer and to OUT. The commands in cmd/tandem parse the
// flags into a config and call one driver.
package experiment
