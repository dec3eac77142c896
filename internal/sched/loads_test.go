package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// loading returns the ids of the requests in WAITING_FOR_REMOTE_KVS.
func (h *harness) loading() []string {
	var out []string
	for _, r := range h.s.waiting {
		if r.status == WaitingForRemoteKVs {
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out
}

// remote adds a request whose whole prompt the connector loads
// asynchronously.
func (h *harness) remote(id string, p []int32, maxTokens int) *Request {
	h.t.Helper()
	h.conn.offer[id], h.conn.async[id], h.conn.once[id] = -1, true, true
	return h.add(id, p, maxTokens)
}

func TestLoadsStartOnTime(t *testing.T) {
	t.Run("a load is admitted in the step it arrives although decodes spend the budget", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 64, Config{MaxNumBatchedTokens: 2}, c)
		h.add("a", prompt(1, 1), 10)
		h.add("b", prompt(2, 1), 10)
		h.step()
		r := h.remote("r", prompt(3, 12), 3)
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"a@1+1", "b@1+1"}) {
			t.Errorf("step %v, want the two decodes", got)
		}
		if r.Status() != WaitingForRemoteKVs || !cmp.Equal(c.allocs, []string{"a:0", "b:0", "r:12"}) {
			t.Fatalf("r %v, allocations %v: want its load started in the step it arrived", r.Status(), c.allocs)
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		h.runAll(50)
		if diff := cmp.Diff(want(r.Prompt, 3), r.Output()); diff != "" {
			t.Errorf("r output (-want +got):\n%s", diff)
		}
	})
	t.Run("with every seat taken a load still starts", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 64, Config{MaxNumSeqs: 1}, c)
		h.add("a", prompt(1, 2), 6)
		h.step()
		r := h.remote("r", prompt(3, 12), 2)
		h.step()
		if r.Status() != WaitingForRemoteKVs {
			t.Fatalf("r %v with the only seat taken, want its load started", r.Status())
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		if st := h.s.Stats(); st.FetchLoaded != 1 {
			t.Errorf("%+v: want 1 loaded and waiting to run", st)
		}
		h.runAll(50)
	})
	t.Run("remote admissions go through off-cadence steps and leave the clock alone", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 64, Config{PrefillScheduleInterval: 4}, c)
		h.add("a", prompt(1, 8), 12)
		h.step() // a's prefill: the clock restarts
		r := h.remote("r", prompt(3, 12), 3)
		h.step()
		if r.Status() != WaitingForRemoteKVs || h.s.sincePrefill != 1 {
			t.Fatalf("off cadence: r %v, clock %d; want its load started and the clock at 1", r.Status(), h.s.sincePrefill)
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"a@9+1", "r@11+1"}) {
			t.Errorf("off-cadence step after the load %v, want r's last token (light) at once", got)
		}
		if h.s.sincePrefill != 2 || h.s.Stats().PrefillDeferredSteps != 0 {
			t.Errorf("clock %d, %d deferred; want 2 and none", h.s.sincePrefill, h.s.Stats().PrefillDeferredSteps)
		}
		h.runAll(50)
	})
	t.Run("fetch stages", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 64, Config{MaxConcurrentLoads: 1}, c)
		r1 := h.remote("r1", prompt(1, 8), 2)
		r2 := h.remote("r2", prompt(2, 8), 2)
		h.step()
		st := h.s.Stats()
		if st.FetchInProgress != 1 || st.FetchWaiting != 1 || r2.FetchStage() != FetchWaitingToStart {
			t.Fatalf("%+v, r2 %v: want one loading, one waiting to start (one load at a time)", st, r2.FetchStage())
		}
		h.s.UpdateFromConnector([]string{"r1"}, nil, nil)
		if r1.FetchStage() != FetchCompletedWaiting {
			t.Errorf("r1 %v after its load, want completed_waiting", r1.FetchStage())
		}
		h.step()
		if r1.FetchStage() != FetchNone || r2.FetchStage() != FetchInProgress {
			t.Errorf("r1 %v, r2 %v; want r1 running and r2 loading", r1.FetchStage(), r2.FetchStage())
		}
		h.s.UpdateFromConnector([]string{"r2"}, nil, nil)
		h.runAll(50)
	})
}

func TestLoadBounds(t *testing.T) {
	t.Run("a new load may not take blocks that loads in flight still need", func(t *testing.T) {
		// 21 tokens: a load of 20 (5 blocks), and a 6th block for the
		// last token once it is loaded. Two loads hold 10 and reserve 2 of
		// the 6 left, so a third (5 blocks) waits.
		c := newTestConnector()
		h := newHarness(t, 16, Config{MaxLoadShare: 1}, c)
		for i := range 3 {
			h.remote(fmt.Sprint("r", i), prompt(i, 21), 1)
			c.offer[fmt.Sprint("r", i)] = 20
		}
		h.step()
		if got := h.loading(); !cmp.Equal(got, []string{"r0", "r1"}) {
			t.Fatalf("loading %v, want r0 and r1", got)
		}
		if !h.s.ShortOfBlocks() || h.s.Stats().FetchWaiting != 1 {
			t.Errorf("short %v, %+v: want r2 waiting to start for memory", h.s.ShortOfBlocks(), h.s.Stats())
		}
		h.s.UpdateFromConnector([]string{"r0", "r1"}, nil, nil)
		for h.s.HasWork() {
			h.step()
			h.s.UpdateFromConnector(h.loading(), nil, nil)
		}
	})
	t.Run("loads in flight hold at most their share of the pool, but one load may be larger", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 32, Config{MaxLoadShare: 0.5}, c)
		big := h.remote("big", prompt(1, 80), 1) // 20 blocks
		small := h.remote("small", prompt(2, 8), 1)
		h.step()
		if big.Status() != WaitingForRemoteKVs || small.Status() != Waiting {
			t.Fatalf("big %v small %v: want big loading alone", big.Status(), small.Status())
		}
		h.s.UpdateFromConnector([]string{"big"}, nil, nil)
		h.step()
		if small.Status() != WaitingForRemoteKVs {
			t.Fatalf("small %v once big loaded, want loading", small.Status())
		}
		h.s.UpdateFromConnector([]string{"small"}, nil, nil)
		h.runAll(50)
	})
	t.Run("concurrent large loads on a small pool all complete, in order", func(t *testing.T) {
		for _, share := range []float64{0.5, 1} {
			c := newTestConnector()
			h := newHarness(t, 16, Config{MaxLoadShare: share, MaxConcurrentLoads: 4}, c)
			var rs []*Request
			for i := range 6 {
				rs = append(rs, h.remote(fmt.Sprint("r", i), prompt(10+i, 26), 6)) // 7 blocks each, 8 with the output
			}
			var done []string
			for n := 0; h.s.HasWork() || len(h.loading()) > 0; n++ {
				if n > 500 {
					t.Fatalf("share %v: deadlock: %+v", share, h.s.Stats())
				}
				h.step()
				for _, r := range rs {
					if r.Status().Finished() && !slices.Contains(done, r.ID) {
						done = append(done, r.ID)
					}
				}
				h.s.UpdateFromConnector(h.loading(), nil, nil)
			}
			if !cmp.Equal(done, []string{"r0", "r1", "r2", "r3", "r4", "r5"}) {
				t.Errorf("share %v: finish order %v, want FCFS", share, done)
			}
			for _, r := range rs {
				if diff := cmp.Diff(want(r.Prompt, 6), r.Output()); diff != "" {
					t.Errorf("share %v: %s output (-want +got):\n%s", share, r.ID, diff)
				}
			}
		}
	})
	t.Run("a load started past the seats never keeps an earlier request out of memory", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 10, Config{MaxNumSeqs: 1, MaxLoadShare: 1}, c)
		a := h.add("a", prompt(1, 4), 3)
		h.step()
		b := h.add("b", prompt(2, 24), 2) // 6 blocks: waits for a's seat
		r := h.remote("r", prompt(3, 20), 2)
		h.step()
		if r.Status() != WaitingForRemoteKVs || b.Status() != Waiting {
			t.Fatalf("r %v b %v: want r loading past the seats, b waiting", r.Status(), b.Status())
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		for a.Status() == Running {
			h.step()
		}
		h.step()
		if b.Status() != Running || len(r.Blocks()) != 0 {
			t.Fatalf("b %v, r holds %d blocks: want r's blocks reclaimed for b", b.Status(), len(r.Blocks()))
		}
		h.runAll(50)
		if diff := cmp.Diff(want(r.Prompt, 2), r.Output()); diff != "" {
			t.Errorf("r output (-want +got):\n%s", diff)
		}
	})
	t.Run("a running prefill keeps the blocks it still needs", func(t *testing.T) {
		// p's 40-token prompt runs in 8-token chunks: 10 blocks, of which
		// its first chunk takes 2. A 7-block load would leave p short.
		c := newTestConnector()
		h := newHarness(t, 14, Config{MaxNumBatchedTokens: 8, MaxLoadShare: 1}, c)
		p := h.add("p", prompt(1, 40), 2)
		h.step()
		r := h.remote("r", prompt(2, 26), 2)
		for p.NumComputedTokens() < len(p.Prompt) {
			h.step()
			if r.Status() == WaitingForRemoteKVs {
				t.Fatalf("the load started while p still needed %d blocks", h.s.blocksFor(len(p.Prompt))-len(p.Blocks()))
			}
		}
		h.runAll(100)
		h.s.UpdateFromConnector(h.loading(), nil, nil)
		h.runAll(100)
		if st := h.s.Stats(); st.Preemptions != 0 {
			t.Errorf("%d preemptions, want none", st.Preemptions)
		}
	})
}

// TestRandomArrivals drives the scheduler with random arrivals of local and
// remote requests, random load times and random configurations, and checks
// that every request finishes with the output it has alone, no block leaks,
// a deferring step always decodes, and nothing starves.
func TestRandomArrivals(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := Config{
			PrefillScheduleInterval: 1 + rng.IntN(5),
			MaxNumBatchedTokens:     4 + rng.IntN(40),
			MaxNumSeqs:              1 + rng.IntN(8),
			MaxConcurrentLoads:      1 + rng.IntN(4),
			MaxLoadShare:            []float64{0.25, 0.5, 1}[rng.IntN(3)],
		}
		t.Run(fmt.Sprintf("seed %d %+v", seed, cfg), func(t *testing.T) {
			c := newTestConnector()
			h := newHarness(t, 12+rng.IntN(40), cfg, c)
			loadFor := map[string]int{} // steps until a load in flight reports
			var all []*Request
			arrivals := 10 + rng.IntN(20)
			for n := 0; arrivals > 0 || h.s.HasWork() || len(h.loading()) > 0; n++ {
				if n > 5000 {
					t.Fatalf("starved after %d steps: %+v", n, h.s.Stats())
				}
				if arrivals > 0 && rng.IntN(3) == 0 {
					arrivals--
					id := fmt.Sprint("q", len(all))
					p := prompt(int(seed)*100+len(all), 1+rng.IntN(30))
					mt := 1 + rng.IntN(12)
					if need := h.s.blocksFor(len(p) + mt - 1); need > h.pool.NumBlocks() {
						mt = 1
						p = p[:min(len(p), h.pool.NumBlocks()*bs)]
					}
					var r *Request
					if rng.IntN(2) == 0 {
						r = h.remote(id, p, mt)
					} else {
						r = h.add(id, p, mt)
					}
					all = append(all, r)
				}
				var done []string
				for _, id := range h.loading() {
					if _, ok := loadFor[id]; !ok {
						loadFor[id] = rng.IntN(4)
					}
					if loadFor[id]--; loadFor[id] < 0 {
						delete(loadFor, id)
						done = append(done, id)
					}
				}
				if len(done) > 0 {
					h.s.UpdateFromConnector(done, nil, nil)
				}
				if !h.s.HasWork() {
					continue
				}
				before := h.s.Stats().PrefillDeferredSteps
				out := h.step()
				if h.s.Stats().PrefillDeferredSteps > before && len(out.Scheduled) == 0 {
					t.Fatalf("step %d deferred prefill and ran nothing", n)
				}
				if testing.Verbose() {
					t.Logf("step %d: %v loading %v %+v", n, ids(out.Scheduled), h.loading(), h.s.Stats())
				}
				if len(h.loading()) > cfg.MaxConcurrentLoads {
					t.Fatalf("step %d: %d loads in flight, bound %d", n, len(h.loading()), cfg.MaxConcurrentLoads)
				}
			}
			for _, r := range all {
				f, ok := h.finished[r.ID]
				if !ok || f.Status != FinishedLength {
					t.Errorf("%s: finished %v (%+v), want FINISHED_LENGTH", r.ID, ok, f)
					continue
				}
				if diff := cmp.Diff(want(r.Prompt, r.MaxTokens), r.Output()); diff != "" {
					t.Errorf("%s output (-want +got):\n%s", r.ID, diff)
				}
			}
		})
	}
}
