package main

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling OS thread has used (the
// caller locks its goroutine to the thread).
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	const rusageThread = 1
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
