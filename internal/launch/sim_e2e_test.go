package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSimulatedClusterOf200 runs `tandem up --simulate --prefill 100
// --decode 100` as a user would: 200 real engine processes (real API,
// scheduler, KV cache, side channel; simulated forward passes) and the
// proxy on this machine. They must start, serve a burst through the proxy
// on the P/D path, and stop cleanly. TANDEM_SIM_ENGINES=N runs N engines
// (half prefill) instead. The test logs each engine's CPU time and RSS
// idle and after the burst (docs/performance.md).
func TestSimulatedClusterOf200(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tandem and runs 200 engine processes; skipped in -short mode")
	}
	engines := 200
	if s := os.Getenv("TANDEM_SIM_ENGINES"); s != "" {
		var err error
		if engines, err = strconv.Atoi(s); err != nil || engines < 2 {
			t.Fatalf("TANDEM_SIM_ENGINES=%q: want a number ≥ 2", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel) // after startUp's shutdown
	exe := buildTandem(ctx, t)
	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	cmd := exec.CommandContext(ctx, exe, "up", "--simulate", "--prefill", strconv.Itoa(engines/2), "--decode", strconv.Itoa(engines-engines/2),
		"--port", strconv.Itoa(ports[0]), "--served-model-name", "sim", "--pd-decider", "always",
		"--", "--log-level", "warn", "--sim-ttft", "20ms", "--sim-prefill-per-token", "100us", "--sim-itl", "10ms", "--max-num-seqs", "16")
	cmd.Env = append(os.Environ(), "TANDEM_KV_SECRET=")
	cmd.Dir = t.TempDir()
	up := startUp(t, cmd)

	url := waitEndpoint(t, &up.stdout, up.done)
	t.Logf("%d simulated engines and the proxy ready in %v", engines, time.Since(started).Round(time.Millisecond))
	pids := childPIDs(up.stderr.String())
	if len(pids) != engines {
		t.Fatalf("%d engine pids in the logs, want %d", len(pids), engines)
	}
	time.Sleep(2 * time.Second) // settle: what follows is the idle cost
	idle := usage(t, pids)
	const idleFor = 3 * time.Second
	time.Sleep(idleFor)
	idleRate := (usage(t, pids).cpu - idle.cpu) / idleFor.Seconds()
	idle = usage(t, pids)

	// The burst: 2 requests per engine, 100 at a time, every one on the
	// P/D path.
	const inFlight = 100
	requests := 2 * engines
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: inFlight}}
	var mu sync.Mutex
	failures := map[string]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, inFlight)
	burst := time.Now()
	for i := range requests {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if why := simRequest(client, url, i); why != "" {
				mu.Lock()
				failures[why]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(burst)
	if len(failures) > 0 {
		t.Errorf("failed requests, by reason: %v", failures)
	}
	t.Logf("burst of %d requests (%d in flight, 64-token prompts, 16 output tokens) in %v", requests, inFlight, took.Round(time.Millisecond))
	loaded := usage(t, pids)
	t.Logf("per engine: idle %.1f MiB RSS, %.3f CPU-s since start, %.2f%% of a core while idle; after the burst %.1f MiB RSS, %.3f CPU-s more (%d engines, %d requests, %.1f ms of CPU per request for the whole cluster)",
		idle.rssMiB/float64(engines), idle.cpu/float64(engines), 100*idleRate/float64(engines), loaded.rssMiB/float64(engines), (loaded.cpu-idle.cpu)/float64(engines),
		engines, requests, 1000*(loaded.cpu-idle.cpu)/float64(requests))

	stopping := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-up.done:
	case <-time.After(60 * time.Second):
		t.Fatal("tandem up did not exit within 60s of SIGINT")
	}
	t.Logf("stopped in %v", time.Since(stopping).Round(time.Millisecond))
	if up.err != nil {
		t.Errorf("tandem up exited with %v after SIGINT, want 0", up.err)
	}
	checkGone(t, pids)
}

// simRequest sends request i and returns "" or why it failed.
func simRequest(client *http.Client, url string, i int) string {
	ids := make([]string, 64)
	for j := range ids {
		ids[j] = strconv.Itoa(10 + (i*131+j*17)%480)
	}
	body := fmt.Sprintf(`{"model":"sim","prompt":[%s],"max_tokens":16,"temperature":0,"ignore_eos":true}`, strings.Join(ids, ","))
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "transport: " + err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	if pd := resp.Header.Get("X-Tandem-Pd"); pd != "remote" {
		return "x-tandem-pd " + pd
	}
	var r struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(raw, &r) != nil || r.Usage.CompletionTokens != 16 {
		return "wrong answer"
	}
	return ""
}

// resources is the summed CPU time and RSS of a set of processes.
type resources struct{ cpu, rssMiB float64 }

func usage(t *testing.T, pids map[string]int) resources {
	t.Helper()
	var r resources
	tick := 100.0 // USER_HZ on Linux
	for name, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Fields after the command (which may hold spaces) start after ")".
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		r.cpu += (utime + stime) / tick
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
				r.rssMiB += kb / 1024
			}
		}
	}
	return r
}
