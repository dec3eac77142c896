// Package launch runs Tandem's disaggregated setup on one machine, the engine of
// `tandem up`: N prefill and M decode engines, each a separate process of
// the tandem binary on its own share of the cores, and the proxy in front of
// them.
//
// The proxy runs inside the up process rather than as another child: it is
// I/O-bound and light, the supervisor then sees its errors directly instead
// of through a log, and there is one process fewer to start, watch and stop.
// The engines are processes so that each owns its cores, its memory and its
// fate. Run supervises them: one that exits while serving is logged (which,
// exit status or signal, restart count) and started again with the same
// command line, so on the same ports (the proxy's backend URLs stay valid)
// and cores, after a doubling backoff (RestartPolicy). Meanwhile the proxy
// routes around it, and has its backends checked at once when an engine
// exits and when it is healthy again. An engine that keeps exiting (more
// restarts within a window than the policy allows) stops the whole setup
// with an error naming it, with its last log lines, rather than leaving a
// half-working one. The proxy runs in the up process, so it is not
// restarted: if it stops serving, Run stops the engines and returns its
// error. Exits after Run began stopping (SIGTERM's drain) are not crashes.
//
// Start is the one way Tandem starts a child process: `tandem up`'s
// engines, and the engines and proxies of the benchmark experiments and the
// soak (internal/bench/experiment). It pins the child, sends its output to a
// log file or to prefixed lines, has the kernel kill it if the parent dies
// (Pdeathsig), and reaps it; WaitHealthy and Stop wait for and end a group.
//
// Cores are split between engines (SplitCores) and pinned at process
// creation: the child is forked from a thread whose CPU affinity was
// narrowed for that moment, so every thread of the child inherits the mask
// from its first instruction. Setting the affinity of the child's pid after
// Start would race with the Go runtime of the child, which creates threads
// right away; those would keep the full mask.
package launch
