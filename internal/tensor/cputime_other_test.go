//go:build !linux

package tensor

import "time"

// threadCPU is not available here.
func threadCPU() (time.Duration, bool) { return 0, false }
