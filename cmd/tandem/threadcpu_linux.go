package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time the calling OS thread has used (the
// caller locks its goroutine to the thread), from
// CLOCK_THREAD_CPUTIME_ID: to the nanosecond, where getrusage's
// RUSAGE_THREAD counts in scheduler ticks on some kernels (4 ms on the
// AMD EPYC VM of docs/performance.md, which made a 1-thread `tandem bench
// model` report rates on a grid of ticks and an infinite FMA peak).
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
