//go:build !unix

package sample

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
