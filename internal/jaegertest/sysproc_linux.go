package jaegertest

import "syscall"

// sysProcAttr makes Jaeger die with the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
