package tensor

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling OS thread has used (lock the
// goroutine to its thread first). On a machine shared with other work,
// single-threaded benchmarks divided by it measure the kernel, not the
// scheduler.
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	const rusageThread = 1
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
