package sched

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

// With the token budget or the seats spent, a step admits only
// asynchronous loads: the requests queued behind them that would compute
// are passed without a prefix-cache lookup, and a load among them still
// starts.
func TestASpentStepLooksUpOnlyWhatItCanAdmit(t *testing.T) {
	for _, c := range []struct {
		name    string
		cfg     Config
		running int
	}{
		{"the budget spent by two decodes", Config{MaxNumBatchedTokens: 2}, 2},
		{"the only seat taken", Config{MaxNumSeqs: 1}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := newTestConnector()
			h := newHarness(t, 256, c.cfg, conn)
			for i := range c.running {
				h.add(fmt.Sprint("a", i), prompt(1+i, 1), 12)
			}
			h.step()
			for i := range 20 {
				h.add(fmt.Sprint("w", i), prompt(10+i, 16), 1)
			}
			before := h.s.prefixLookups
			for range 3 {
				h.step()
			}
			if n := h.s.prefixLookups - before; n != 0 {
				t.Errorf("3 steps looked up %d prefixes of 20 requests that cannot be admitted, want 0", n)
			}
			r := h.remote("r", prompt(3, 12), 2)
			before = h.s.prefixLookups
			h.step()
			if n := h.s.prefixLookups - before; n != 1 || r.Status() != WaitingForRemoteKVs {
				t.Errorf("a load queued behind them: %d lookups, r %v; want 1 and its load started", n, r.Status())
			}
			h.s.UpdateFromConnector([]string{"r"}, nil, nil)
			h.runAll(300)
		})
	}
}

// remoteConnector loads, asynchronously, the prompts of the requests it
// was told of and nothing else, deciding with one map lookup as the P/D
// connector does.
type remoteConnector struct {
	NoConnector
	remote map[string]bool
}

func (c remoteConnector) GetNumNewMatchedTokens(r *Request, local int) (int, bool, error) {
	if !c.remote[r.ID] || local >= len(r.Prompt)-1 {
		return 0, false, nil
	}
	return len(r.Prompt) - 1 - local, true, nil
}

// BenchmarkScheduleSpent is one step of an engine with a KV connector
// whose only seat is taken by a decode (for up to 250,000 steps) while
// 1,000 requests with 1,024-token prompts wait, none of which loads KV
// from elsewhere: prompts of their own, or prompts whose first 1,008
// tokens are in the prefix cache (a shared system prompt).
func BenchmarkScheduleSpent(b *testing.B) {
	for _, shared := range []bool{false, true} {
		name := "own-prompts"
		if shared {
			name = "cached-prefix"
		}
		b.Run(name, func(b *testing.B) { benchScheduleSpent(b, shared) })
	}
}

func benchScheduleSpent(b *testing.B, shared bool) {
	pool, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 16, NumBlocks: 16384})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{MaxNumSeqs: 1}, pool, remoteConnector{remote: map[string]bool{}})
	if err != nil {
		b.Fatal(err)
	}
	add := func(id string, p []int32, max int) {
		if err := s.Add(&Request{ID: id, Prompt: p, MaxTokens: max}); err != nil {
			b.Fatal(err)
		}
	}
	step := func() {
		out := s.Schedule()
		var res []Result
		for _, sc := range out.Scheduled {
			if sc.Sample {
				res = append(res, Result{ID: sc.Req.ID, Token: 5}) // no model: the step is the scheduler's
			}
		}
		s.Update(out, res)
	}
	system := prompt(7, 1008)
	if shared {
		add("system", system, 1) // computed and finished: its full blocks stay cached
		for s.HasWork() {
			step()
		}
	}
	add("a", prompt(1, 4), 250_000) // decodes for the whole run (the pool holds 262,144 tokens)
	for i := range 1000 {
		p := prompt(10+i, 1024)
		if shared {
			p = append(slices.Clone(system), p[:16]...)
		}
		add(fmt.Sprint("w", i), p, 1)
	}
	step()
	steps, lookups := 0, s.prefixLookups
	b.ReportAllocs()
	for b.Loop() {
		step()
		steps++
	}
	if st := s.Stats(); st.Running != 1 || st.Waiting != 1000 {
		b.Fatalf("%+v after %d steps: want the decode running and every request waiting", st, steps)
	}
	b.ReportMetric(float64(s.prefixLookups-lookups)/float64(steps), "lookups/step")
}
