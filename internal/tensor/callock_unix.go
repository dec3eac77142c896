//go:build unix

package tensor

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockCalibration takes an exclusive lock on dir's calibration lock file,
// so that engines starting together on one machine measure once and share
// the result instead of racing to (possibly different) choices. It returns
// the unlock; a lock that cannot be taken is skipped (best effort).
func lockCalibration(dir string) func() {
	if os.MkdirAll(dir, 0o755) != nil {
		return func() {}
	}
	f, err := os.OpenFile(filepath.Join(dir, "kernels.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return func() {}
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX) != nil {
		_ = f.Close()
		return func() {}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}
}
