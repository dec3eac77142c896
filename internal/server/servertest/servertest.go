// Package servertest runs engines (internal/server) in-process for tests,
// as net/http/httptest runs HTTP servers.
package servertest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/sim"
)

// StartTimeout is how long Start waits for an engine to serve.
const StartTimeout = time.Minute

// Start runs the engine of cfg and returns it once it serves (its URL is
// "http://" + Addr()). When the test ends the engine drains and stops, and
// the test fails if that cut anything short; it fails at once if the
// engine does not start within StartTimeout.
func Start(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	var runErr error
	go func() {
		defer close(stopped)
		runErr = s.Run(ctx)
	}()
	name := "engine " + string(s.Config().Role) + " " + s.Config().EngineID
	started := false
	t.Cleanup(func() {
		cancel()
		<-stopped
		if started && runErr != nil {
			t.Errorf("%s: %v", name, runErr)
		}
	})
	select {
	case <-s.Ready():
		started = true
		return s
	case <-stopped:
		t.Fatalf("%s did not start: %v", name, runErr)
	case <-time.After(StartTimeout):
		t.Fatalf("%s did not start within %v", name, StartTimeout)
	}
	return nil
}

// SimConfig is a small simulated engine (role both) of the embedded
// default model, as `tandem serve --simulate` runs it with its flags'
// defaults, on free loopback ports; knobs is its time model.
func SimConfig(t testing.TB, knobs sim.Knobs) server.Config {
	t.Helper()
	dir, err := defaultmodel.Install(filepath.Join(t.TempDir(), "model"))
	if err != nil {
		t.Fatal(err)
	}
	return server.Config{
		Model: dir, ServedModelName: "hf", Host: "127.0.0.1",
		BlockSize: 16, KVCacheDType: "auto", NumBlocks: 256, MaxNumSeqs: 8, MaxNumBatchedTokens: 2048, Threads: 1,
		MaxRequestBody: openai.DefaultMaxBodyBytes, ShutdownTimeout: 5 * time.Second,
		Role: kvconnector.RoleBoth, KVHost: "127.0.0.1", KVLease: kvxfer.DefaultLease, KVTransport: kvxfer.TransportAuto,
		KVLoadFailurePolicy: sched.LoadFailureFail, KVDecodeHoldTTL: kvconnector.DefaultDecodeHoldTTL,
		KVRecomputeThreshold: kvconnector.DefaultRecomputeThreshold,
		Simulate:             &server.Simulation{Knobs: &knobs, Speed: 1, MeanOutputLen: 128, Faults: sim.Faults{StallFor: time.Second}},
	}
}
