package openai

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// lateBackend is a real prefill engine reached the way a request whose
// forward pass is already running when its client leaves reaches it: the
// request is handed to the engine only once the client's context ended,
// detached from it, and the abort that follows comes too late (dropped), so
// the engine finishes the forward pass and holds the prompt's KV for a
// remote decode. The API layer's forwarder drains that final event after
// the handler gave up on the client.
type lateBackend struct {
	*engine.Engine
	once      sync.Once
	submitted chan struct{} // closed when the request reached Submit
	finished  chan struct{} // closed when the engine's events ended
}

func (b *lateBackend) Submit(ctx context.Context, r *engine.Request) (*engine.Handle, error) {
	b.once.Do(func() { close(b.submitted) })
	ch := make(chan engine.Event)
	go func() {
		defer close(b.finished)
		defer close(ch)
		<-ctx.Done()
		h, err := b.Engine.Submit(context.WithoutCancel(ctx), r)
		if err != nil {
			ch <- engine.Event{Finish: engine.FinishError, Err: err}
			return
		}
		for ev := range h.Events {
			ch <- ev
		}
	}()
	return &engine.Handle{ID: r.ID, Events: ch}, nil
}

func (b *lateBackend) Abort(string) {}

// TestClientGoneDuringPrefillReleasesTheHold: a client that disconnects
// while its prefill leg computes never gets the answer's kv_transfer_params,
// so nobody can pull or release that KV; the engine releases it as soon as
// the request finishes instead of holding it for the lease.
func TestClientGoneDuringPrefillReleasesTheHold(t *testing.T) {
	const lease = time.Minute
	st := loaded.Stories(t)
	log := slog.New(slog.DiscardHandler)
	met := metrics.NewEngine("stories260K")
	conn, err := kvconnector.NewConnector(kvconnector.ConnectorConfig{Role: kvconnector.RolePrefill, EngineID: "p",
		ModelFingerprint: st.Model.Fingerprint(), Host: "127.0.0.1", Lease: lease, Metrics: met, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Model: st.Model, Tokenizer: st.Tokenizer, NumBlocks: 32, MaxNumSeqs: 4,
		Connector: conn, KVWorker: conn, Metrics: met, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := eng.Shutdown(ctx); err != nil {
			t.Errorf("engine shutdown: %v", err)
		}
	})
	if err := conn.Start(eng); err != nil {
		t.Fatal(err)
	}
	be := &lateBackend{Engine: eng, submitted: make(chan struct{}), finished: make(chan struct{})}
	api, err := NewServer(Config{Backend: be, Tokenizer: st.Tokenizer, ModelName: "stories260K", Metrics: met.Handler(),
		Logger: log, KVReleaser: conn, KVReleased: func(reason string) { met.KVReleases.WithLabelValues(reason).Inc() }})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"stories260K","prompt":"Once upon a time there was a little girl who liked to play in the park with her dog","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-be.submitted:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the engine")
	}
	cancel() // the client leaves while its prefill computes
	if err := <-errc; err == nil {
		t.Fatal("the request succeeded though its client left")
	}
	select {
	case <-be.finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine never finished the prefill")
	}
	// Well before the lease: the hold must not wait for it.
	testutil.WaitFor(t, "the engine to hold no KV for the gone client", 5*time.Second, func() bool {
		s := eng.Stats()
		return s.Running == 0 && s.Waiting == 0 && s.FreeBlocks == s.TotalBlocks && testutil.Metric(t, ts.URL, "tandem:kv_blocks_held", "") == 0
	})
	if got := testutil.Metric(t, ts.URL, "tandem:kv_releases_total", ""); got != 1 {
		t.Errorf("tandem:kv_releases_total = %v, want 1 (reason client_gone)", got)
	}
}
