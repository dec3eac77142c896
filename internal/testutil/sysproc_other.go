//go:build !linux

package testutil

import "syscall"

// sysProcAttr has no parent-death signal off Linux: the test's cleanup
// ends the server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
