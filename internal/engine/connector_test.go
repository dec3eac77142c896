package engine

import (
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sched"
)

// remoteConnector loads every prompt of a request with kv_transfer_params
// asynchronously, as a decode engine's P/D connector would.
type remoteConnector struct{ sched.NoConnector }

func (remoteConnector) GetNumNewMatchedTokens(r *sched.Request, local int) (int, bool, error) {
	if r.KVParams == nil || r.NumPreemptions() > 0 {
		return 0, false, nil
	}
	n := len(r.Prompt) - local
	return n, n > 0, nil
}

// recordingWorker counts steps; loads complete through Engine.ReportKV.
type recordingWorker struct{ steps int }

func (w *recordingWorker) Step(sched.ConnectorMeta) (KVCompletions, error) {
	w.steps++
	return KVCompletions{}, nil
}

func TestConnectorPlumbing(t *testing.T) {
	w := &recordingWorker{}
	e, m := newEngine(t, Config{Connector: remoteConnector{}, KVWorker: w})
	_, _, g := load(t)
	submitted := time.Now()
	h, err := e.Submit(t.Context(), &Request{Prompt: g.GreedyIDs[:40], Params: greedy(4), KVTransfer: &kvparams.Params{DoRemotePrefill: true}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := e.Stats(); st.Waiting != 1 || st.FreeBlocks != st.TotalBlocks-3; st = e.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("request never started loading: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	loading := time.Since(submitted) // the queue ended before this
	select {
	case ev := <-h.Events:
		t.Fatalf("event %+v before the KV arrived", ev)
	case <-time.After(20 * time.Millisecond): // nothing may run before the load ends
	}
	e.ReportKV(KVCompletions{FinishedRecving: []string{h.ID}})
	r := collect(t, h)
	if len(r.tokens) != 4 || r.last.Finish != FinishLength {
		t.Errorf("%d tokens, finish %q; want 4 and length", len(r.tokens), r.last.Finish)
	}
	if got := value(t, m.PromptTokensBySrc.WithLabelValues("external_kv_transfer")); got != 40 {
		t.Errorf("prompt_tokens_by_source{external_kv_transfer} = %v, want 40", got)
	}
	if w.steps == 0 {
		t.Error("the worker half was never stepped")
	}
	// The load was reported at least 20 ms after it started: the first
	// token's Timing puts that in KVLoad, not in the queue (which ended
	// before the test saw the load under way: a loaded machine may make
	// it longer than the load, but never longer than that) or the prefill.
	if len(r.timings) != 1 {
		t.Fatalf("%d events carried a Timing, want the first token's only", len(r.timings))
	}
	if tm := r.timings[0]; tm.KVLoad < 20*time.Millisecond || tm.Queue < 0 || tm.Queue > loading || tm.Prefill <= 0 {
		t.Errorf("timing %+v: want a KV load of at least 20 ms, a queue within the %v until the load was seen under way, and a positive prefill", tm, loading)
	}
}

// TestTimingOfALocalRequest: a request without kv params queues behind a
// running one (max-num-seqs 1), loads nothing and computes its prompt; its
// first token's Timing says so, and the phases fit in its TTFT.
func TestTimingOfALocalRequest(t *testing.T) {
	e, _ := newEngine(t, Config{MaxNumSeqs: 1})
	_, _, g := load(t)
	first, err := e.Submit(t.Context(), &Request{Prompt: g.GreedyIDs[:20], Params: greedy(30)})
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	second, err := e.Submit(t.Context(), &Request{Prompt: g.GreedyIDs[:40], Params: greedy(2)})
	if err != nil {
		t.Fatal(err)
	}
	var ttft time.Duration
	var tm *Timing
	for ev := range second.Events {
		if len(ev.Tokens) > 0 && ttft == 0 {
			ttft, tm = time.Since(sent), ev.Timing
		}
	}
	collect(t, first)
	if tm == nil {
		t.Fatal("the first token carried no Timing")
	}
	if tm.KVLoad != 0 || tm.Queue <= 0 || tm.Prefill <= 0 || tm.Queue+tm.Prefill > ttft {
		t.Errorf("timing %+v with TTFT %v: want a queue (behind the first request), no KV load, a prefill, and their sum within the TTFT", tm, ttft)
	}
}
