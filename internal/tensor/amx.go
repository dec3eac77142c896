package tensor

import (
	"fmt"
	"sync"
)

// AMXSupport is what this CPU and OS offer of Intel's Advanced Matrix
// Extensions (Sapphire Rapids and later). The quantized kernels named
// "amx" multiply each group of 16 activation rows of a quantized product
// with AMX-INT8 (amxqmm_amd64.go), and the kernel set "amxbf16" bf16
// weights with AMX-BF16 (amxbf16_amd64.go), each where the calibration
// measures it faster and its self-check passes.
type AMXSupport struct {
	// Tile, BF16 and Int8 are CPUID leaf 7's AMX-TILE, AMX-BF16 and
	// AMX-INT8 bits.
	Tile, BF16, Int8 bool
	// Permitted reports whether Linux granted this process the tile data
	// state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), without
	// which the first tile instruction faults; PermErr says why not.
	Permitted bool
	PermErr   error
}

// DetectAMX returns this CPU's AMX support, asking Linux for the tile data
// permission (once, for the process) when the CPU has AMX-TILE.
func DetectAMX() AMXSupport { return detectAMX() }

var detectAMX = sync.OnceValue(func() AMXSupport {
	s := amxCPUID()
	if s.Tile {
		s.PermErr = requestAMXPermission()
		s.Permitted = s.PermErr == nil
	}
	return s
})

// String describes the support for the log.
func (s AMXSupport) String() string {
	switch {
	case !s.Tile:
		return "no AMX"
	case !s.Permitted:
		return fmt.Sprintf("AMX-TILE (bf16=%t int8=%t) present but not permitted: %v", s.BF16, s.Int8, s.PermErr)
	default:
		return fmt.Sprintf("AMX-TILE (bf16=%t int8=%t), permitted", s.BF16, s.Int8)
	}
}
