//go:build !amd64

package tensor

// archKernelSets returns no assembly kernels: only amd64 has them.
func archKernelSets() []*kernelSet { return nil }

func prefetch(p uintptr, ld, rows, lines int) {}
