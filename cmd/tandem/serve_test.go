package main

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseServeFlags(t *testing.T) {
	t.Run("defaults and the served name from the model directory", func(t *testing.T) {
		c, err := parseServeFlags([]string{"--model", "/models/stories260K/"})
		if err != nil {
			t.Fatal(err)
		}
		if c.ServedModelName != "stories260K" || c.Port != 8000 || c.Host != "127.0.0.1" || c.BlockSize != 16 ||
			c.MaxNumSeqs != 64 || c.MaxNumBatchedTokens != 2048 || c.ShutdownTimeout != 30*time.Second || c.MaxRequestBody != 16<<20 ||
			c.PrefillScheduleInterval != 1 {
			t.Errorf("config %+v", c)
		}
	})
	t.Run("P/D defaults: both roles, vLLM's side-channel port, a fresh engine id per process", func(t *testing.T) {
		a, err := parseServeFlags([]string{"--model", "m"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseServeFlags([]string{"--model", "m"})
		if err != nil {
			t.Fatal(err)
		}
		if a.Role != "both" || a.KVHost != "127.0.0.1" || a.KVPort != 5600 || !a.KVPortFallback || a.KVLease != 30*time.Second ||
			a.KVTransport != "auto" || a.KVLoadFailurePolicy != "fail" || a.EngineID == "" || a.EngineID == b.EngineID {
			t.Errorf("config %+v (second engine id %q)", a, b.EngineID)
		}
	})
	t.Run("explicit P/D values", func(t *testing.T) {
		c, err := parseServeFlags([]string{"--model", "m", "--role", "decode", "--kv-host", "0.0.0.0", "--kv-port", "5601", "--engine-id", "d0",
			"--kv-lease", "1m", "--kv-transport", "tcp", "--kv-load-failure-policy", "recompute"})
		if err != nil {
			t.Fatal(err)
		}
		if c.Role != "decode" || c.KVHost != "0.0.0.0" || c.KVPort != 5601 || c.KVPortFallback || c.EngineID != "d0" || c.KVLease != time.Minute ||
			c.KVTransport != "tcp" || c.KVLoadFailurePolicy != "recompute" {
			t.Errorf("config %+v", c)
		}
	})
	t.Run("explicit values", func(t *testing.T) {
		c, err := parseServeFlags([]string{"--model", "m", "--served-model-name", "x", "--kv-cache-memory", "512MiB", "--log-level", "debug", "--port", "0",
			"--prefill-schedule-interval", "4"})
		if err != nil {
			t.Fatal(err)
		}
		if c.ServedModelName != "x" || c.KVCacheMemory != 512<<20 || c.LogLevel.String() != "DEBUG" || c.PrefillScheduleInterval != 4 {
			t.Errorf("config %+v", c)
		}
	})
	bad := []struct {
		name string
		args []string
		want string
	}{
		{"no model", nil, "--model is required"},
		{"both pool sizes", []string{"--model", "m", "--num-blocks", "8", "--kv-cache-memory", "1GiB"}, "not both"},
		{"zero block size", []string{"--model", "m", "--block-size", "0"}, "--block-size"},
		{"unknown KV dtype", []string{"--model", "m", "--kv-cache-dtype", "fp8"}, "--kv-cache-dtype \"fp8\": want auto, bfloat16 or float32"},
		{"a bad size", []string{"--model", "m", "--kv-cache-memory", "huge"}, "not a size"},
		{"a stray argument", []string{"--model", "m", "extra"}, "unexpected arguments"},
		{"a bad port", []string{"--model", "m", "--port", "70000"}, "not a TCP port"},
		{"an unknown role", []string{"--model", "m", "--role", "router"}, "use prefill, decode or both"},
		{"a bad kv port", []string{"--model", "m", "--kv-port", "-1"}, "--kv-port -1 is not a TCP port"},
		{"a zero lease", []string{"--model", "m", "--kv-lease", "0s"}, "--kv-lease must be positive"},
		{"an unknown transport", []string{"--model", "m", "--kv-transport", "rdma"}, "use auto, tcp or shm"},
		{"an unknown failure policy", []string{"--model", "m", "--kv-load-failure-policy", "retry"}, "use fail or recompute"},
		{"a negative prefill interval", []string{"--model", "m", "--prefill-schedule-interval", "-2"}, "--prefill-schedule-interval must be at least 1"},
	}
	for _, c := range bad {
		t.Run("rejects "+c.name, func(t *testing.T) {
			_, err := parseServeFlags(c.args)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestServeKeepsAProcForIO(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct{ procs, threads, want int }{
		{1, 1, 2}, // one core, one compute thread: one more P for HTTP, SSE and KV transfers
		{2, 2, 3},
		{2, 1, 2}, // --threads below the cores already leaves one
		{8, 2, 8},
	} {
		runtime.GOMAXPROCS(tc.procs)
		reserveIOProc(tc.threads)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("GOMAXPROCS %d, --threads %d: GOMAXPROCS became %d, want %d", tc.procs, tc.threads, got, tc.want)
		}
	}
}
