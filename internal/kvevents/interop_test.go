package kvevents

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// These tests check the ZMTP subset against libzmq itself, through pyzmq (the
// library vLLM publishes with): a libzmq SUB and DEALER read a Tandem
// publisher, and a Tandem Subscriber reads a libzmq PUB and ROUTER that
// publish and replay as vLLM's ZmqEventPublisher does. They need a Python
// with pyzmq and msgpack: scripts/python-test-env.sh builds one from the
// pinned scripts/requirements-test.txt. Without one they are skipped, or
// fail under TANDEM_REQUIRE_TESTDATA=1 (CI), since they are the only
// evidence that the hand-written ZMTP speaks libzmq's language.

// startPython runs script with args and returns its stdin and stdout lines.
func startPython(t *testing.T, py, script string, args ...string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("python stderr:\n%s", stderr.String())
		}
	})
	return stdin, bufio.NewScanner(stdout)
}

func readLine(t *testing.T, sc *bufio.Scanner) string {
	t.Helper()
	line := make(chan string, 1)
	go func() {
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			t.Fatal("python exited early")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("timed out reading from python")
	}
	return ""
}

const libzmqSubscriber = `
import sys, zmq
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
sub.connect(sys.argv[1])
dealer = ctx.socket(zmq.DEALER)
dealer.connect(sys.argv[2])
while True:  # until the subscription has reached the publisher (the test bounds the wait)
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "subscribed":
        break
if not sub.poll(10000):
    sys.exit("no live message")
topic, seq, payload = sub.recv_multipart()
print("live", topic.decode(), int.from_bytes(seq, "big"), payload.hex(), flush=True)
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
while True:
    if not dealer.poll(10000):
        sys.exit("no replay answer")
    delim, seq, payload = dealer.recv_multipart()
    n = int.from_bytes(seq, "big", signed=True)
    print("replay", n, payload.hex(), flush=True)
    if n == -1:
        break
`

func TestLibzmqSubscriberReadsTandemPublisher(t *testing.T) {
	py := testutil.PyZMQ(t)
	pub := startPublisher(t, true)
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	cacheTokens(t, blocks, seqTokens(0, 4))
	pub.Flush() // batch 0: before the subscriber, replay only
	stdin, out := startPython(t, py, libzmqSubscriber, "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String())
	for deadline := time.Now().Add(10 * time.Second); ; {
		if l := readLine(t, out); l != "ready" {
			t.Fatalf("python said %q, want ready", l)
		}
		if pub.Stats().Subscribers == 1 {
			fmt.Fprintln(stdin, "subscribed")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the libzmq SUB's subscription did not reach the publisher in 10s")
		}
		time.Sleep(20 * time.Millisecond) // a poll interval: the loop ends on the subscription or the deadline
		fmt.Fprintln(stdin, "not yet")
	}
	cacheTokens(t, blocks, seqTokens(100, 8))
	pub.Flush() // batch 1: live
	live := strings.Fields(readLine(t, out))
	want := hex.EncodeToString(pub.ring.from(1)[0].payload)
	if len(live) != 4 || live[0] != "live" || live[1] != "kv@test@stories" || live[2] != "1" || live[3] != want {
		t.Fatalf("libzmq SUB got %q, want live kv@test@stories 1 %s", live, want)
	}
	b, err := DecodeBatch(pub.ring.from(1)[0].payload)
	if err != nil || len(b.Events) != 1 || len(b.Events[0].Hashes) != 2 {
		t.Fatalf("batch 1: %+v, %v", b, err)
	}
	for i, wantSeq := range []string{"0", "1", "-1"} {
		f := strings.Fields(readLine(t, out))
		if len(f) < 2 || f[0] != "replay" || f[1] != wantSeq {
			t.Fatalf("replay message %d: %q, want seq %s", i, f, wantSeq)
		}
		if wantSeq != "-1" && f[2] != hex.EncodeToString(pub.ring.from(uint64(i))[0].payload) {
			t.Errorf("replayed batch %d differs from the one published", i)
		}
	}
}

// libzmqPublisher publishes and replays as vLLM's ZmqEventPublisher does
// (its _publisher_thread and _service_replay), with the batch layout of
// vLLM before PR #42892. "probe HASHES" publishes batch 0, again on every
// probe: libzmq applies a subscription asynchronously and drops what it
// publishes before, so the test probes until the subscriber has batch 0.
// "publish HASHES" then makes batches 1 and 2 and holds batch 1 back from
// the PUB socket.
const libzmqPublisher = `
import sys, time, zmq, msgpack
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pport = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
rport = router.bind_to_random_port("tcp://127.0.0.1")
print(pport, rport, flush=True)
buf, seq = [], 0
poller = zmq.Poller()
poller.register(router, zmq.POLLIN)
poller.register(sys.stdin, zmq.POLLIN)

def batch(hashes):
    h = hashes[seq*2:seq*2+2]
    parent = h[0] - 1 if seq else None
    ev = ["BlockStored", h, parent, list(range(8)), 4, None, "GPU", None]
    return msgpack.packb([time.time(), [ev], 0])

while True:
    events = dict(poller.poll(100))
    if router in events:
        client, _, start = router.recv_multipart()
        start = int.from_bytes(start, "big")
        for s, b in buf:
            if s >= start:
                router.send_multipart((client, b"", s.to_bytes(8, "big"), b))
        router.send_multipart((client, b"", (-1).to_bytes(8, "big", signed=True), b""))
    if sys.stdin.fileno() in events:
        line = sys.stdin.readline().split()
        if not line or line[0] == "quit":
            break
        cmd, hashes = line[0], [int(h) for h in line[1:]]
        if cmd == "probe":
            if not buf:
                buf.append((0, batch(hashes)))
                seq = 1
            pub.send_multipart((b"kv@py@model", (0).to_bytes(8, "big"), buf[0][1]))
        else:
            for _ in range(2):
                b = batch(hashes)
                buf.append((seq, b))
                if seq != 1:
                    pub.send_multipart((b"kv@py@model", seq.to_bytes(8, "big"), b))
                seq += 1
        print(cmd, flush=True)
`

func TestTandemSubscriberReadsLibzmqPublisher(t *testing.T) {
	py := testutil.PyZMQ(t)
	stdin, out := startPython(t, py, libzmqPublisher)
	var pport, rport int
	if _, err := fmt.Sscan(readLine(t, out), &pport, &rport); err != nil {
		t.Fatal(err)
	}
	idx, sub := startSubscriber(t, Engine{Name: "vllm", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pport), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", rport), Topic: "kv@"})
	waitConnected(t, sub, "vllm")
	hashes := []uint64{1 << 63, 1<<63 + 1, 1<<63 + 2, 1<<63 + 3, 1<<63 + 4, 1<<63 + 5}
	send := func(cmd string) {
		t.Helper()
		fmt.Fprintln(stdin, cmd, strings.Trim(fmt.Sprint(hashes), "[]"))
		if l := readLine(t, out); l != cmd {
			t.Fatalf("python said %q, want %q", l, cmd)
		}
	}
	// Batch 0 again until it arrives live: what libzmq publishes before it
	// has applied the subscription is dropped. A probe that arrives twice
	// is a duplicate, skipped.
	applied := func() bool { st, _ := sub.Stats("vllm"); return st.Next >= 1 }
	for deadline := time.Now().Add(10 * time.Second); !applied(); {
		if time.Now().After(deadline) {
			t.Fatal("batch 0 never arrived from the libzmq PUB in 10s")
		}
		send("probe")
		for poll := time.Now().Add(100 * time.Millisecond); !applied() && time.Now().Before(poll); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	send("publish")
	testutil.WaitFor(t, "all three batches are applied", 10*time.Second, func() bool { st, _ := sub.Stats("vllm"); return st.Next == 3 })
	if got := idx.Match(hashes[:2], nil); len(got) != 1 || got[0].Blocks != 2 {
		t.Errorf("Match = %v, want the engine with 2 blocks", got)
	}
	if got := idx.Blocks("vllm"); got != 6 {
		t.Errorf("the engine holds %d blocks in the index, want 6", got)
	}
	if st, _ := sub.Stats("vllm"); st.Lost != 0 || st.Malformed != 0 || st.Replays < 2 {
		t.Errorf("stats %+v: want batch 1 replayed, nothing lost", st)
	}
	fmt.Fprintln(stdin, "quit")
}
