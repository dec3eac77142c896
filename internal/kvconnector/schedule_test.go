package kvconnector

import (
	"net"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// ownModel loads a stories260K instance of its own for an engine that runs
// while another test engine does: a model's scratch space is not shared
// between concurrent forward passes.
func ownModel(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.Load(testmodels.Stories260K(t), tensor.NewPool(1))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stepRecorder wraps a decode engine's connector to count the engine's
// steps (one KVWorker.Step each), and to note the step in which each
// request was added and the step whose connector metadata started its pull.
type stepRecorder struct {
	*Connector
	mu     sync.Mutex
	steps  int
	added  map[string]int
	pulled map[string]int
}

func (r *stepRecorder) OnNewRequest(q *sched.Request) {
	r.mu.Lock()
	r.added[q.ID] = r.steps
	r.mu.Unlock()
	r.Connector.OnNewRequest(q)
}

func (r *stepRecorder) Step(meta sched.ConnectorMeta) (engine.KVCompletions, error) {
	r.mu.Lock()
	r.steps++
	if m, ok := meta.(*connMeta); ok && m != nil {
		for _, p := range m.pulls {
			r.pulled[p.id] = r.steps
		}
	}
	r.mu.Unlock()
	return r.Connector.Step(meta)
}

// TestBusyDecodeStartsAPullWithinOneStep: a decode engine whose 16 running
// streams spend the whole token budget of every step gets a new P/D
// request; its pull starts in the first step after the engine took it, not
// once a stream finishes, and its output is the colocated engine's. The
// decode runs with the prefill cadence on.
func TestBusyDecodeStartsAPullWithinOneStep(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p := newPD(t, pdOpts{role: RolePrefill})
	var rec *stepRecorder
	own := ownModel(t)
	d := newPD(t, pdOpts{role: RoleDecode, numBlocks: 512, tuneEngine: func(c *engine.Config) {
		c.Model = own
		rec = &stepRecorder{Connector: c.Connector.(*Connector), added: map[string]int{}, pulled: map[string]int{}}
		c.Connector, c.KVWorker = rec, rec
		c.MaxNumBatchedTokens = 16
		c.PrefillScheduleInterval = 4
	}})

	wantStreams := make([]outcome, 16)
	for i := range wantStreams {
		wantStreams[i] = run(t, ref.e, &engine.Request{Prompt: promptOf(uint64(100+i), 8), Params: greedy(200)})
	}
	prompt := promptOf(7, 90)
	want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(12)})

	var wg sync.WaitGroup
	streams := make([]outcome, 16)
	for i := range streams {
		wg.Go(func() {
			streams[i] = run(t, d.e, &engine.Request{Prompt: promptOf(uint64(100+i), 8), Params: greedy(200)})
		})
	}
	testutil.WaitFor(t, "16 streams running and none waiting", 10*time.Second, func() bool { st := d.e.Stats(); return st.Running == 16 && st.Waiting == 0 })

	kv := prefill(t, p, prompt, greedy(12))
	got := decode(t, d, prompt, greedy(12), kv)
	if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
		t.Errorf("decode tokens differ from the colocated engine's (-colocated +disaggregated):\n%s", diff)
	}
	rec.mu.Lock()
	if len(rec.pulled) != 1 {
		t.Fatalf("pulls %v, want one", rec.pulled)
	}
	for id, step := range rec.pulled {
		if added := rec.added[id]; step != added+1 {
			t.Errorf("the pull started in step %d, the request was added after step %d: want the next step", step, added)
		}
	}
	rec.mu.Unlock()
	wg.Wait()
	for i, s := range streams {
		if !gocmp.Equal(wantStreams[i].tokens, s.tokens) {
			t.Errorf("stream %d differs from the colocated engine's", i)
		}
	}
	d.waitIdle(t)
	p.waitIdle(t)
}

// TestCadenceKeepsOutputsBitIdentical: a colocated engine with the prefill
// cadence on gives every request the tokens an engine without it gives,
// greedy and seeded, while the cadence defers or lifts prefill steps.
func TestCadenceKeepsOutputsBitIdentical(t *testing.T) {
	ref := newPD(t, pdOpts{})
	own := ownModel(t)
	c := newPD(t, pdOpts{numBlocks: 512, tuneEngine: func(c *engine.Config) {
		c.Model = own
		c.MaxNumBatchedTokens = 32
		c.PrefillScheduleInterval = 4
	}})
	first := make(chan struct{})
	var wg sync.WaitGroup
	var long outcome
	wg.Go(func() {
		h, err := c.e.Submit(t.Context(), &engine.Request{Prompt: promptOf(1, 10), Params: greedy(150)})
		if err != nil {
			t.Error(err)
			close(first)
			return
		}
		for ev := range h.Events {
			if len(long.tokens) == 0 {
				close(first)
			}
			long.tokens = append(long.tokens, ev.Tokens...)
		}
	})
	<-first // a request decodes: the cadence has something to protect
	type job struct {
		prompt []int32
		params sample.Params
	}
	var jobs []job
	for i := range 8 {
		params := greedy(20)
		if i%2 == 1 {
			params = seeded(20)
		}
		jobs = append(jobs, job{promptOf(uint64(20+i), 20+15*i), params})
	}
	outs := make([]outcome, len(jobs))
	for i, j := range jobs {
		wg.Go(func() {
			outs[i] = run(t, c.e, &engine.Request{Prompt: j.prompt, Params: j.params})
		})
	}
	wg.Wait()
	if w := run(t, ref.e, &engine.Request{Prompt: promptOf(1, 10), Params: greedy(150)}); !gocmp.Equal(w.tokens, long.tokens) {
		t.Error("the decoding request's tokens differ with the cadence on")
	}
	for i, j := range jobs {
		w := run(t, ref.e, &engine.Request{Prompt: j.prompt, Params: j.params})
		if diff := gocmp.Diff(w.tokens, outs[i].tokens); diff != "" {
			t.Errorf("request %d (%d prompt tokens) (-without cadence +with):\n%s", i, len(j.prompt), diff)
		}
	}
	if n := value(t, c.m.PrefillStepsDeferred) + value(t, c.m.PrefillCadenceLifted); n == 0 {
		t.Error("the cadence never deferred nor lifted a step: it was not on")
	}
}

// TestStuckPullEndsAtItsDeadline: a pull from a side channel that accepts
// and never answers fails at the connector's pull deadline — well before
// the transfer layer's own dial timeout — and the load-failure policy
// handles its request: an error under fail, the colocated output under
// recompute.
func TestStuckPullEndsAtItsDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	ref := newPD(t, pdOpts{})
	p := newPD(t, pdOpts{role: RolePrefill, lease: time.Second})
	prompt := promptOf(3, 40)
	want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(6)})
	for _, policy := range []sched.LoadFailurePolicy{sched.LoadFailureFail, sched.LoadFailureRecompute} {
		t.Run(string(policy), func(t *testing.T) {
			d := newPD(t, pdOpts{role: RoleDecode, policy: policy, transport: "tcp", tuneConn: func(c *ConnectorConfig) { c.PullTimeout = 200 * time.Millisecond }})
			kv := prefill(t, p, prompt, greedy(6))
			kv["remote_port"] = float64(ln.Addr().(*net.TCPAddr).Port)
			start := time.Now()
			got := decode(t, d, prompt, greedy(6), kv)
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("the stuck pull ended after %v, want about its 200ms deadline (the dial timeout is 5s)", took)
			}
			if n := value(t, d.m.KVTransferFailures.WithLabelValues("io")); n != 1 {
				t.Errorf("%v io failures counted, want 1", n)
			}
			switch policy {
			case sched.LoadFailureFail:
				if got.final.Finish != engine.FinishError {
					t.Errorf("finish %q, want error", got.final.Finish)
				}
			case sched.LoadFailureRecompute:
				if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
					t.Errorf("tokens (-colocated +recomputed):\n%s", diff)
				}
			}
			d.waitIdle(t)
		})
	}
	p.waitIdle(t) // the prefill's holds end with their lease
}
