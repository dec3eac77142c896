package kvevents

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvevents/zmtp"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// These tests run publishers and subscribers over real loopback sockets.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const testFingerprint = "model-fp"

// startPublisher binds a publisher on loopback (replay too when replay is
// set); addrs, if given, are the PUB and replay addresses to reuse.
func startPublisher(t *testing.T, replay bool, addrs ...string) *Publisher {
	t.Helper()
	cfg := Config{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@test@stories", BufferSteps: 100, HWM: 1000, MaxQueueSize: 1000}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	if len(addrs) > 0 {
		cfg.Endpoint = "tcp://" + addrs[0]
		if replay {
			cfg.ReplayEndpoint = "tcp://" + addrs[1]
		}
	}
	p, err := NewPublisher(cfg, PublisherOptions{BlockSize: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.shutdown(false, 0) })
	return p
}

func engineOf(name string, p *Publisher) Engine {
	e := Engine{Name: name, Endpoint: "tcp://" + p.Addr().String(), Topic: "kv@"}
	if a := p.ReplayAddr(); a != nil {
		e.ReplayEndpoint = "tcp://" + a.String()
	}
	return e
}

func startSubscriber(t *testing.T, engines ...Engine) (*Index, *Subscriber) {
	t.Helper()
	idx := NewIndex()
	sub := NewSubscriber(idx, SubscriberOptions{Logger: quiet, Timeout: 2 * time.Second})
	t.Cleanup(sub.Close)
	for _, e := range engines {
		if err := sub.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	return idx, sub
}

func waitSubscribed(t *testing.T, p *Publisher) {
	t.Helper()
	testutil.WaitFor(t, "the subscriber subscribed", 10*time.Second, func() bool { return p.Stats().Subscribers == 1 })
}

// waitConnected waits until sub follows engine's live messages, its
// connection's replay done.
func waitConnected(t *testing.T, sub *Subscriber, engine string) {
	t.Helper()
	testutil.WaitFor(t, engine+" followed live", 10*time.Second, func() bool { st, _ := sub.Stats(engine); return st.Connected })
}

// matched returns how many leading blocks of tokens engine holds.
func matched(idx *Index, engine string, tokens []int32) int {
	for _, h := range idx.Match(BlockHashes(testFingerprint, 4, tokens), nil) {
		if h.Engine == engine {
			return h.Blocks
		}
	}
	return 0
}

func seqTokens(from, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(from + i)
	}
	return t
}

// cacheTokens does what the scheduler does for a computed prompt: hash its
// full blocks, allocate and register them. It returns the block ids.
func cacheTokens(t *testing.T, b *kvcache.Blocks, tokens []int32) []int32 {
	t.Helper()
	hashes := b.ExtendHashes(nil, tokens)
	ids, ok := b.Allocate(len(hashes))
	if !ok {
		t.Fatalf("no room for %d blocks", len(hashes))
	}
	for i, id := range ids {
		b.Cache(id, hashes[i])
	}
	return ids
}

func TestStoredAndRemovedBlocksReachTheIndex(t *testing.T) {
	pub := startPublisher(t, true)
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 4, ExtraKey: testFingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	// A batch published before anyone subscribed: the subscriber's replay
	// on connect brings it.
	early := seqTokens(100, 4)
	earlyIDs := cacheTokens(t, blocks, early)
	pub.Flush()
	idx, sub := startSubscriber(t, engineOf("e1", pub))
	testutil.WaitFor(t, "the early block is indexed", 10*time.Second, func() bool { return matched(idx, "e1", early) == 1 })
	waitSubscribed(t, pub)

	prompt := seqTokens(1, 10) // two full blocks and a partial one
	ids := cacheTokens(t, blocks, prompt)
	pub.Flush()
	testutil.WaitFor(t, "the prompt's blocks are indexed", 10*time.Second, func() bool { return matched(idx, "e1", prompt) == 2 })
	if got := matched(idx, "e1", append(seqTokens(1, 4), 99, 98, 97, 96)); got != 1 {
		t.Errorf("a prompt sharing the first block matches %d blocks, want 1", got)
	}

	// Freeing keeps the blocks cached; taking every block for new content
	// evicts them all.
	if err := blocks.Free(append(ids, earlyIDs...)); err != nil {
		t.Fatal(err)
	}
	if _, ok := blocks.Allocate(4); !ok {
		t.Fatal("allocate 4")
	}
	pub.Flush()
	testutil.WaitFor(t, "evicted blocks leave the index", 10*time.Second, func() bool { return idx.Blocks("e1") == 0 })
	st, _ := sub.Stats("e1")
	if st.Gaps != 0 || st.Lost != 0 || st.Restarts != 0 || st.Malformed != 0 {
		t.Errorf("stats %+v: want no gap, loss, restart or malformed batch", st)
	}
}

func TestOneStepsBlocksAreOneEvent(t *testing.T) {
	pub := startPublisher(t, false)
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(1, 12)
	ids := cacheTokens(t, blocks, prompt)
	if len(pub.pending) != 1 {
		t.Fatalf("%d pending events for one request's 3 blocks, want 1: %+v", len(pub.pending), pub.pending)
	}
	e := pub.pending[0]
	want := BlockHashes(testFingerprint, 4, prompt)
	if e.Kind != BlockStored || len(e.Hashes) != 3 || e.Hashes[0] != want[0] || e.Hashes[2] != want[2] || e.HasParent || len(e.Tokens) != 12 || e.BlockSize != 4 || e.Medium != "GPU" {
		t.Fatalf("event %+v, want one BlockStored of the 3 blocks, their 12 tokens, no parent", e)
	}
	pub.Flush()
	// A block of the same request cached in a later step names its parent.
	more := append(prompt, seqTokens(13, 4)...)
	hashes := blocks.ExtendHashes(blocks.ExtendHashes(nil, prompt), more)
	extra, _ := blocks.Allocate(1)
	blocks.Cache(extra[0], hashes[3])
	blocks.Uncache(ids[0])
	pub.Flush()
	pub.Flush() // nothing pending: no batch
	// A barrier: one more event, flushed. Had the empty Flush published a
	// batch, the barrier's would be the fourth, not the third.
	blocks.Uncache(ids[1])
	pub.Flush()
	testutil.WaitFor(t, "three batches published", 10*time.Second, func() bool { return pub.Stats().Published >= 3 })
	batches := pub.ring.from(0)
	if len(batches) != 3 {
		t.Fatalf("%d batches published, want 3 (two, then the barrier's)", len(batches))
	}
	batch, err := DecodeBatch(batches[1].payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Events) != 2 || !batch.Events[0].HasParent || batch.Events[0].Parent != want[2] || len(batch.Events[0].Tokens) != 4 ||
		batch.Events[1].Kind != BlockRemoved || batch.Events[1].Hashes[0] != want[0] {
		t.Fatalf("batch %+v: want a store whose parent is block 2, then the removal of block 0", batch.Events)
	}
	barrier, err := DecodeBatch(batches[2].payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(barrier.Events) != 1 || barrier.Events[0].Kind != BlockRemoved || barrier.Events[0].Hashes[0] != want[1] {
		t.Fatalf("third batch %+v: want the barrier's removal of block 1 (an empty Flush published a batch?)", barrier.Events)
	}
}

// publishLosingOne caches three prompts of one block each, a batch per
// prompt, on a publisher (with a replay socket or not) that loses batch 1
// on the wire, and returns, once a subscriber following it as e1 has
// applied the last batch, the subscriber's index, the subscriber and the
// prompts.
func publishLosingOne(t *testing.T, replay bool) (*Index, *Subscriber, [][]int32) {
	t.Helper()
	pub := startPublisher(t, replay)
	pub.skipForTest = func(seq uint64) bool { return seq == 1 }
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	idx, sub := startSubscriber(t, engineOf("e1", pub))
	waitSubscribed(t, pub)
	waitConnected(t, sub, "e1")
	prompts := [][]int32{seqTokens(0, 4), seqTokens(100, 4), seqTokens(200, 4)}
	for _, p := range prompts {
		cacheTokens(t, blocks, p)
		pub.Flush()
	}
	testutil.WaitFor(t, "the last batch applied", 10*time.Second, func() bool {
		st, _ := sub.Stats("e1")
		return st.Next == 3
	})
	return idx, sub, prompts
}

func TestLostMessageIsRecoveredThroughReplay(t *testing.T) {
	idx, sub, prompts := publishLosingOne(t, true)
	for i, p := range prompts {
		if got := matched(idx, "e1", p); got != 1 {
			t.Errorf("prompt %d matches %d blocks, want 1", i, got)
		}
	}
	st, _ := sub.Stats("e1")
	if st.Gaps != 1 || st.Lost != 0 || st.Restarts != 0 {
		t.Errorf("stats %+v: want one gap, recovered", st)
	}
}

func TestLostMessageWithoutReplayClearsTheEngine(t *testing.T) {
	idx, sub, prompts := publishLosingOne(t, false)
	// Batch 1 may have removed what batch 0 stored: the engine's entries
	// are cleared and only what came after the loss is known.
	if got := []int{matched(idx, "e1", prompts[0]), matched(idx, "e1", prompts[1]), matched(idx, "e1", prompts[2])}; got[0] != 0 || got[1] != 0 || got[2] != 1 {
		t.Errorf("matches %v, want [0 0 1]", got)
	}
	if st, _ := sub.Stats("e1"); st.Lost != 1 {
		t.Errorf("stats %+v: want one batch lost", st)
	}
}

func TestEngineRestartClearsItsEntries(t *testing.T) {
	for _, replay := range []bool{true, false} {
		name := "without a replay socket"
		if replay {
			name = "with a replay socket"
		}
		t.Run(name, func(t *testing.T) {
			first := startPublisher(t, replay)
			blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: first})
			if err != nil {
				t.Fatal(err)
			}
			other := startPublisher(t, replay) // a second engine, to show it is untouched
			otherBlocks, _ := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: other})
			eng := engineOf("e1", first)
			idx, sub := startSubscriber(t, eng, engineOf("e2", other))
			waitSubscribed(t, first)
			waitSubscribed(t, other)
			old := seqTokens(0, 8)
			for _, p := range [][]int32{old[:4], old} {
				blocks.ExtendHashes(nil, p)
			}
			cacheTokens(t, blocks, old)
			first.Flush()
			cacheTokens(t, otherBlocks, old)
			other.Flush()
			cacheTokens(t, blocks, seqTokens(50, 4))
			first.Flush()
			testutil.WaitFor(t, "both engines' blocks are indexed", 10*time.Second, func() bool {
				return matched(idx, "e1", old) == 2 && matched(idx, "e2", old) == 2
			})

			// The engine dies (no AllBlocksCleared) and comes back on the
			// same addresses with an empty cache and sequence numbers from 0.
			addrs := []string{first.Addr().String(), ""}
			if replay {
				addrs[1] = first.ReplayAddr().String()
			}
			first.shutdown(false, 0)
			second := startPublisher(t, replay, addrs...)
			blocks2, _ := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: second})
			waitSubscribed(t, second)
			fresh := seqTokens(300, 4)
			cacheTokens(t, blocks2, fresh)
			second.Flush()

			testutil.WaitFor(t, "the new process's block is indexed", 10*time.Second, func() bool { return matched(idx, "e1", fresh) == 1 })
			if got := matched(idx, "e1", old); got != 0 {
				t.Errorf("the restarted engine still matches %d blocks of its old cache", got)
			}
			if got := idx.Blocks("e1"); got != 1 {
				t.Errorf("the restarted engine holds %d blocks in the index, want 1", got)
			}
			if got := matched(idx, "e2", old); got != 2 {
				t.Errorf("the other engine matches %d blocks, want 2", got)
			}
			if st, _ := sub.Stats("e1"); st.Restarts != 1 {
				t.Errorf("stats %+v: want one restart", st)
			}
		})
	}
}

func TestCloseAndRemoveClearEntries(t *testing.T) {
	pub := startPublisher(t, true)
	blocks, _ := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: pub})
	pub2 := startPublisher(t, true)
	blocks2, _ := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: testFingerprint, Observer: pub2})
	idx, sub := startSubscriber(t, engineOf("e1", pub), engineOf("e2", pub2))
	waitSubscribed(t, pub)
	waitSubscribed(t, pub2)
	p := seqTokens(0, 4)
	cacheTokens(t, blocks, p)
	pub.Flush()
	cacheTokens(t, blocks2, p)
	pub2.Flush()
	testutil.WaitFor(t, "both indexed", 10*time.Second, func() bool { return len(idx.Match(BlockHashes(testFingerprint, 4, p), nil)) == 2 })

	pub.Close(time.Second) // a graceful stop publishes AllBlocksCleared
	testutil.WaitFor(t, "e1 cleared", 10*time.Second, func() bool { return idx.Blocks("e1") == 0 })
	sub.Remove("e2")
	if idx.Blocks("e2") != 0 || idx.Engines() != 1 {
		t.Errorf("after removing e2: %d blocks, %d engines", idx.Blocks("e2"), idx.Engines())
	}
}

func TestReplaySocketAnswersLikeVLLMs(t *testing.T) {
	pub := startPublisher(t, true)
	for i := range 3 {
		pub.enqueue([]Event{{Kind: BlockRemoved, Hashes: []uint64{uint64(i)}}})
	}
	testutil.WaitFor(t, "three batches published", 10*time.Second, func() bool { return pub.Stats().Published == 3 })
	sub := NewSubscriber(NewIndex(), SubscriberOptions{Logger: quiet})
	var seqs []uint64
	es := &engineSub{eng: engineOf("e", pub)}
	if err := sub.replay(context.Background(), es, 1, func(seq uint64, p []byte) bool {
		seqs = append(seqs, seq)
		b, err := DecodeBatch(p)
		if err != nil || b.Events[0].Hashes[0] != seq {
			t.Errorf("batch %d: %+v, %v", seq, b, err)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Errorf("replay from 1 gave %v, want [1 2]", seqs)
	}
}

func TestPublishingNeverBlocksTheEngine(t *testing.T) {
	cfg := Config{Endpoint: "tcp://127.0.0.1:0", MaxQueueSize: 2, HWM: 1}
	p, err := NewPublisher(cfg, PublisherOptions{BlockSize: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer p.shutdown(false, 0)
	// A subscriber that never reads.
	z, err := zmtp.Dial(context.Background(), p.Addr().String(), zmtp.SUB, zmtp.Options{HandshakeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	if err := z.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "subscribed", 10*time.Second, func() bool { return p.Stats().Subscribers == 1 })
	start := time.Now()
	big := make([]uint64, 1<<14)
	for range 2000 {
		p.BlockRemoved(kvcache.BlockHash{})
		p.pending[0].Hashes = big
		p.Flush()
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("2000 flushes took %v", d)
	}
	testutil.WaitFor(t, "drops counted", 10*time.Second, func() bool { st := p.Stats(); return st.QueueDrops+st.PeerDrops > 0 })
}

func TestPublisherClosesSubscribersPastMaxSubscribers(t *testing.T) {
	cfg := Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@test", BufferSteps: 10, HWM: 10, MaxQueueSize: 10, MaxSubscribers: 1}
	p, err := NewPublisher(cfg, PublisherOptions{BlockSize: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer p.shutdown(false, 0)
	idx, sub := startSubscriber(t, engineOf("e1", p))
	waitSubscribed(t, p)
	waitConnected(t, sub, "e1")

	// A second subscriber is closed on accept.
	if z, err := zmtp.Dial(context.Background(), p.Addr().String(), zmtp.SUB, zmtp.Options{HandshakeTimeout: time.Second}); err == nil {
		z.Close()
		t.Fatal("a second subscriber connected with max_subscribers 1")
	}
	if st := p.Stats(); st.Rejected != 1 || st.Subscribers != 1 {
		t.Errorf("stats %+v: want one subscriber, one rejected", st)
	}

	// The first keeps receiving.
	p.enqueue([]Event{{Kind: BlockStored, Hashes: []uint64{42}, BlockSize: 4}})
	testutil.WaitFor(t, "the block is indexed", 10*time.Second, func() bool { return idx.Blocks("e1") == 1 })
}

// TestRealEngine runs stories260K with a publisher: the blocks of a prompt
// it computed reach the index under the hashes BlockHashes gives.
func TestRealEngine(t *testing.T) {
	st := loaded.Stories(t)
	m, tok := st.Model, st.Tokenizer
	cfg := Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@engine@stories260K", BufferSteps: 100, HWM: 1000, MaxQueueSize: 100}
	pub, err := NewPublisher(cfg, PublisherOptions{BlockSize: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.shutdown(false, 0)
	eng, err := engine.New(engine.Config{Model: m, Tokenizer: tok, BlockSize: 16, NumBlocks: 64, KVDir: t.TempDir(), Logger: quiet, KVEvents: pub})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Shutdown(context.Background())
	idx, _ := startSubscriber(t, engineOf("engine", pub))

	prompt := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends every day.", true)
	if len(prompt) < 33 {
		t.Fatalf("prompt of %d tokens, want at least two full blocks", len(prompt))
	}
	h, err := eng.Submit(context.Background(), &engine.Request{ID: "r1", Prompt: prompt, Params: sample.Params{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	for range h.Events {
	}
	want := len(prompt) / 16
	hashes := BlockHashes(m.Fingerprint(), 16, prompt)
	testutil.WaitFor(t, "the prompt's full blocks are indexed", 10*time.Second, func() bool {
		hits := idx.Match(hashes, nil)
		return len(hits) == 1 && hits[0].Engine == "engine" && hits[0].Blocks == want
	})
	if st := pub.Stats(); st.StoredWithoutTokens != 0 || st.QueueDrops != 0 {
		t.Errorf("publisher stats %+v: want every block with its tokens, nothing dropped", st)
	}
}

// TestPublisherWritesTheConfiguredEventEncoding: events go out as maps
// unless event_encoding asks for arrays.
func TestPublisherWritesTheConfiguredEventEncoding(t *testing.T) {
	for _, tc := range []struct {
		json      string
		enc       Encoding
		eventHead byte // the first event's msgpack header: a map or an array of 3
	}{
		{`{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:0"}`, EncodingMap, 0x83},
		{`{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:0", "event_encoding": "array"}`, EncodingArray, 0x93},
	} {
		t.Run(tc.enc.String(), func(t *testing.T) {
			cfg, err := ParseConfig(tc.json)
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewPublisher(*cfg, PublisherOptions{BlockSize: 4, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.shutdown(false, 0) })
			p.BlockRemoved(kvcache.BlockHash{1})
			p.Flush()
			testutil.WaitFor(t, "a batch published", 10*time.Second, func() bool { return p.Stats().Published >= 1 })
			payload := p.ring.from(0)[0].payload
			b, err := DecodeBatch(payload)
			if err != nil {
				t.Fatal(err)
			}
			if want := AppendBatch(nil, b, tc.enc); !bytes.Equal(payload, want) {
				t.Errorf("published %x, want the %s form %x", payload, tc.enc, want)
			}
			// [ts, [event], rank]: array header, 9 bytes of ts, events header.
			if payload[11] != tc.eventHead {
				t.Errorf("first event starts %#x, want %#x", payload[11], tc.eventHead)
			}
		})
	}
}
