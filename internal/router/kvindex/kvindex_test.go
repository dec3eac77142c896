package kvindex_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

const fingerprint = "test-model-fp"

// fakeEngine answers /health, a prefill's answer or a decode's, and records
// which request ids reached it.
type fakeEngine struct {
	srv *httptest.Server
	mu  sync.Mutex
	ids []string
}

func newEngine(t *testing.T, prefill bool) *fakeEngine {
	e := &fakeEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			return // /health 200; /metrics empty
		}
		_, _ = io.Copy(io.Discard, r.Body)
		e.mu.Lock()
		e.ids = append(e.ids, r.Header.Get("X-Request-Id"))
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if prefill {
			io.WriteString(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"p"}}`)
			return
		}
		io.WriteString(w, `{"choices":[{"text":"hello"}]}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) got(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestKVEventsSteerTheRouter: decode d1 publishes that it cached a prompt's
// blocks; the router, following d1's events, sends that prompt to d1 and,
// with the conditional decider, prefills it there (cached), while a new
// prompt of the same length goes remote.
func TestKVEventsSteerTheRouter(t *testing.T) {
	dir := t.TempDir()
	if _, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: 1024}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	pub, err := kvevents.NewPublisher(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 100, HWM: 1000, MaxQueueSize: 1000},
		kvevents.PublisherOptions{BlockSize: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(0) })

	pre := newEngine(t, true)
	d0, d1 := newEngine(t, false), newEngine(t, false)
	d1URL, _ := proxy.NormalizeBackendURL(d1.srv.URL)
	idx := kvindex.New(fingerprint, 16, quiet)
	t.Cleanup(idx.Close)
	if err := idx.Follow(d1URL, "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String(), ""); err != nil {
		t.Fatal(err)
	}

	cached := strings.Repeat("once upon a time there was a little girl who liked to play. ", 12)
	fresh := strings.Repeat("the quick brown fox jumps over the lazy dog near the river. ", 12)
	// d1's KV cache stores the cached prompt's blocks, as its engine would.
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 16, NumBlocks: 256, ExtraKey: fingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(cached, true)
	hashes := blocks.ExtendHashes(nil, ids)
	bids, ok := blocks.Allocate(len(hashes))
	if !ok {
		t.Fatal("no room")
	}
	for i, id := range bids {
		blocks.Cache(id, hashes[i])
	}
	pub.Flush()
	want := len(ids) / 16
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := 0
		idx.Match(idx.Hash(ids), func(e string, b int) {
			if e == d1URL {
				n = b
			}
		})
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("d1 holds %d of %d blocks in the index after 5s", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}

	p, err := proxy.New(proxy.Config{Prefill: []string{pre.srv.URL}, Decode: []string{d0.srv.URL, d1.srv.URL}, Fallback: true,
		Policy: factory.PolicyPrefix, PDDecider: "conditional", Router: factory.Options{Threshold: 64}, ScrapeInterval: -1,
		Tokenizer: tok, PrefixIndex: idx, BlockHasher: idx.Hash, BlockSize: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p.CheckHealth(context.Background())
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	send := func(id, prompt string) string {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, prompt)))
		req.Header.Set("X-Request-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get(proxy.HeaderPD)
	}
	for i := range 4 {
		id := fmt.Sprintf("cached-%d", i)
		if pd := send(id, cached); pd != "local; reason=short_uncached" || !d1.got(id) {
			t.Errorf("cached prompt %d: x-tandem-pd %q, on d1 %v; want local on d1", i, pd, d1.got(id))
		}
	}
	if pd := send("fresh", fresh); pd != "remote" {
		t.Errorf("fresh prompt: x-tandem-pd %q, want remote", pd)
	}
}
