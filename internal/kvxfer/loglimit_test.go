package kvxfer

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestLogLimiter: one line per address per interval, each saying how many
// were left out before it; addresses past the table's size share one
// budget, and forgetting an address loses none of its count.
func TestLogLimiter(t *testing.T) {
	clk := testutil.NewFakeClock(time.Unix(1000, 0))
	l := newLogLimiter(10*time.Second, 2, clk)
	check := func(addr string, wantOK bool, wantSuppressed int, wantShared bool) {
		t.Helper()
		ok, n, shared := l.allow(addr)
		if ok != wantOK || n != wantSuppressed || shared != wantShared {
			t.Errorf("allow(%q) = %v, %d, %v; want %v, %d, %v", addr, ok, n, shared, wantOK, wantSuppressed, wantShared)
		}
	}
	check("10.0.0.1", true, 0, false)
	for range 5 {
		check("10.0.0.1", false, 0, false)
	}
	check("10.0.0.2", true, 0, false) // another address has its own budget
	clk.Advance(9 * time.Second)
	check("10.0.0.1", false, 0, false)
	clk.Advance(time.Second)
	check("10.0.0.1", true, 6, false) // the interval is over: the count comes with the line
	check("10.0.0.1", false, 0, false)
	check("10.0.0.2", true, 0, false)
	// The table holds two addresses, both logged within the interval: a
	// third shares the budget of all others.
	check("10.0.0.3", true, 0, true)
	check("10.0.0.4", false, 0, true)
	check("10.0.0.3", false, 0, true)
	// An interval later the old entries are forgotten to make room, and
	// 10.0.0.1's pending count moves to the shared entry rather than
	// getting lost.
	clk.Advance(10 * time.Second)
	check("10.0.0.5", true, 0, false)
	check("10.0.0.6", true, 0, false)
	check("10.0.0.7", true, 1+2, true) // 10.0.0.1's one and the shared entry's two
	if len(l.addrs) > 2 {
		t.Errorf("%d addresses tracked, want at most 2", len(l.addrs))
	}
}

// lockedBuffer is a log destination for several goroutines.
type lockedBuffer struct{ testutil.SyncBuffer }

// count is how many times s occurs in the log.
func (b *lockedBuffer) count(s string) int { return strings.Count(b.String(), s) }

// lines are the log's lines that contain s.
func (b *lockedBuffer) lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(b.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// TestRefusedConnectionsCannotFloodTheLog: a producer's log gets one line
// per source address per 10 s about connections refused by --kv-peers,
// and one about failed handshakes, however many such connections arrive;
// the next line says how many were left out.
func TestRefusedConnectionsCannotFloodTheLog(t *testing.T) {
	clk := testutil.NewFakeClock(time.Now())
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	// waitClosed reads c until the producer closes it.
	// (EOF, or a reset when it closed with bytes unread).
	waitClosed := func(t *testing.T, c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connection not closed by the producer: %v", err)
		}
		c.Close()
	}
	// waitLines waits for the producer to have logged n lines containing
	// msg (the handshake's line is logged after the close).
	waitLines := func(t *testing.T, msg string, n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for logs.count(msg) < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // a line too many would show now
		if got := logs.count(msg); got != n {
			t.Fatalf("%d lines %q, want %d:\n%s", got, msg, n, strings.Join(logs.lines(msg), "\n"))
		}
	}

	t.Run("refused by --kv-peers", func(t *testing.T) {
		const msg = "its address is not in --kv-peers"
		peers, err := ParsePeers("10.0.0.0/8")
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, rigOpts{prodMut: func(pc *ProducerConfig) { pc.Peers, pc.Logger, pc.Clock = peers, logger, clk }})
		dial := func() {
			c, err := net.Dial("tcp", r.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			waitClosed(t, c)
		}
		for range 50 {
			dial()
		}
		waitLines(t, msg, 1)
		clk.Advance(refusalLogInterval)
		dial()
		waitLines(t, msg, 2)
		if last := logs.lines(msg)[1]; !strings.Contains(last, "suppressed=49") {
			t.Errorf("the second line does not count the 49 left out: %s", last)
		}
	})

	t.Run("failed handshakes", func(t *testing.T) {
		const msg = "failed its handshake"
		r := newRig(t, rigOpts{prodMut: func(pc *ProducerConfig) { pc.Logger, pc.Clock = logger, clk }})
		garbage := func(i int) {
			c, err := net.Dial("tcp", r.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: prefill\r\n\r\n", i) // bad magic, at once
			waitClosed(t, c)
		}
		for i := range 30 {
			garbage(i)
		}
		waitLines(t, msg, 1)
		clk.Advance(refusalLogInterval)
		garbage(30)
		waitLines(t, msg, 2)
		if last := logs.lines(msg)[1]; !strings.Contains(last, "suppressed=29") {
			t.Errorf("the second line does not count the 29 left out: %s", last)
		}
		// Real pulls still work, and are not rate-limited by any of this.
		r.hold(t, "real", 1)
		if err := r.cons.Pull(ctxT(t), r.params("real", 1), newLocalBlocks(1, tiny.BlockBytes)); err != nil {
			t.Fatal(err)
		}
	})
}
