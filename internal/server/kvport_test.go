package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestTwoPrefillsOnOneHostWithTheDefaultKVPort: two engines started with
// the same default side-channel port (as two `tandem serve` without
// --kv-port) both run; the second listens on a free port and advertises
// that one in the kv_transfer_params it returns. An explicit --kv-port that
// is taken still stops the engine, with an error naming the flag.
func TestTwoPrefillsOnOneHostWithTheDefaultKVPort(t *testing.T) {
	port := testutil.FreePort(t)
	knobs := sim.Knobs{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}
	cfg := simConfig(t, knobs)
	cfg.Role, cfg.KVPort, cfg.KVPortFallback = kvconnector.RolePrefill, port, true
	cfg.KVLease = 300 * time.Millisecond // the held KV expires before the drain ends
	first := servertest.Start(t, cfg)
	second := servertest.Start(t, cfg)

	if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(port)); first.KVAddr() != want {
		t.Errorf("first engine's side channel on %s, want the preferred %s", first.KVAddr(), want)
	}
	_, p2, _ := net.SplitHostPort(second.KVAddr())
	if p2 == strconv.Itoa(port) || p2 == "0" || p2 == "" {
		t.Fatalf("second engine's side channel on %q, want another bound port than %d", second.KVAddr(), port)
	}
	code, body := post(t, "http://"+second.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`, idPrompt(40)))
	if code != 200 {
		t.Fatalf("prefill request to the second engine: %d %s", code, body)
	}
	var resp struct {
		KVTransferParams struct {
			RemotePort int `json:"remote_port"`
		} `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	if got := strconv.Itoa(resp.KVTransferParams.RemotePort); got != p2 {
		t.Errorf("the second engine advertises remote_port %s, but its side channel is on %s", got, p2)
	}

	t.Run("an explicit taken port stops the engine and names --kv-port", func(t *testing.T) {
		explicit := cfg
		explicit.KVPortFallback = false
		s, err := server.New(explicit)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = s.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), "--kv-port") {
			t.Errorf("Run: %v, want an error naming --kv-port", err)
		}
	})
}
