//go:build !amd64 && !arm64

package tensor

// archKernelSets returns no assembly kernels: only amd64 has them.
func archKernelSets() []*kernelSet { return nil }

// archQuantKernels returns no assembly quantized kernels: only amd64 has
// them.
func archQuantKernels() []quantKernel { return nil }

func prefetch(p uintptr, ld, rows, lines int) {}
