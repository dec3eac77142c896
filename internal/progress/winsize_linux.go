package progress

import (
	"os"
	"syscall"
	"unsafe"
)

// winsize asks the terminal behind f for its columns (TIOCGWINSZ); ok is
// false when f is no terminal.
func winsize(f *os.File) (cols int, ok bool) {
	var ws struct{ Row, Col, X, Y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	return int(ws.Col), errno == 0
}
