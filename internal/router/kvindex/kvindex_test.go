package kvindex_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
	"github.com/tandem-serve/tandem/internal/testutil"
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
	return slices.Contains(e.ids, id)
}

// quiet is the tests' logger: it drops everything.
var quiet = slog.New(slog.DiscardHandler)

// fixtureTokenizer returns the tokenizer of a generated fixture with a
// vocabulary of 1024 tokens.
func fixtureTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir := t.TempDir()
	if _, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: 1024}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// startPublisher starts a KV-event publisher, in blocks of 16 tokens, on
// free loopback ports (its PUB socket and its replay socket), closed when
// the test ends.
func startPublisher(t *testing.T) *kvevents.Publisher {
	t.Helper()
	pub, err := kvevents.NewPublisher(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 100, HWM: 1000, MaxQueueSize: 1000},
		kvevents.PublisherOptions{BlockSize: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(0) })
	return pub
}

// cacheOnEngine stores text's blocks in a KV cache of 16-token blocks
// whose events pub publishes, as a decode engine caching the prompt would,
// and returns text's token ids. The caller flushes pub.
func cacheOnEngine(t *testing.T, pub *kvevents.Publisher, tok *tokenizer.Tokenizer, text string) []int32 {
	t.Helper()
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 16, NumBlocks: 256, ExtraKey: fingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(text, true)
	hashes := blocks.ExtendHashes(nil, ids)
	bids, ok := blocks.Allocate(len(hashes))
	if !ok {
		t.Fatal("no room")
	}
	for i, id := range bids {
		blocks.Cache(id, hashes[i])
	}
	return ids
}

// heldBy is how many of the blocks of ids the index says engine holds.
func heldBy(idx *kvindex.Precise, ids []int32, engine string) int {
	n := 0
	idx.Match(idx.Hash(ids), func(e string, b int) {
		if e == engine {
			n = b
		}
	})
	return n
}

// startPrefixProxy serves a proxy routing by prefix over pre and the
// decodes, with the conditional decider, the index's view of the decodes'
// KV and, when it is not nil, changed told of every change to the pools
// (Config.BackendsChanged).
// It returns the proxy and its URL.
func startPrefixProxy(t *testing.T, tok *tokenizer.Tokenizer, idx *kvindex.Precise, pre *fakeEngine, decodes []*fakeEngine, changed func(role string, added, removed []string)) (*proxy.Proxy, string) {
	t.Helper()
	var urls []string
	for _, d := range decodes {
		urls = append(urls, d.srv.URL)
	}
	p, err := proxy.New(proxy.Config{Prefill: []string{pre.srv.URL}, Decode: urls, Fallback: true,
		Policy: factory.PolicyPrefix, PDDecider: "conditional", Router: factory.Options{Threshold: 64}, ScrapeInterval: -1,
		Tokenizer: tok, PrefixIndex: idx, BlockHasher: idx.Hash, BlockSize: 16, Logger: quiet, BackendsChanged: changed})
	if err != nil {
		t.Fatal(err)
	}
	p.CheckHealth(context.Background())
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

// send posts a completion of prompt with request id id to url and returns
// the proxy's x-tandem-pd header.
func send(t *testing.T, url, id, prompt string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, prompt)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get(proxy.HeaderPD)
}

// TestKVEventsSteerTheRouter: decode d1 publishes that it cached a prompt's
// blocks; the router, following d1's events, sends that prompt to d1 and,
// with the conditional decider, prefills it there (cached), while a new
// prompt of the same length goes remote.
func TestKVEventsSteerTheRouter(t *testing.T) {
	tok := fixtureTokenizer(t)
	pub := startPublisher(t)

	pre := newEngine(t, true)
	d0, d1 := newEngine(t, false), newEngine(t, false)
	d1URL, _ := proxy.NormalizeBackendURL(d1.srv.URL)
	idx := kvindex.New(fingerprint, 16, quiet)
	t.Cleanup(idx.Close)
	if err := idx.Follow(d1URL, "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String(), ""); err != nil {
		t.Fatal(err)
	}

	// Publish only once d1 is followed live: a batch published while the
	// subscription is still being set up is lost to ZMQ's slow joiner, and
	// with no later batch there is no gap to recover it by.
	testutil.WaitFor(t, "the index to follow d1's events", 5*time.Second, func() bool {
		st, _ := idx.Stats(d1URL)
		return st.Connected
	})
	cached := strings.Repeat("once upon a time there was a little girl who liked to play. ", 12)
	fresh := strings.Repeat("the quick brown fox jumps over the lazy dog near the river. ", 12)
	// d1's KV cache stores the cached prompt's blocks, as its engine would.
	ids := cacheOnEngine(t, pub, tok, cached)
	pub.Flush()
	want := len(ids) / 16
	deadline := time.Now().Add(5 * time.Second)
	for n := heldBy(idx, ids, d1URL); n != want; n = heldBy(idx, ids, d1URL) {
		if time.Now().After(deadline) {
			t.Fatalf("d1 holds %d of %d blocks in the index after 5s", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}

	_, url := startPrefixProxy(t, tok, idx, pre, []*fakeEngine{d0, d1}, nil)
	for i := range 4 {
		id := fmt.Sprintf("cached-%d", i)
		if pd := send(t, url, id, cached); pd != "local; reason=short_uncached" || !d1.got(id) {
			t.Errorf("cached prompt %d: x-tandem-pd %q, on d1 %v; want local on d1", i, pd, d1.got(id))
		}
	}
	if pd := send(t, url, "fresh", fresh); pd != "remote" {
		t.Errorf("fresh prompt: x-tandem-pd %q, want remote", pd)
	}
}

func TestPatternExpand(t *testing.T) {
	tests := []struct {
		pattern, backend  string
		wantPub, wantRepl string
		wantErr           string
	}{
		{pattern: "tcp://{host}:5557;tcp://{host}:5558", backend: "http://10.0.0.7:8000", wantPub: "tcp://10.0.0.7:5557", wantRepl: "tcp://10.0.0.7:5558"},
		{pattern: "tcp://{host}:5557", backend: "http://10.0.0.7:8000", wantPub: "tcp://10.0.0.7:5557"},
		{pattern: " tcp://{host}:{port+1000} ; tcp://{host}:{port-1} ", backend: "http://engine-3.svc:8000", wantPub: "tcp://engine-3.svc:9000", wantRepl: "tcp://engine-3.svc:7999"},
		{pattern: "tcp://{host}:{port}", backend: "https://[fd00::5]:8443", wantPub: "tcp://[fd00::5]:8443"},
		{pattern: "tcp://{host}:{port+1}", backend: "http://decode", wantPub: "tcp://decode:81"},
		{pattern: "tcp://events.local:5557", backend: "http://10.0.0.7:8000", wantPub: "tcp://events.local:5557"},
		{pattern: "tcp://{host}:{port+60000}", backend: "http://10.0.0.7:8000", wantErr: "out of range"},
		{pattern: "http://{host}:5557", backend: "http://10.0.0.7:8000", wantErr: "want tcp://"},
		{pattern: "tcp://{hostname}:5557", backend: "http://10.0.0.7:8000", wantErr: "want tcp://"},
		{pattern: "tcp://{host}:{port*2}", backend: "http://10.0.0.7:8000", wantErr: "want tcp://"},
		{pattern: ";tcp://{host}:5558", backend: "http://10.0.0.7:8000", wantErr: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.backend, func(t *testing.T) {
			pt, err := kvindex.ParsePattern(tt.pattern)
			var pub, replay string
			if err == nil {
				pub, replay, err = pt.Expand(tt.backend)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %q %q %v, want an error with %q", pub, replay, err, tt.wantErr)
				}
				return
			}
			if err != nil || pub != tt.wantPub || replay != tt.wantRepl {
				t.Errorf("got %q %q %v, want %q %q", pub, replay, err, tt.wantPub, tt.wantRepl)
			}
		})
	}
}

// listenNear listens on 127.0.0.1 at a port a little above port, so that
// the KV-event pattern can name port by an offset from it.
func listenNear(t *testing.T, port int) (net.Listener, int) {
	for off := 1; off < 200; off++ {
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+off)); err == nil {
			return ln, off
		}
	}
	t.Skip("no free port near the publisher's")
	return nil, 0
}

// TestFollowerFollowsDecodesAddedAtRunTime: a decode added to the pool at
// run time (SetBackends: the backends file, the admin endpoint, discovery)
// is followed at the endpoints the pattern derives from its URL, its KV
// events then steer its cached prompt to it; removed, it is unfollowed and
// the index forgets it.
func TestFollowerFollowsDecodesAddedAtRunTime(t *testing.T) {
	tok := fixtureTokenizer(t)
	pub := startPublisher(t)
	pubPort := pub.Addr().(*net.TCPAddr).Port
	replayPort := pub.ReplayAddr().(*net.TCPAddr).Port

	// d1's HTTP port is a few above its PUB port; the pattern says so.
	ln, off := listenNear(t, pubPort)
	d1 := newEngine(t, false)
	d1.srv.Close()
	d1.srv = httptest.NewUnstartedServer(d1.srv.Config.Handler)
	d1.srv.Listener = ln
	d1.srv.Start()
	t.Cleanup(d1.srv.Close)
	d1URL, _ := proxy.NormalizeBackendURL(d1.srv.URL)
	d1Port := pubPort + off
	pattern, err := kvindex.ParsePattern(fmt.Sprintf("tcp://{host}:{port-%d};tcp://{host}:{port%+d}", off, replayPort-d1Port))
	if err != nil {
		t.Fatal(err)
	}

	cached := strings.Repeat("once upon a time there was a little girl who liked to play. ", 12)
	ids := cacheOnEngine(t, pub, tok, cached)
	pub.Flush() // published before anyone follows d1: the replay brings it

	idx := kvindex.New(fingerprint, 16, quiet)
	t.Cleanup(idx.Close)
	fol := kvindex.NewFollower(idx, nil, pattern, quiet)
	held := func() int { return heldBy(idx, ids, d1URL) }

	pre, d0 := newEngine(t, true), newEngine(t, false)
	p, url := startPrefixProxy(t, tok, idx, pre, []*fakeEngine{d0}, fol.BackendsChanged)
	if pd := send(t, url, "before", cached); pd != "remote" {
		t.Fatalf("before d1 joins: x-tandem-pd %q, want remote (no decode holds the prompt)", pd)
	}

	if err := p.SetBackends("decode", []string{d0.srv.URL, d1.srv.URL}); err != nil {
		t.Fatal(err)
	}
	want := len(ids) / 16
	deadline := time.Now().Add(5 * time.Second)
	for held() != want {
		if time.Now().After(deadline) {
			st, _ := idx.Stats(d1URL)
			t.Fatalf("d1 holds %d of %d blocks in the index 5s after joining (subscriber %+v)", held(), want, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pd := send(t, url, "after", cached); pd != "local; reason=short_uncached" || !d1.got("after") {
		t.Errorf("after d1 joined: x-tandem-pd %q, on d1 %v; want local on d1", pd, d1.got("after"))
	}

	if err := p.SetBackends("decode", []string{d0.srv.URL}); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Errorf("d1 removed: the index still holds %d of its blocks", n)
	}
	if _, followed := idx.Stats(d1URL); followed {
		t.Error("d1 removed: still followed")
	}
}
