package zmtp

import (
	"bytes"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The frame reader, the message reader and the metadata parser face the
// network on every socket (PUB and ROUTER accept any peer): whatever they
// are given, they return an error or values within their bounds, never
// panic, and what they accept survives writing and reading again.

const fuzzMaxFrame = 1 << 10

func addFrameSeeds(f *testing.F) {
	f.Add(encode([][]byte{[]byte("kv@"), {0, 0, 0, 0, 0, 0, 0, 1}, []byte("\x93\xcb")}))
	f.Add(encode([][]byte{bytes.Repeat([]byte{9}, 300)}))
	f.Add([]byte{flagCommand, 9, 4, 'P', 'I', 'N', 'G', 0, 10, 'c', 'x', 0, 1, 'm'})
	f.Add([]byte{flagCommand, 10, 9, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E', 0, 2, 1, 'k'})
	f.Add([]byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{flagMore, 1, 'a', flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
	f.Add([]byte{0x08, 0})
}

func FuzzReadFrame(f *testing.F) {
	addFrameSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		z := bytesConn(in, fuzzMaxFrame)
		for {
			body, flags, err := z.readFrame()
			if err != nil {
				return
			}
			if flags&^(flagMore|flagLong|flagCommand) != 0 {
				t.Fatalf("flags 0x%02x accepted", flags)
			}
			limit := fuzzMaxFrame
			if flags&flagCommand != 0 {
				limit = MaxCommandSize
			}
			if len(body) > limit {
				t.Fatalf("%d-byte frame over the limit of %d", len(body), limit)
			}
			var buf bytes.Buffer
			w := newConn(nil, bytes.NewReader(nil), &buf, 0, 0)
			w.writeFrame(body, flags&^flagLong)
			w.Flush()
			again, flags2, err := bytesConn(buf.Bytes(), fuzzMaxFrame).readFrame()
			if err != nil || !bytes.Equal(again, body) || flags2&^flagLong != flags&^flagLong {
				t.Fatalf("frame %q flags 0x%02x rewritten reads back as %q 0x%02x, %v", body, flags, again, flags2, err)
			}
		}
	})
}

func FuzzReadMsg(f *testing.F) {
	addFrameSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		z := bytesConn(in, fuzzMaxFrame)
		var msgs [][][]byte
		for {
			parts, err := z.ReadMsg(func(string, []byte) error { return nil })
			if err != nil {
				break
			}
			if len(parts) == 0 || len(parts) > MaxParts {
				t.Fatalf("message of %d frames", len(parts))
			}
			for _, p := range parts {
				if len(p) > fuzzMaxFrame {
					t.Fatalf("%d-byte frame over the limit", len(p))
				}
			}
			msgs = append(msgs, parts)
		}
		z = bytesConn(encode(msgs...), fuzzMaxFrame)
		for i, want := range msgs {
			got, err := z.ReadMsg(nil)
			if err != nil {
				t.Fatalf("rewritten message %d: %v", i, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("rewritten message %d (-want +got):\n%s", i, diff)
			}
		}
		if _, err := z.ReadMsg(nil); err != io.EOF {
			t.Fatalf("after the rewritten messages: %v, want EOF", err)
		}
	})
}

func FuzzParseProps(f *testing.F) {
	f.Add(appendProp(appendProp(nil, "Socket-Type", "PUB"), "Identity", ""))
	f.Add(appendProp(nil, "X-Long", string(bytes.Repeat([]byte{'v'}, 300))))
	f.Add([]byte{0})
	f.Add([]byte{1, 'a', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{3, 'a', 'b'})
	f.Fuzz(func(t *testing.T, in []byte) {
		props, err := parseProps(in)
		if err != nil {
			return
		}
		names := make([]string, 0, len(props))
		for n := range props {
			names = append(names, n)
		}
		slices.Sort(names)
		var again []byte
		for _, n := range names {
			if n == "" || len(n) > 255 {
				t.Fatalf("property name %q accepted", n)
			}
			again = appendProp(again, n, props[n])
		}
		got, err := parseProps(again)
		if err != nil {
			t.Fatalf("rewritten metadata: %v", err)
		}
		if diff := cmp.Diff(props, got); diff != "" {
			t.Fatalf("rewritten metadata (-want +got):\n%s", diff)
		}
	})
}

// fuzzConn is a net.Conn that reads in and discards writes.
type fuzzConn struct {
	net.Conn // nil: only the methods below are called
	r        *bytes.Reader
}

func (c fuzzConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c fuzzConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzHandshake feeds a peer's greeting and READY command: whatever it is,
// the handshake fails with an error or yields a compatible peer.
func FuzzHandshake(f *testing.F) {
	var sub bytes.Buffer
	w := newConn(nil, bytes.NewReader(nil), &sub, 0, 0)
	w.w.Write(greeting(false))
	w.writeFrame(appendProp([]byte("\x05READY"), "Socket-Type", "SUB"), flagCommand)
	w.Flush()
	f.Add(sub.Bytes())
	f.Add(append(greeting(false), flagCommand, 6, 5, 'E', 'R', 'R', 'O', 'R'))
	f.Add(greeting(true)[:40])
	f.Fuzz(func(t *testing.T, in []byte) {
		z, err := Handshake(fuzzConn{r: bytes.NewReader(in)}, PUB, true, Options{})
		if err != nil {
			return
		}
		if z.PeerType() != "SUB" && z.PeerType() != "XSUB" {
			t.Fatalf("a PUB accepted a %q peer", z.PeerType())
		}
	})
}
