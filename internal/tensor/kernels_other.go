//go:build !amd64

package tensor

// archKernelSets returns no assembly kernels: only amd64 has them.
func archKernelSets() []*kernelSet { return nil }
