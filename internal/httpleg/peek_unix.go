//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package httpleg

import (
	"net"
	"syscall"
)

// peerClosed reports whether an idle connection is unusable: the server
// closed (or reset) it, or sent bytes no request asked for. It peeks
// without blocking; a connection it cannot inspect counts as usable.
func peerClosed(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var perr error
	if err := rc.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	}); err != nil {
		return true
	}
	if perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK || perr == syscall.EINTR {
		return false
	}
	// A read of 0 bytes is the server's FIN, of 1 unsolicited bytes; or an
	// error.
	return true
}
