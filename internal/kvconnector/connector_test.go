package kvconnector

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-serve/tandem/internal/clock"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// pdOpts configures one test engine.
type pdOpts struct {
	role      Role // "" for an engine without a connector
	blockSize int
	transport kvxfer.Transport
	policy    sched.LoadFailurePolicy
	clock     clock.Clock
	lease     time.Duration
	numBlocks int // default 128
	// multi-turn: bidirectional with the decode's hold TTL and the
	// prefill's recompute threshold (0: defaults)
	bidirectional bool
	holdTTL       time.Duration
	threshold     int
	// engineID and port, when set, replace a fresh UUID and a free port
	// (an engine restarted with the same --engine-id and --kv-port)
	engineID string
	port     int
	// abandoned: the test ends with blocks still allocated (a drain gave
	// up its holds), so the idle check at the end is skipped
	abandoned bool
	// secret, when set, is the cluster's KV secret (params are signed)
	secret kvxfer.Secret
	// tuneEngine and tuneConn, if set, change the engine's and the
	// connector's config last
	tuneEngine func(*engine.Config)
	tuneConn   func(*ConnectorConfig)
	// net, when set, carries the side channel in memory instead of over
	// loopback TCP (for tests under testing/synctest)
	net *testutil.MemNet
	// sweep, when set, replaces the 5 ms lease sweep interval
	sweep time.Duration
	// fwd, when set, is the model instead of stories260K (with its
	// tokenizer)
	fwd *model.Model
}

type pdEngine struct {
	e *engine.Engine
	c *Connector // nil without a role
	m *metrics.Engine
}

// newPD starts an engine on stories260K with its side channel on a free
// loopback port. When the test ends, its pool must be full again and no
// lease held.
func newPD(t *testing.T, o pdOpts) *pdEngine {
	t.Helper()
	st := loaded.Stories(t)
	m, tok := st.Model, st.Tokenizer
	if o.fwd != nil {
		m = o.fwd
	}
	pe := &pdEngine{m: metrics.NewEngine("stories260K")}
	cfg := engine.Config{
		Model: m, Tokenizer: tok, BlockSize: o.blockSize, NumBlocks: cmp.Or(o.numBlocks, 128),
		LoadFailurePolicy: o.policy, Metrics: pe.m, Logger: discardLogger(),
	}
	if o.role != "" {
		cc := ConnectorConfig{
			Role: o.role, EngineID: cmp.Or(o.engineID, uuid.NewString()), ModelFingerprint: m.Fingerprint(),
			Host: "127.0.0.1", Port: o.port, Lease: o.lease, Transport: o.transport,
			Bidirectional: o.bidirectional, DecodeHoldTTL: o.holdTTL, RecomputeThreshold: o.threshold, Secret: o.secret,
			HeartbeatInterval: 10 * time.Millisecond, SweepInterval: cmp.Or(o.sweep, 5*time.Millisecond), Clock: o.clock, Metrics: pe.m, Logger: discardLogger(),
		}
		if o.net != nil {
			cc.Listener, cc.Dial = o.net.Listen(), o.net.Dial
			cc.Transport = kvxfer.TransportTCP // no shared memory between in-memory engines
		}
		if o.tuneConn != nil {
			o.tuneConn(&cc)
		}
		c, err := NewConnector(cc)
		if err != nil {
			t.Fatal(err)
		}
		pe.c = c
		cfg.Connector, cfg.KVWorker = c, c
	}
	if o.tuneEngine != nil {
		o.tuneEngine(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pe.e = e
	t.Cleanup(func() {
		// Shut down even when the idle check fails, so that no goroutine
		// outlives a synctest bubble.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		}()
		if !o.abandoned {
			pe.waitIdle(t)
		}
	})
	if pe.c != nil {
		if err := pe.c.Start(e); err != nil {
			t.Fatal(err)
		}
	}
	return pe
}

// waitIdle waits until the pool is full again and no lease is held.
func (p *pdEngine) waitIdle(t *testing.T) {
	t.Helper()
	var st engine.Stats
	held, idle := 0, false
	defer func() {
		if !idle {
			t.Logf("last stats %+v, %d blocks held", st, held)
		}
	}()
	testutil.WaitFor(t, "an idle engine (every block free, no lease held)", 10*time.Second, func() bool {
		st = p.e.Stats()
		if p.c != nil {
			held = p.c.HeldBlocks()
		}
		return st.FreeBlocks == st.TotalBlocks && st.Running == 0 && st.Waiting == 0 && held == 0
	})
	idle = true
}

// usedBlocks returns how many blocks are allocated, once the engine has
// settled: no request running or waiting, and the published stats agree with
// the connector's count of held blocks. (Stats are a snapshot the step loop
// publishes after each step, so right after a request's final event they
// can still describe the step before it.)
func (p *pdEngine) usedBlocks(t *testing.T) int {
	t.Helper()
	var st engine.Stats
	used, settled := 0, false
	defer func() {
		if !settled {
			t.Logf("last stats %+v", st)
		}
	}()
	testutil.WaitFor(t, "a settled engine (nothing running or waiting, the stats agreeing with the held blocks)", 10*time.Second, func() bool {
		st = p.e.Stats()
		used = st.TotalBlocks - st.FreeBlocks
		settled = st.Running == 0 && st.Waiting == 0
		if p.c != nil {
			settled = settled && used == p.c.HeldBlocks()
		}
		return settled
	})
	return used
}

type outcome struct {
	tokens []int32
	final  engine.Event
}

func run(t *testing.T, e *engine.Engine, r *engine.Request) outcome {
	t.Helper()
	h, err := e.Submit(t.Context(), r)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	var o outcome
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-h.Events:
			if !ok {
				return o
			}
			o.tokens = append(o.tokens, ev.Tokens...)
			if ev.Finish != engine.FinishNone {
				o.final = ev
			}
		case <-timeout:
			t.Fatal("request did not finish within a minute")
		}
	}
}

// prefillParams is what a vLLM proxy sends the prefill leg.
func prefillParams() map[string]any {
	return map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
}

// wire reads params an engine returned as a JSON object, which tests edit
// as a client could.
func wire(t testing.TB, raw json.RawMessage) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// typed parses params as the API layer does before the engine sees them.
func typed(t testing.TB, kv map[string]any) *kvparams.Params {
	t.Helper()
	b, err := json.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := kvparams.Parse(b)
	if err != nil {
		t.Fatalf("kv_transfer_params %s: %v", b, err)
	}
	return &p
}

// peerIn returns the prefill and request that params name.
func peerIn(t testing.TB, kv map[string]any) (kvxfer.Peer, string) {
	p := typed(t, kv)
	return kvxfer.Peer{EngineID: p.RemoteEngineID, Host: p.RemoteHost, Port: p.RemotePort}, p.RemoteRequestID
}

// prefill runs the prefill leg on p and returns the params for the decode.
func prefill(t *testing.T, p *pdEngine, prompt []int32, params sample.Params) map[string]any {
	t.Helper()
	o := run(t, p.e, &engine.Request{Prompt: prompt, Params: params, KVTransfer: typed(t, prefillParams())})
	if o.final.Finish != engine.FinishLength && o.final.Finish != engine.FinishStop || len(o.tokens) != 1 {
		t.Fatalf("prefill leg: %d tokens, finish %q (%v); want 1 token", len(o.tokens), o.final.Finish, o.final.Err)
	}
	if o.final.KVTransfer == nil {
		t.Fatal("prefill leg returned no kv_transfer_params")
	}
	return wire(t, o.final.KVTransfer)
}

// decode runs the decode leg on d.
func decode(t *testing.T, d *pdEngine, prompt []int32, params sample.Params, kv map[string]any) outcome {
	t.Helper()
	return run(t, d.e, &engine.Request{Prompt: prompt, Params: params, KVTransfer: typed(t, kv)})
}

// promptOf returns n deterministic token ids (seeded by seed) in the
// model's vocabulary.
func promptOf(seed uint64, n int) []int32 {
	r := rand.New(rand.NewPCG(seed, 1))
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(1 + r.IntN(500))
	}
	return p
}

func greedy(n int) sample.Params {
	return sample.Params{MaxTokens: n, IgnoreEOS: true, Logprobs: -1}
}

func seeded(n int) sample.Params {
	return sample.Params{MaxTokens: n, IgnoreEOS: true, Logprobs: -1, Temperature: 0.9, TopP: 0.95, Seed: 7, HasSeed: true}
}

// peerOf returns the kvxfer.Info of a consumer compatible with prefill p.
func peerOf(p *pdEngine, id string) kvxfer.Info {
	in := p.c.prod.Info()
	in.EngineID, in.Lease, in.Shm = id, 0, kvxfer.ShmLayout{}
	return in
}

func counter(t *testing.T, m *metrics.Engine, source string) float64 {
	t.Helper()
	return value(t, m.PromptTokensBySrc.WithLabelValues(source))
}

func TestDisaggregatedMatchesColocated(t *testing.T) {
	ref := newPD(t, pdOpts{})
	for _, tr := range []kvxfer.Transport{kvxfer.TransportTCP, kvxfer.TransportShm} {
		p := newPD(t, pdOpts{role: RolePrefill})
		d := newPD(t, pdOpts{role: RoleDecode, transport: tr})
		for _, n := range []int{5, 16, 17, 48, 250} {
			for i, params := range []sample.Params{greedy(12), seeded(12)} {
				name := []string{"greedy", "seeded"}[i]
				t.Run(string(tr)+"/"+name+"/"+strconv.Itoa(n)+" prompt tokens", func(t *testing.T) {
					// A prompt of its own, so no run hits another's blocks
					// in the decode's prefix cache.
					prompt := promptOf(uint64(4*n+2*i)+map[kvxfer.Transport]uint64{kvxfer.TransportTCP: 0, kvxfer.TransportShm: 1}[tr]*1000, n)
					want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: params})
					ext := counter(t, d.m, "external_kv_transfer")
					kv := prefill(t, p, prompt, params)
					if diff := gocmp.Diff([]any{"tp_size", 1.0, "remote_num_tokens", float64(n), "do_remote_prefill", true, "do_remote_decode", false},
						[]any{"tp_size", kv["tp_size"], "remote_num_tokens", kv["remote_num_tokens"], "do_remote_prefill", kv["do_remote_prefill"], "do_remote_decode", kv["do_remote_decode"]}); diff != "" {
						t.Errorf("prefill params (-want +got):\n%s", diff)
					}
					if ids := typed(t, kv).RemoteBlockIDs; len(ids) != 1 || len(ids[0]) != (n+15)/16 {
						t.Errorf("remote_block_ids %v: want %d blocks", kv["remote_block_ids"], (n+15)/16)
					}
					got := decode(t, d, prompt, params, kv)
					if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
						t.Errorf("decode tokens differ from the colocated engine's (-colocated +disaggregated):\n%s", diff)
					}
					if got.final.Finish != engine.FinishLength {
						t.Errorf("decode finish %q (%v), want length", got.final.Finish, got.final.Err)
					}
					pulled := counter(t, d.m, "external_kv_transfer") - ext
					if pulled != float64(n-1) {
						t.Errorf("prompt_tokens_by_source{external_kv_transfer} grew by %v, want %d (all but the last prompt token)", pulled, n-1)
					}
					if got.final.Usage.CachedTokens != n-1 {
						t.Errorf("usage cached tokens %d, want %d (transferred tokens count as cached)", got.final.Usage.CachedTokens, n-1)
					}
					p.waitIdle(t)
					d.waitIdle(t)
				})
			}
		}
	}
}

func TestDecodePrefixHits(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p := newPD(t, pdOpts{role: RolePrefill})
	d := newPD(t, pdOpts{role: RoleDecode})
	params := greedy(8)

	t.Run("a full local hit pulls nothing and frees the prefill's blocks", func(t *testing.T) {
		prompt := promptOf(101, 33) // 2 full blocks + 1 token: the decode needs KV for 32
		run(t, d.e, &engine.Request{Prompt: prompt, Params: greedy(1)})
		want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: params})
		bytes := value(t, d.m.KVTransferBytes)
		kv := prefill(t, p, prompt, params)
		if p.c.HeldBlocks() != 3 {
			t.Errorf("prefill holds %d blocks, want 3", p.c.HeldBlocks())
		}
		got := decode(t, d, prompt, params, kv)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("tokens (-colocated +disaggregated):\n%s", diff)
		}
		if b := value(t, d.m.KVTransferBytes) - bytes; b != 0 {
			t.Errorf("%v bytes pulled for a full local hit", b)
		}
		p.waitIdle(t) // freed by the notification, long before the 30 s lease
	})

	t.Run("a partial local hit pulls only the missing blocks", func(t *testing.T) {
		prompt := promptOf(102, 40)
		run(t, d.e, &engine.Request{Prompt: prompt[:35], Params: greedy(1)}) // caches 2 blocks
		want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: params})
		ext := counter(t, d.m, "external_kv_transfer")
		hits := counter(t, d.m, "local_cache_hit")
		bytes := value(t, d.m.KVTransferBytes)
		got := decode(t, d, prompt, params, prefill(t, p, prompt, params))
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("tokens (-colocated +disaggregated):\n%s", diff)
		}
		if e, h := counter(t, d.m, "external_kv_transfer")-ext, counter(t, d.m, "local_cache_hit")-hits; e != 7 || h != 32 {
			t.Errorf("prompt tokens: %v transferred, %v local hits; want 7 and 32", e, h)
		}
		bb := float64(d.e.KVPool().Layout().BlockBytes())
		if b := value(t, d.m.KVTransferBytes) - bytes; b != bb {
			t.Errorf("%v bytes pulled, want one block (%v)", b, bb)
		}
		if got.final.Usage.CachedTokens != 39 {
			t.Errorf("usage cached tokens %d, want 39", got.final.Usage.CachedTokens)
		}
	})
	p.waitIdle(t)
	d.waitIdle(t)
}

func TestRoleBothServesBothLegs(t *testing.T) {
	ref := newPD(t, pdOpts{})
	b := newPD(t, pdOpts{role: RoleBoth})
	prompt := promptOf(7, 50)
	want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(10)})
	// The same client id on both legs, as the proxy sends it.
	o := run(t, b.e, &engine.Request{ID: "req-1", Prompt: prompt, Params: greedy(10), KVTransfer: typed(t, prefillParams())})
	kv := wire(t, o.final.KVTransfer)
	got := run(t, b.e, &engine.Request{ID: "req-1", Prompt: prompt, Params: greedy(10), KVTransfer: typed(t, kv)})
	if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
		t.Errorf("tokens (-colocated +both):\n%s", diff)
	}
}

// TestLeases runs a prefill and a decode in fake time (testing/synctest,
// the side channel in memory), so the lease's 30 s pass in an instant and
// every sweep and heartbeat due by then has run before the test looks.
func TestLeases(t *testing.T) {
	prompt := promptOf(3, 40)
	// wait lets d pass in fake time and every goroutine due by then run.
	wait := func(d time.Duration) {
		time.Sleep(d)
		synctest.Wait()
	}
	// leased runs body in a bubble of its own with a prefill (30 s lease,
	// swept every 100 ms) and a decode.
	leased := func(name string, body func(t *testing.T, mem *testutil.MemNet, p, d *pdEngine)) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := testutil.NewMemNet()
				p := newPD(t, pdOpts{role: RolePrefill, lease: 30 * time.Second, net: mem, sweep: 100 * time.Millisecond})
				d := newPD(t, pdOpts{role: RoleDecode, net: mem})
				body(t, mem, p, d)
			})
		})
	}

	leased("expiry frees the prefill's blocks and a later pull fails clearly", func(t *testing.T, _ *testutil.MemNet, p, d *pdEngine) {
		kv := prefill(t, p, prompt, greedy(4))
		if got := p.usedBlocks(t); got != 3 {
			t.Fatalf("%d blocks in use after the prefill, want the 3 held", got)
		}
		if v := value(t, p.m.KVBlocksHeld); v != 3 {
			t.Errorf("tandem:kv_blocks_held = %v, want 3", v)
		}
		expired := value(t, p.m.KVLeasesExpired)
		wait(29 * time.Second) // 290 sweeps
		if got := p.usedBlocks(t); got != 3 {
			t.Fatalf("blocks freed before the lease ran out (%d in use)", got)
		}
		wait(2 * time.Second)
		if got := p.usedBlocks(t); got != 0 {
			t.Fatalf("%d blocks in use a second after the lease ran out", got)
		}
		p.waitIdle(t)
		if v := value(t, p.m.KVLeasesExpired) - expired; v != 1 {
			t.Errorf("tandem:kv_leases_expired_total grew by %v, want 1", v)
		}
		got := decode(t, d, prompt, greedy(4), kv)
		if got.final.Finish != engine.FinishError || got.final.Err == nil || !strings.Contains(got.final.Err.Error(), "lease expired") {
			t.Errorf("decode after expiry: finish %q, err %v; want an error saying the lease expired", got.final.Finish, got.final.Err)
		}
	})

	leased("DONE frees at once and a read after release fails clearly", func(t *testing.T, _ *testutil.MemNet, p, d *pdEngine) {
		kv := prefill(t, p, prompt, greedy(4))
		if got := decode(t, d, prompt, greedy(4), kv); got.final.Finish != engine.FinishLength {
			t.Fatalf("decode: finish %q, err %v", got.final.Finish, got.final.Err)
		}
		p.waitIdle(t)
		failures := value(t, d.m.KVTransferFailures.WithLabelValues("not_held"))
		got := decode(t, d, prompt, greedy(4), kv)
		if got.final.Finish != engine.FinishError || got.final.Err == nil || !strings.Contains(got.final.Err.Error(), "already released") {
			t.Errorf("second read: finish %q, err %v; want an error saying the KV was already released", got.final.Finish, got.final.Err)
		}
		if v := value(t, d.m.KVTransferFailures.WithLabelValues("not_held")) - failures; v != 1 {
			t.Errorf("tandem:kv_transfer_failures_total{reason=not_held} grew by %v, want 1", v)
		}
	})

	leased("heartbeats keep the blocks past the lease", func(t *testing.T, mem *testutil.MemNet, p, _ *pdEngine) {
		kv := prefill(t, p, prompt, greedy(4))
		hb, err := kvxfer.NewConsumer(kvxfer.ConsumerConfig{Local: peerOf(p, "heartbeater"), HeartbeatInterval: time.Second, Dial: mem.Dial, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer hb.Close()
		peer, id := peerIn(t, kv)
		hb.Watch(peer, id)
		for range 4 { // 4 × 15 s = twice the lease
			wait(15 * time.Second)
			if got := p.usedBlocks(t); got != 3 {
				t.Fatalf("heartbeated blocks freed (%d in use)", got)
			}
		}
		hb.Unwatch(peer, id)
		// The last heartbeat extended the lease to at most 2/3 of it
		// (20 s) ahead; then it expires.
		wait(21 * time.Second)
		if got := p.usedBlocks(t); got != 0 {
			t.Fatalf("%d blocks in use 21 s after the last heartbeat", got)
		}
	})
}

func TestLoadFailurePolicies(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p := newPD(t, pdOpts{role: RolePrefill})
	prompt := promptOf(11, 45)
	want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(10)})

	// released returns params whose KV the prefill no longer holds.
	released := func(t *testing.T) map[string]any {
		c, err := kvxfer.NewConsumer(kvxfer.ConsumerConfig{Local: peerOf(p, "releaser"), Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		kv := prefill(t, p, prompt, greedy(10))
		peer, id := peerIn(t, kv)
		if err := c.Notify(t.Context(), peer, id); err != nil {
			t.Fatal(err)
		}
		p.waitIdle(t)
		return kv
	}

	t.Run("fail finishes with an error naming the reason and caches nothing", func(t *testing.T) {
		d := newPD(t, pdOpts{role: RoleDecode, policy: sched.LoadFailureFail})
		kv := released(t)
		got := decode(t, d, prompt, greedy(10), kv)
		if got.final.Finish != engine.FinishError || got.final.Err == nil {
			t.Fatalf("finish %q, err %v; want an error", got.final.Finish, got.final.Err)
		}
		for _, s := range []string{"not_held", "policy \"fail\""} {
			if !strings.Contains(got.final.Err.Error(), s) {
				t.Errorf("error %q does not say %q", got.final.Err, s)
			}
		}
		// The error is the client's answer: the ids stay in the engine's log.
		for _, k := range []string{"remote_engine_id", "remote_request_id"} {
			if id := kv[k].(string); strings.Contains(got.final.Err.Error(), id) {
				t.Errorf("error %q names the prefill's %s %q", got.final.Err, k, id)
			}
		}
		if len(got.tokens) != 0 {
			t.Errorf("%d tokens from a failed load", len(got.tokens))
		}
		again := run(t, d.e, &engine.Request{Prompt: prompt, Params: greedy(1)})
		if again.final.Usage.CachedTokens != 0 {
			t.Errorf("%d prompt tokens hit the cache after a failed load; want none", again.final.Usage.CachedTokens)
		}
	})

	t.Run("recompute gives the same output as without failure", func(t *testing.T) {
		d := newPD(t, pdOpts{role: RoleDecode, policy: sched.LoadFailureRecompute})
		got := decode(t, d, prompt, greedy(10), released(t))
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("tokens (-colocated +recomputed):\n%s", diff)
		}
		if got.final.Finish != engine.FinishLength {
			t.Errorf("finish %q (%v), want length", got.final.Finish, got.final.Err)
		}
		if e := counter(t, d.m, "external_kv_transfer"); e != 0 {
			t.Errorf("%v prompt tokens counted as transferred after a failed load", e)
		}
	})
}

func TestHandshakeMismatch(t *testing.T) {
	clock := testutil.NewFakeClock(time.Unix(1_000_000, 0))
	p := newPD(t, pdOpts{role: RolePrefill, blockSize: 16, clock: clock})
	d := newPD(t, pdOpts{role: RoleDecode, blockSize: 8})
	prompt := promptOf(5, 6) // one block on both sides, so the params pass validation
	got := decode(t, d, prompt, greedy(4), prefill(t, p, prompt, greedy(4)))
	if got.final.Finish != engine.FinishError || got.final.Err == nil {
		t.Fatalf("finish %q, err %v; want an error", got.final.Finish, got.final.Err)
	}
	for _, s := range []string{"incompatible", "block size differs", "prefill engine", "has 16", "this decode engine has 8", "--block-size"} {
		if !strings.Contains(got.final.Err.Error(), s) {
			t.Errorf("error %q does not say %q", got.final.Err, s)
		}
	}
	// An incompatible decode cannot talk to the prefill, so the lease frees
	// the blocks.
	clock.Advance(kvxfer.DefaultLease + time.Second)
	p.waitIdle(t)
}

func TestAbortWhileWaitingForRemoteKV(t *testing.T) {
	// A producer that never answers a READ: the pull hangs until canceled.
	hang := make(chan struct{})
	defer close(hang)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := newPD(t, pdOpts{role: RoleDecode, transport: kvxfer.TransportTCP})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				<-hang
			}()
		}
	}()
	prompt := promptOf(9, 20)
	kv := map[string]any{"do_remote_prefill": true, "remote_engine_id": "silent", "remote_request_id": "r", "remote_host": "127.0.0.1",
		"remote_port": ln.Addr().(*net.TCPAddr).Port, "remote_block_ids": []any{[]any{0.0, 1.0}},
		promptDigestParam: kvparams.PromptDigest(d.c.cfg.ModelFingerprint, prompt)}
	ctx, cancel := context.WithCancel(t.Context())
	h, err := d.e.Submit(ctx, &engine.Request{Prompt: prompt, Params: greedy(4), KVTransfer: typed(t, kv)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the request loading into its 2 blocks", 10*time.Second, func() bool {
		st := d.e.Stats()
		return st.TotalBlocks-st.FreeBlocks == 2
	})
	cancel()
	for range h.Events {
	}
	d.waitIdle(t) // the pull was canceled and its blocks came back
}

func TestMalformedParamsAreRejectedBeforeAllocation(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill})
	d := newPD(t, pdOpts{role: RoleDecode})
	prompt := promptOf(1, 20) // 2 blocks
	good := func() map[string]any {
		return map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "e", "remote_request_id": "r",
			"remote_host": "127.0.0.1", "remote_port": 1.0, "remote_block_ids": []any{[]any{3.0, 4.0}}, "tp_size": 1.0, "remote_num_tokens": 20.0}
	}
	with := func(k string, v any) map[string]any {
		m := good()
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name string
		e    *pdEngine
		kv   map[string]any
		want string
	}{
		{"a missing engine id is named", d, with("remote_engine_id", nil), "remote_engine_id is missing"},
		{"several missing fields are all named", d, with("remote_host", nil), "remote_host is"},
		{"a numeric request id is refused", d, with("remote_request_id", 5.0), "remote_request_id must be a non-empty string"},
		{"a port out of range is refused", d, with("remote_port", 70000.0), "remote_port must be a TCP port"},
		{"a fractional port is refused", d, with("remote_port", 80.5), "remote_port must be a TCP port"},
		{"block ids that are not a list are refused", d, with("remote_block_ids", "0,1"), "remote_block_ids must be a list"},
		{"a negative block id is refused", d, with("remote_block_ids", []any{[]any{-1.0, 2.0}}), "remote_block_ids[0][0]"},
		{"too few blocks for the prompt are refused", d, with("remote_block_ids", []any{[]any{3.0}}), "lists 1 blocks but the 20-token prompt fills 2 blocks"},
		{"two KV groups are refused", d, with("remote_block_ids", []any{[]any{3.0, 4.0}, []any{5.0, 6.0}}), "2 KV-cache groups"},
		{"another tp size is refused", d, with("tp_size", 2.0), "tp_size 2 is not supported"},
		{"a different prompt length is refused", d, with("remote_num_tokens", 21.0), "remote_num_tokens is 21 but the prompt has 20"},
		{"a string flag is refused", d, with("do_remote_prefill", "yes"), "do_remote_prefill must be true or false"},
		{"both legs at once are refused", d, with("do_remote_decode", true), "both true"},
		{"a decode leg on a prefill engine names the role to use", p, good(), "--role decode or --role both"},
		{"a prefill leg on a decode engine names the role to use", d, prefillParams(), "--role prefill or --role both"},
		{"a malformed prompt digest is refused", d, with(promptDigestParam, "abc"), promptDigestParam + " must be the prefill's digest"},
		{"params without a prompt digest are refused", d, good(), "not issued by an engine of this cluster"},
		{"params for another prompt are refused", d, with(promptDigestParam, kvparams.PromptDigest(d.c.cfg.ModelFingerprint, prompt[1:])), "issued for another prompt"},
	}
	// Through the API, as clients send them: malformed fields are refused
	// where the params are parsed (package openai), the rest by the
	// connector in Submit.
	tok := loaded.Stories(t).Tokenizer
	servers := map[*pdEngine]*httptest.Server{}
	for _, e := range []*pdEngine{p, d} {
		srv, err := openai.NewServer(openai.Config{Backend: e.e, Tokenizer: tok, ModelName: "stories260K", Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		servers[e] = httptest.NewServer(srv)
		defer servers[e].Close()
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body, _ := json.Marshal(map[string]any{"model": "stories260K", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": tc.kv})
			ts := servers[tc.e]
			resp, err := ts.Client().Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string `json:"message"`
					Param   string `json:"param"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d (%v), want 400", resp.StatusCode, err)
			}
			if e.Error.Param != "kv_transfer_params" || !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("error %q (param %q), want kv_transfer_params saying %q", e.Error.Message, e.Error.Param, tc.want)
			}
			if st := tc.e.e.Stats(); st.FreeBlocks != st.TotalBlocks || st.Waiting != 0 {
				t.Errorf("state after a rejected request: %+v", st)
			}
		})
	}
}

func TestRejectedDecodeLegFreesThePrefill(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill})
	d := newPD(t, pdOpts{role: RoleDecode})
	prompt := promptOf(21, 30)
	kv := prefill(t, p, prompt, greedy(4))
	// max_tokens beyond the context window: refused before admission.
	_, err := d.e.Submit(t.Context(), &engine.Request{Prompt: prompt, Params: greedy(100000), KVTransfer: typed(t, kv)})
	if _, ok := errors.AsType[*engine.InvalidRequestError](err); !ok {
		t.Fatalf("Submit = %v, want an InvalidRequestError", err)
	}
	p.waitIdle(t) // notified, not left to the lease
}

func TestPortClashSaysWhichFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	st := loaded.Stories(t)
	m, tok := st.Model, st.Tokenizer
	c, err := NewConnector(ConnectorConfig{Role: RolePrefill, EngineID: "p", ModelFingerprint: m.Fingerprint(),
		Host: "127.0.0.1", Port: taken.Addr().(*net.TCPAddr).Port, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Model: m, Tokenizer: tok, NumBlocks: 16, Connector: c, KVWorker: c, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	if err := c.Start(e); err == nil || !strings.Contains(err.Error(), "pass a free --kv-port") {
		t.Errorf("Start on a taken port = %v, want an error naming --kv-port", err)
	}
}

func TestDecodeLegFailingBeforeAllocationFreesThePrefill(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill})
	d := newPD(t, pdOpts{role: RoleDecode, numBlocks: 4}) // 64 tokens
	prompt := promptOf(23, 40)
	kv := prefill(t, p, prompt, greedy(4))
	// 40 prompt + 40 output tokens need 5 blocks: the scheduler fails the
	// request before allocating anything.
	got := decode(t, d, prompt, greedy(40), kv)
	if got.final.Finish != engine.FinishError {
		t.Fatalf("finish %q (%v), want error", got.final.Finish, got.final.Err)
	}
	p.waitIdle(t) // notified, not left to the lease
}

func TestDecodeLegRefusedByTheAPIFreesThePrefill(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill})
	d := newPD(t, pdOpts{role: RoleDecode})
	tok := loaded.Stories(t).Tokenizer
	srv, err := openai.NewServer(openai.Config{Backend: d.e, Tokenizer: tok, ModelName: "stories260K", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	prompt := promptOf(25, 30)
	kv := prefill(t, p, prompt, greedy(4))
	if p.c.HeldBlocks() == 0 {
		t.Fatal("the prefill holds no blocks after its leg")
	}
	// top_p out of range: the API layer refuses the decode leg before the
	// engine sees it, and must still free the prefill's blocks.
	body, _ := json.Marshal(map[string]any{
		"model": "stories260K", "prompt": prompt, "max_tokens": 4, "top_p": 7, "kv_transfer_params": kv,
	})
	resp, err := ts.Client().Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	p.waitIdle(t) // notified at once; the lease (30 s) would outlast the wait
}

func discardLogger() *slog.Logger {
	if os.Getenv("KVXFER_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 1}))
}

// value reads a gauge or counter.
func value(t testing.TB, c prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	if g := d.GetGauge(); g != nil {
		return g.GetValue()
	}
	return d.GetCounter().GetValue()
}
