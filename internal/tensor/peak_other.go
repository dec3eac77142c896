//go:build !amd64

package tensor

// peakKernels has no loops: only amd64 has the assembly peak kernels, so
// no Peak is Available and the peaks are not measured.
var peakKernels [numPeaks]peakKernel
