package vllmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options configure one `vllm serve`.
type Options struct {
	// Model is an HF-layout model directory (tandem model init writes one;
	// vLLM's CPU attention wants a head size of 32 or more, so the
	// smollm2-135m shape, not tiny).
	Model string
	// ServedName is the model name clients send (default "tiny").
	ServedName string
	// Dtype is the weights' and activations' dtype (default bfloat16).
	Dtype string
	// BlockSize is the KV block size in tokens (0: vLLM's default for the
	// CPU backend, 128; it must be a multiple of 32 there).
	BlockSize int
	// KVCacheGiB is VLLM_CPU_KVCACHE_SPACE, the KV pool in GiB (default 1).
	KVCacheGiB int
	// MaxModelLen caps the context (default 2048).
	MaxModelLen int
	// Args are further `vllm serve` flags.
	Args []string
	// Env are further environment variables, KEY=VALUE.
	Env []string
	// StartTimeout bounds the wait for /health (default 10 minutes: on two
	// shared cores importing torch and loading the model takes a minute or
	// more).
	StartTimeout time.Duration
}

// Server is a running `vllm serve`.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT.
	URL string
	// Name is the served model name.
	Name string
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
	err  error // the process's exit, valid after done closes
}

// Start runs `vllm serve` with opts and waits until its /health answers 200.
// The server is stopped when t ends; its output is logged if t failed.
func Start(t testing.TB, env Env, opts Options) *Server {
	t.Helper()
	s, err := start(env, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("vllm serve output:\n%s", s.Output())
		}
	})
	return s
}

func start(env Env, o Options) (*Server, error) {
	if o.Model == "" {
		return nil, errors.New("vllmtest: Options.Model is empty: write a model with `tandem model init --shape smollm2-135m`")
	}
	if o.ServedName == "" {
		o.ServedName = "tiny"
	}
	if o.Dtype == "" {
		o.Dtype = "bfloat16"
	}
	if o.KVCacheGiB == 0 {
		o.KVCacheGiB = 1
	}
	if o.MaxModelLen == 0 {
		o.MaxModelLen = 2048
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 10 * time.Minute
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", o.Model, "--enforce-eager", "--dtype", o.Dtype,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--served-model-name", o.ServedName, "--max-model-len", strconv.Itoa(o.MaxModelLen)}
	if o.BlockSize > 0 {
		args = append(args, "--block-size", strconv.Itoa(o.BlockSize))
	}
	args = append(args, o.Args...)
	cmd := exec.Command(env.VLLM(), args...)
	cmd.Env = append(os.Environ(), CPUEnv(o.KVCacheGiB)...)
	cmd.Env = append(cmd.Env, o.Env...)
	// Its own process group: vllm serve forks an engine core and workers,
	// and Stop must reach them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vllmtest: starting %s: %w: rerun bash scripts/vllm/install.sh", env.VLLM(), err)
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port), Name: o.ServedName, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	if err := s.waitHealthy(o.StartTimeout); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\nvllm serve output:\n%s", err, tail(s.Output(), 4000))
	}
	return s, nil
}

func (s *Server) waitHealthy(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("vllmtest: vllm serve exited before it was healthy: %w", s.err)
		case <-ctx.Done():
			return fmt.Errorf("vllmtest: vllm serve not healthy at %s after %v", s.URL, timeout)
		case <-tick.C:
		}
	}
}

// Stop ends the server and every process it started, politely first.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	pgid := s.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-s.done
	}
	// Workers that outlived the API server are in the same group.
	syscall.Kill(-pgid, syscall.SIGKILL)
}

// Output is what the server printed so far.
func (s *Server) Output() string { return s.log.String() }

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("vllmtest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
