// Package testhosts makes network namespaces that stand for separate hosts in
// tests: each host has its own network stack and a non-loopback address on a
// bridge in the test's own namespace, so engines started in them are reached
// (and reach each other) across a real interface, as pods on different nodes
// are. It needs root and iproute2 (`ip`); without them a test is skipped, or
// fails under TANDEM_REQUIRE_TESTDATA=1 (CI runs as root).
//
// Addresses come from 198.18.0.0/15, the range set aside for benchmarking
// network devices (RFC 2544): no real host of anyone's is there, and the
// traffic never leaves this machine. Names carry the test process's pid, so
// two test binaries running at once do not collide, and namespaces left by a
// killed run are removed by the next one.
package testhosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// prefix starts the name of every namespace and link this package makes.
const prefix = "tdmt"

// Net is a bridge in the test's namespace with hosts attached to it.
type Net struct {
	// Gateway is the bridge's address: how a host reaches processes of the
	// test's own namespace (which listen on 0.0.0.0 or on this address).
	Gateway string
	bridge  string
	subnet  string // first three octets, "198.18.X"
	tag     string
	hosts   []*Host
}

// Host is one network namespace with one address on the Net.
type Host struct {
	// Name is the namespace's name (ip netns).
	Name string
	// IP is the host's address on the Net.
	IP   string
	veth string
}

// New makes a bridge with n hosts and removes them when the test ends. It
// skips the test (or fails it under TANDEM_REQUIRE_TESTDATA=1) when network
// namespaces cannot be made here.
func New(t testing.TB, n int) *Net {
	t.Helper()
	if n < 1 || n > 200 {
		t.Fatalf("testhosts.New: %d hosts: want 1..200", n)
	}
	if err := usable(); err != nil {
		testutil.Missing(t, "network namespaces: "+err.Error())
	}
	removeStale()
	pid := os.Getpid()
	// One subnet per test process and Net: the third octet from the pid and
	// a counter, so parallel test binaries do not share routes.
	seq := nextSeq()
	nt := &Net{
		tag:    fmt.Sprintf("%d%c", pid, 'a'+rune(seq%26)),
		subnet: fmt.Sprintf("198.18.%d", (pid*7+seq)%250+1),
	}
	nt.bridge = prefix + "b" + nt.tag
	nt.Gateway = nt.subnet + ".1"
	if len(nt.bridge) > 15 {
		t.Fatalf("testhosts: link name %q is too long", nt.bridge)
	}
	t.Cleanup(nt.remove)
	if err := run("link", "add", nt.bridge, "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	if err := run("addr", "add", nt.Gateway+"/24", "dev", nt.bridge); err != nil {
		t.Fatal(err)
	}
	if err := run("link", "set", nt.bridge, "up"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h := &Host{
			Name: fmt.Sprintf("%s-%s-%d", prefix, nt.tag, i),
			IP:   fmt.Sprintf("%s.%d", nt.subnet, i+2),
			veth: fmt.Sprintf("%sv%s%d", prefix, nt.tag, i),
		}
		if len(h.veth) > 15 {
			h.veth = fmt.Sprintf("%s%x", prefix, pid*256+seq*64+i)
		}
		nt.hosts = append(nt.hosts, h)
		steps := [][]string{
			{"netns", "add", h.Name},
			{"link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.Name},
			{"link", "set", h.veth, "master", nt.bridge, "up"},
			{"-n", h.Name, "addr", "add", h.IP + "/24", "dev", "eth0"},
			{"-n", h.Name, "link", "set", "eth0", "up"},
			{"-n", h.Name, "link", "set", "lo", "up"},
			{"-n", h.Name, "route", "add", "default", "via", nt.Gateway},
		}
		for _, s := range steps {
			if err := run(s...); err != nil {
				t.Fatal(err)
			}
		}
	}
	return nt
}

// Hosts returns the Net's hosts in the order they were made.
func (nt *Net) Hosts() []*Host { return nt.hosts }

// Command returns a command that runs name with args inside the host's
// namespace. It dies with the test process (SIGKILL on the parent's death).
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// WaitReachable waits until a TCP connection from the test's namespace to
// addr (host:port on the Net) succeeds: a fresh bridge port takes a moment
// to forward.
func WaitReachable(ctx context.Context, addr string) error {
	var last error
	for {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not reachable: %w", addr, last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (nt *Net) remove() {
	for _, h := range nt.hosts {
		killIn(h.Name)
		_ = run("netns", "del", h.Name) // takes its end of the veth with it
	}
	_ = run("link", "del", nt.bridge)
}

var seqCounter int

func nextSeq() int { seqCounter++; return seqCounter }

// usable reports why network namespaces cannot be made here, if they cannot.
func usable() error {
	if os.Geteuid() != 0 {
		return errors.New("need root to make network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("need iproute2's ip command")
	}
	probe := fmt.Sprintf("%s-probe-%d", prefix, os.Getpid())
	if err := run("netns", "add", probe); err != nil {
		return err
	}
	return run("netns", "del", probe)
}

// removeStale deletes namespaces and bridges of earlier test processes that
// no longer run (a killed test leaves them behind).
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if pid, ok := ownerPID(name); ok && !alive(pid) {
			killIn(name)
			_ = run("netns", "del", name)
		}
	}
	out, err = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	if err != nil {
		return
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if !strings.HasPrefix(name, prefix+"b") {
			continue
		}
		digits := strings.TrimRight(strings.TrimPrefix(name, prefix+"b"), "abcdefghijklmnopqrstuvwxyz")
		if pid, err := strconv.Atoi(digits); err == nil && !alive(pid) {
			_ = run("link", "del", name)
		}
	}
}

// ownerPID parses the pid out of a host namespace name "tdmt-<pid><c>-<i>".
func ownerPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	tag, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(strings.TrimRight(tag, "abcdefghijklmnopqrstuvwxyz"))
	return pid, err == nil
}

func alive(pid int) bool {
	return pid == os.Getpid() || syscall.Kill(pid, 0) == nil
}

// killIn kills every process left in a namespace, so deleting it frees its
// addresses at once.
func killIn(name string) {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for f := range strings.FieldsSeq(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func run(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
