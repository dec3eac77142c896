package kvxfer

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// A Tandem decode given a vLLM prefill's kv_transfer_params dials vLLM's
// NIXL side channel, a ZeroMQ ROUTER socket: real libzmq (pyzmq) sends its
// signature and waits for ours. The pull fails at once, naming ZeroMQ and
// what to do — not after the I/O deadline with a timeout.
func TestPullFromZeroMQPeerNamesIt(t *testing.T) {
	py := testutil.PyZMQ(t)
	cmd := exec.Command(py, "-c", `
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
print(s.bind_to_random_port("tcp://127.0.0.1"), flush=True)
sys.stdin.read()
`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the ROUTER socket's port: %v", err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	err = pullFromForeign(t, "127.0.0.1", port)
	wantErr(t, err, ErrProtocol, "the peer speaks ZeroMQ (ZMTP)")
	if !strings.Contains(err.Error(), "must go to a vLLM decode") {
		t.Fatalf("the error does not say what to do: %v", err)
	}
}

// pullFromForeign pulls one block from host:port with deadlines far longer
// than a foreign peer's first bytes take to arrive.
func pullFromForeign(t *testing.T, host string, port int) error {
	t.Helper()
	ci := tiny
	ci.EngineID = "d"
	c, err := NewConsumer(ConsumerConfig{Local: ci, Transport: TransportTCP, IOTimeout: time.Minute, DialTimeout: 10 * time.Second, Secret: testSecret, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Pull(ctxT(t), RemoteParams{EngineID: "vllm-prefill", RequestID: "r", Host: host, Port: port, BlockIDs: []int{0}}, newLocalBlocks(1, tiny.BlockBytes))
}
