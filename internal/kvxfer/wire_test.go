package kvxfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPayloadsRoundTrip(t *testing.T) {
	info := smollm
	info.EngineID = "e1"
	info.NumBlocks = 1024
	info.Host = HostIdentity{BootID: "b", Hostname: "h"}
	info.Lease = 30 * time.Second
	info.Shm = ShmLayout{Path: "/dev/shm/x", Size: 1 << 30, BlocksOffset: 4096, GenerationsOffset: 0, Dev: 5, Inode: 6}

	t.Run("handshake info", func(t *testing.T) {
		got, err := decodeInfo(appendInfo(nil, &info))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(info, got); diff != "" {
			t.Fatalf("(-sent +decoded):\n%s", diff)
		}
	})
	t.Run("handshake info with appended fields from a later minor revision", func(t *testing.T) {
		got, err := decodeInfo(append(appendInfo(nil, &info), 1, 2, 3))
		if err != nil || got != info {
			t.Fatalf("got %+v, %v", got, err)
		}
	})
	t.Run("block request", func(t *testing.T) {
		r := blockRequest{RequestID: "req-1", Blocks: []int{0, 7, 1 << 20}}
		got, err := decodeBlockRequest(appendBlockRequest(nil, &r))
		if err != nil || !cmp.Equal(r, got) {
			t.Fatalf("got %+v, %v", got, err)
		}
	})
	t.Run("generations", func(t *testing.T) {
		g := []uint64{0, 1, 1 << 63}
		got, err := decodeGens(appendGens(nil, g))
		if err != nil || !cmp.Equal(g, got) {
			t.Fatalf("got %v, %v", got, err)
		}
	})
	t.Run("request ids", func(t *testing.T) {
		ids := []string{"a", "", "ccc"}
		got, err := decodeIDs(appendIDs(nil, ids))
		if err != nil || !cmp.Equal(ids, got) {
			t.Fatalf("got %v, %v", got, err)
		}
	})
	t.Run("error", func(t *testing.T) {
		got := decodeError(appendError(nil, CodeNotHeld, "gone"))
		if *got != (RemoteError{CodeNotHeld, "gone"}) || !errors.Is(got, ErrNotHeld) {
			t.Fatalf("got %+v", got)
		}
	})
}

func TestHostileFramesAreRejected(t *testing.T) {
	good := frame(msgDone, 9, func(b []byte) []byte { return appendString(b, "r") })
	mut := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	tests := []struct {
		name  string
		frame []byte
		want  string
	}{
		{"a frame with a wrong magic", mut(func(b []byte) { b[0] = 'X' }), "bad magic"},
		{"a frame of another protocol version", mut(func(b []byte) { b[4] = 9 }), "protocol version 9"},
		{"a frame with reserved flags set", mut(func(b []byte) { b[6] = 1 }), "reserved flags"},
		{"a frame of unknown type", mut(func(b []byte) { b[5] = 200 }), "unknown message type 200"},
		{"a control frame claiming 4 GiB", mut(func(b []byte) { binary.LittleEndian.PutUint32(b[16:], 0xffffffff) }), "exceeds the 1048576-byte limit"},
		{"a truncated header", good[:10], "unexpected EOF"},
		{"a truncated payload", good[:len(good)-1], "unexpected EOF"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readControl(bytes.NewReader(tc.frame))
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	t.Run("a list count larger than the payload is refused before allocating", func(t *testing.T) {
		p := appendString(nil, "r")
		p = appendU32(p, 1<<30) // 4 GiB of block ids claimed, none present
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := decodeBlockRequest(p)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; err == nil || n > 64<<10 {
			t.Fatalf("err %v after allocating %d bytes", err, n)
		}
	})
}

// FuzzReadFrame feeds arbitrary bytes to the frame reader and every payload
// decoder: no panics, and no allocation beyond MaxControlPayload.
func FuzzReadFrame(f *testing.F) {
	info := tiny
	info.EngineID = "e"
	f.Add(frame(msgHello, 1, func(b []byte) []byte { return appendInfo(b, &info) }))
	f.Add(frame(msgRead, 2, func(b []byte) []byte { return appendBlockRequest(b, &blockRequest{"r", []int{1, 2}}) }))
	f.Add(frame(msgShmGens, 3, func(b []byte) []byte { return appendGens(b, []uint64{1}) }))
	f.Add(frame(msgHeartbeat, 4, func(b []byte) []byte { return appendIDs(b, []string{"a", "b"}) }))
	f.Add(frame(msgError, 5, func(b []byte) []byte { return appendError(b, CodeBusy, "x") }))
	f.Add(dataHeader(6, 8))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			h, p, err := readControl(r)
			if err != nil {
				return
			}
			if len(p) > MaxControlPayload {
				t.Fatalf("payload of %d bytes accepted", len(p))
			}
			switch h.Type {
			case msgHello, msgHelloAck:
				decodeInfo(p)
			case msgRead, msgShmRead:
				if br, err := decodeBlockRequest(p); err == nil && 4*len(br.Blocks) > len(p) {
					t.Fatalf("%d block ids from %d bytes", len(br.Blocks), len(p))
				}
			case msgShmGens:
				decodeGens(p)
			case msgHeartbeat, msgAck:
				decodeIDs(p)
			case msgDone:
				decodeDone(p)
			case msgError:
				decodeError(p)
			}
		}
	})
}
