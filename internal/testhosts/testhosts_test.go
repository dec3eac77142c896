package testhosts

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestHelperServer is not a test: re-executed inside a namespace with
// TESTHOSTS_SERVE set, it serves HTTP on that address and answers with the
// address it was reached at and the peer's, so the test sees both ends.
func TestHelperServer(t *testing.T) {
	addr := os.Getenv("TESTHOSTS_SERVE")
	if addr == "" {
		t.Skip("helper process only")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s from %s", r.Host, r.RemoteAddr)
	}))
}

func startServer(t *testing.T, h *Host, addr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := h.Command(ctx, os.Args[0], "-test.run=^TestHelperServer$")
	cmd.Env = append(os.Environ(), "TESTHOSTS_SERVE="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("helper server in %s: %q %v", h.Name, line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHostsAreSeparateMachinesOnOneBridge(t *testing.T) {
	nt := New(t, 2)
	a, b := nt.Hosts()[0], nt.Hosts()[1]
	if a.IP == b.IP || a.Name == b.Name || net.ParseIP(a.IP).IsLoopback() {
		t.Fatalf("hosts %+v and %+v", a, b)
	}
	startServer(t, a, "0.0.0.0:8080")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitReachable(ctx, a.IP+":8080"); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 5 * time.Second}

	t.Run("the test's namespace reaches a host over the bridge, from the gateway address", func(t *testing.T) {
		got := get(t, c, "http://"+a.IP+":8080/")
		if !strings.HasPrefix(got, a.IP+":8080 from "+nt.Gateway+":") {
			t.Fatalf("answer %q", got)
		}
	})
	t.Run("one host reaches another by its address, and is seen from its own", func(t *testing.T) {
		cmd := b.Command(ctx, os.Args[0], "-test.run=^TestHelperClient$")
		cmd.Env = append(os.Environ(), "TESTHOSTS_GET=http://"+a.IP+":8080/")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if !strings.Contains(string(out), a.IP+":8080 from "+b.IP+":") {
			t.Fatalf("answer %q", out)
		}
	})
}

// TestHelperClient is not a test: re-executed inside a namespace with
// TESTHOSTS_GET set, it fetches that URL and prints the answer.
func TestHelperClient(t *testing.T) {
	url := os.Getenv("TESTHOSTS_GET")
	if url == "" {
		t.Skip("helper process only")
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(string(b))
}

func TestStaleNamesParse(t *testing.T) {
	for name, want := range map[string]int{"tdmt-1234a-0": 1234, "tdmt-99z-12": 99} {
		if pid, ok := ownerPID(name); !ok || pid != want {
			t.Errorf("ownerPID(%q) = %d, %v; want %d", name, pid, ok, want)
		}
	}
	for _, name := range []string{"tdmt-probe-5", "other-12a-0", "tdmt"} {
		if _, ok := ownerPID(name); ok {
			t.Errorf("ownerPID(%q) claimed a pid", name)
		}
	}
}
