package kvxfer

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// Engines of two Tandem releases speaking different side-channel versions
// must refuse each other with an error naming both versions, on either side.

// TestProducerRefusesAnotherVersionNamingBoth: a consumer's HELLO of another
// version gets an ERROR (code version) whose message names its version and
// the producer's.
func TestProducerRefusesAnotherVersionNamingBoth(t *testing.T) {
	r := newRig(t, rigOpts{})
	hello := frame(msgHello, 1, func(b []byte) []byte { return append(b, make([]byte, nonceSize)...) })
	for _, theirs := range []uint8{ProtocolVersion - 1, ProtocolVersion + 1} {
		t.Run(fmt.Sprint(theirs), func(t *testing.T) {
			c, err := net.Dial("tcp", r.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b := bytes.Clone(hello)
			b[4] = theirs
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
			for {
				h, p, err := readControl(c)
				if err != nil {
					t.Fatalf("no ERROR frame: %v", err)
				}
				if h.Type == msgChallenge {
					continue
				}
				re := decodeError(p)
				if h.Type != msgError || re.Code != CodeVersion {
					t.Fatalf("got %s %+v, want ERROR version", h.Type, re)
				}
				for _, s := range []string{fmt.Sprintf("version %d", theirs), fmt.Sprintf("speaks %d", ProtocolVersion)} {
					if !bytes.Contains([]byte(re.Message), []byte(s)) {
						t.Errorf("refusal %q does not name %q", re.Message, s)
					}
				}
				return
			}
		})
	}
}

// TestConsumerRefusesAnotherVersionNamingBoth: a producer answering in
// another version fails the pull with an error naming both versions.
func TestConsumerRefusesAnotherVersionNamingBoth(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP})
	const theirs = ProtocolVersion + 1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var hb [headerSize]byte
				if _, err := io.ReadFull(c, hb[:]); err != nil {
					return
				}
				// An ERROR in the newer version's framing, as a newer
				// producer would answer.
				f := frame(msgError, 1, func(b []byte) []byte {
					return appendString(appendU16(b, uint16(CodeVersion)), "newer")
				})
				f[4] = theirs
				c.Write(f)
				io.Copy(io.Discard, c)
			}()
		}
	}()
	host, port := splitAddr(ln.Addr().String())
	p := RemoteParams{EngineID: "prefill-new", RequestID: "req-a", Host: host, Port: port, BlockIDs: []int{1}}
	err = r.cons.Pull(ctxT(t), p, newLocalBlocks(1, tiny.BlockBytes))
	wantErr(t, err, nil, fmt.Sprintf("version %d", theirs), fmt.Sprintf("speaks %d", ProtocolVersion))
}
