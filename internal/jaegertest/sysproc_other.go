//go:build !linux

package jaegertest

import "syscall"

// sysProcAttr has no parent-death signal off Linux: the test's cleanup
// ends Jaeger.
func sysProcAttr() *syscall.SysProcAttr { return nil }
