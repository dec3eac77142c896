package launch

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := FreePorts("127.0.0.1", 300)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := belowEphemeral()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d twice", p)
		}
		seen[p] = true
		if hi > lo && (p < lo || p >= hi) {
			t.Errorf("port %d outside [%d, %d)", p, lo, hi)
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])))
	if err != nil {
		t.Fatalf("a returned port cannot be bound: %v", err)
	}
	ln.Close()
}
