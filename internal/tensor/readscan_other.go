//go:build !amd64

package tensor

// readScanAsm is nil: only amd64 has the assembly scan.
var readScanAsm []func(x *byte, ld, n, pf int) uint64
