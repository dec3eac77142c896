//go:build !linux

package kubetest

import "syscall"

// sysProcAttr has no parent-death signal off Linux: Stop (or Main) ends the
// processes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
