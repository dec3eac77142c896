package tensor

import "golang.org/x/sys/cpu"

// amxCPUID reads the AMX feature bits (CPUID leaf 7, EDX 22, 24, 25).
func amxCPUID() AMXSupport {
	return AMXSupport{Tile: cpu.X86.HasAMXTile, BF16: cpu.X86.HasAMXBF16, Int8: cpu.X86.HasAMXInt8}
}
