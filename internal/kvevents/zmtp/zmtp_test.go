package zmtp

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/testutil"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// bytesConn is a Conn that reads in and discards what it writes.
func bytesConn(in []byte, maxFrame int64) *Conn {
	return newConn(nil, bytes.NewReader(in), io.Discard, maxFrame, 0)
}

// encode returns msgs as frames: each message's frames with MORE on all but
// the last.
func encode(msgs ...[][]byte) []byte {
	var buf bytes.Buffer
	z := newConn(nil, bytes.NewReader(nil), &buf, 0, 0)
	for _, m := range msgs {
		z.Write(m...)
	}
	z.Flush()
	return buf.Bytes()
}

func TestReadMsgReadsWhatWriteWrote(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 300) // a long frame (8-byte size)
	msgs := [][][]byte{{[]byte("topic"), {0, 0, 0, 0, 0, 0, 0, 1}, long}, {{}}, {[]byte("x")}}
	z := bytesConn(encode(msgs...), 1<<20)
	for i, want := range msgs {
		got, err := z.ReadMsg(nil)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("message %d (-want +got):\n%s", i, diff)
		}
	}
	if _, err := z.ReadMsg(nil); err != io.EOF {
		t.Errorf("after the last message: %v, want EOF", err)
	}
}

func TestReadMsgRefusesWhatExceedsItsBounds(t *testing.T) {
	tooMany := make([][]byte, MaxParts+1)
	for i := range tooMany {
		tooMany[i] = []byte{1}
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"a frame over maxFrame", encode([][]byte{bytes.Repeat([]byte{1}, 101)})},
		{"a command over MaxCommandSize", append([]byte{flagCommand | flagLong, 0, 0, 0, 0, 0, 1, 0, 1}, make([]byte, 16)...)},
		{"a frame claiming 2^64-1 bytes", []byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"unknown frame flags", []byte{0x08, 0}},
		{"more frames than MaxParts", encode(tooMany)},
		{"a command inside a message", []byte{flagMore, 1, 'a', flagCommand, 5, 4, 'P', 'I', 'N', 'G'}},
		{"a command with a name past its end", []byte{flagCommand, 2, 9, 'x'}},
		{"a truncated frame", []byte{0, 5, 'a', 'b'}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if parts, err := bytesConn(tc.in, 100).ReadMsg(nil); err == nil {
				t.Fatalf("ReadMsg = %q, want an error", parts)
			}
		})
	}
}

func TestReadMsgAnswersPingAndPassesOtherCommands(t *testing.T) {
	var out bytes.Buffer
	in := []byte{flagCommand, 9, 4, 'P', 'I', 'N', 'G', 0, 10, 'c', 'x', flagCommand, 10, 9, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E', 0, 1, 'm'}
	z := newConn(nil, bytes.NewReader(in), &out, 100, 0)
	var cmds []string
	parts, err := z.ReadMsg(func(name string, data []byte) error { cmds = append(cmds, name+":"+string(data)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{[]byte("m")}, parts); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"SUBSCRIBE:"}, cmds); diff != "" {
		t.Errorf("commands passed on (-want +got):\n%s", diff)
	}
	if want := []byte{flagCommand, 7, 4, 'P', 'O', 'N', 'G', 'c', 'x'}; !bytes.Equal(out.Bytes(), want) {
		t.Errorf("wrote %q, want the PONG %q", out.Bytes(), want)
	}
}

func TestParseProps(t *testing.T) {
	p := appendProp(appendProp(nil, "Socket-Type", "PUB"), "Identity", "")
	got, err := parseProps(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"socket-type": "PUB", "identity": ""}, got); diff != "" {
		t.Errorf("props (-want +got):\n%s", diff)
	}
	for _, bad := range [][]byte{{0}, {3, 'a', 'b'}, {1, 'a', 0, 0, 0, 9, 'v'}} {
		if _, err := parseProps(bad); err == nil {
			t.Errorf("parseProps(%q) accepted malformed metadata", bad)
		}
	}
}

// subscribe dials a SUB to s subscribed to everything.
func subscribe(t *testing.T, s *PubSocket) *Conn {
	t.Helper()
	z, err := Dial(context.Background(), s.Addr().String(), SUB, Options{HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	if err := z.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	return z
}

func TestPubSocketRefusesConnectionsPastMaxPeers(t *testing.T) {
	s, err := ListenPub("127.0.0.1:0", Options{MaxPeers: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := subscribe(t, s), subscribe(t, s)
	testutil.WaitFor(t, "two subscribers", 10*time.Second, func() bool { return s.Subscribers() == 2 })

	// The third connection is closed on accept: its handshake fails.
	if z, err := Dial(context.Background(), s.Addr().String(), SUB, Options{HandshakeTimeout: 2 * time.Second}); err == nil {
		z.Close()
		t.Fatal("a third subscriber connected to a socket of MaxPeers 2")
	}
	if got := s.Rejected(); got != 1 {
		t.Errorf("Rejected = %d, want 1", got)
	}

	// The first two keep receiving.
	msg := [][]byte{[]byte("kv@"), []byte("payload")}
	if dropped := s.Publish(msg); dropped != 0 {
		t.Fatalf("Publish dropped %d", dropped)
	}
	for i, z := range []*Conn{a, b} {
		got, err := z.ReadMsg(nil)
		if err != nil {
			t.Fatalf("subscriber %d: %v", i, err)
		}
		if diff := cmp.Diff(msg, got); diff != "" {
			t.Errorf("subscriber %d (-want +got):\n%s", i, diff)
		}
	}

	// A subscriber that leaves frees its slot.
	a.Close()
	testutil.WaitFor(t, "the first subscriber gone", 10*time.Second, func() bool { return s.Subscribers() == 1 })
	testutil.WaitFor(t, "a new subscriber admitted", 10*time.Second, func() bool {
		z, err := Dial(context.Background(), s.Addr().String(), SUB, Options{HandshakeTimeout: 2 * time.Second})
		if err != nil {
			return false
		}
		z.Close()
		return true
	})
}

func TestRouterSocketAnswersOnTheRequestersConnection(t *testing.T) {
	s, err := ListenRouter("127.0.0.1:0", func(msg [][]byte, reply func(...[]byte) error) error {
		for _, f := range msg {
			if err := reply([]byte("echo"), f); err != nil {
				return err
			}
		}
		return nil
	}, Options{MaxPeers: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	z, err := Dial(context.Background(), s.Addr().String(), DEALER, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	if err := z.Write([]byte("a"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := z.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b"} {
		got, err := z.ReadMsg(nil)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([][]byte{[]byte("echo"), []byte(want)}, got); diff != "" {
			t.Errorf("reply (-want +got):\n%s", diff)
		}
	}
	// MaxPeers 1: a second DEALER is refused while the first is connected.
	if z2, err := Dial(context.Background(), s.Addr().String(), DEALER, Options{HandshakeTimeout: 2 * time.Second}); err == nil {
		z2.Close()
		t.Fatal("a second DEALER connected to a ROUTER of MaxPeers 1")
	}
}

func TestHandshakeRefusesIncompatibleSockets(t *testing.T) {
	s, err := ListenRouter("127.0.0.1:0", func([][]byte, func(...[]byte) error) error { return nil }, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if z, err := Dial(context.Background(), s.Addr().String(), SUB, Options{HandshakeTimeout: 2 * time.Second}); err == nil {
		z.Close()
		t.Fatal("a SUB completed a handshake with a ROUTER")
	}
}

func TestDialEndsWithItsContext(t *testing.T) {
	s, err := ListenPub("127.0.0.1:0", Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	z, err := Dial(ctx, s.Addr().String(), SUB, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	cancel()
	if _, err := z.ReadMsg(nil); err == nil {
		t.Fatal("ReadMsg returned a message after the context ended")
	}
}

func TestDialPubRedialsASubscriberThatBinds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := DialPub(ln.Addr().String(), Options{Logger: quiet})
	defer s.Close()
	if s.Addr() != nil {
		t.Errorf("Addr = %v for a dialing socket, want nil", s.Addr())
	}
	msg := [][]byte{[]byte("kv@"), []byte("payload")}
	for i := range 2 { // the second time after the subscriber dropped the connection
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		z, err := Handshake(c, SUB, true, Options{HandshakeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if err := z.Subscribe([]byte("kv@")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "subscribed", 10*time.Second, func() bool { return s.Subscribers() == 1 })
		s.Publish(msg)
		got, err := z.ReadMsg(nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if diff := cmp.Diff(msg, got); diff != "" {
			t.Errorf("connection %d (-want +got):\n%s", i, diff)
		}
		z.Close()
		testutil.WaitFor(t, "the connection gone", 10*time.Second, func() bool { return s.Subscribers() == 0 })
	}
}
