//go:build !unix

package proxy

import "time"

// processCPU is unknown here: 0, and the benchmarks report no CPU time.
func processCPU() time.Duration { return 0 }
