//go:build amd64 && linux

package tensor

import (
	"fmt"
	"syscall"
)

// archReqXcompPerm and xfeatureXTileData are Linux's arch_prctl code and
// the extended state component of the AMX tile data
// (arch/x86/include/uapi/asm/prctl.h).
const (
	archReqXcompPerm  = 0x1023
	xfeatureXTileData = 18
)

// requestAMXPermission asks Linux (5.16 and later) to let this process use
// the AMX tile data state.
func requestAMXPermission() error {
	if _, _, errno := syscall.Syscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXTileData, 0); errno != 0 {
		return fmt.Errorf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): %w (needs Linux 5.16 or later)", errno)
	}
	return nil
}
