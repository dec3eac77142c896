package tensor

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time the calling OS thread has used (lock the
// goroutine to its thread first). On a machine shared with other work,
// single-threaded benchmarks divided by it measure the kernel, not the
// scheduler. CLOCK_THREAD_CPUTIME_ID counts nanoseconds, where getrusage's
// RUSAGE_THREAD counts scheduler ticks on some kernels.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
