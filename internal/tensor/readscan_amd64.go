package tensor

import "golang.org/x/sys/cpu"

// readScanAsm are ReadScan's assembly loops, one per entry of
// ReadScanStreams, where the CPU has AVX2; else nil.
var readScanAsm = func() []func(x *byte, ld, n, pf int) uint64 {
	if cpu.X86.HasAVX2 && cpu.X86.HasOSXSAVE {
		return []func(x *byte, ld, n, pf int) uint64{readScan1AVX2, readScan2AVX2, readScan4AVX2, readScan8AVX2}
	}
	return nil
}()
