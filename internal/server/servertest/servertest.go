// Package servertest runs engines (internal/server) in-process for tests,
// as net/http/httptest runs HTTP servers.
package servertest

import (
	"context"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/server"
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
