package promtest

import "syscall"

// sysProcAttr makes the server die with the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
