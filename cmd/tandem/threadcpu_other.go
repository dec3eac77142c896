//go:build !linux

package main

import "time"

// threadCPU reports that this OS gives no per-thread CPU time here.
func threadCPU() (time.Duration, bool) { return 0, false }
