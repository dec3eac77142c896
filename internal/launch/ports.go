package launch

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePorts returns n distinct TCP ports that were free on host a moment
// ago. All n listeners are held open together, so the ports differ from one
// another. They are taken below the kernel's ephemeral range where it leaves
// room, because the ports of outgoing connections come from that range: a
// port picked there and released before the engine binds it is often taken
// by some connection in the meantime once hundreds of engines start (a port
// clash seen in the 200-engine test). Another listener may still take one,
// in which case that engine fails to start and says so.
func FreePorts(host string, n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	lo, hi := belowEphemeral()
	for tries := 0; len(ports) < n && hi-lo >= 4*n && tries < 8*n+64; tries++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(lo+rand.IntN(hi-lo))))
		if err != nil {
			continue // in use
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for len(ports) < n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// belowEphemeral is the port range [lo, hi) that FreePorts prefers: from
// 20000 up to the start of the ephemeral range (Linux's
// ip_local_port_range; 32768 when it cannot be read), or empty when the
// ephemeral range starts lower.
func belowEphemeral() (lo, hi int) {
	lo, hi = 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	if hi < lo {
		return 0, 0
	}
	return lo, hi
}
