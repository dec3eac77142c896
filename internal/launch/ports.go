package launch

import (
	"fmt"
	"net"
)

// FreePorts returns n distinct TCP ports that were free on host a moment
// ago. All n listeners are held open together, so the ports differ from one
// another; another process may still take one between this call and the
// engine binding it, in which case that engine fails to start and says so.
func FreePorts(host string, n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
