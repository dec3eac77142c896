package sched

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

const bs = 4 // block size of every test pool

// harness drives a scheduler step by step with a fake model whose next
// token is a function of all tokens so far, so a recomputed request must
// produce exactly the tokens it would have produced without preemption.
type harness struct {
	t    *testing.T
	pool *kvcache.Blocks // accounting only: the scheduler never sees KV memory
	s    *Scheduler
	conn *testConnector
	// stop, when set, decides whether a sampled token ends a request.
	stop func(r *Request, tok int32) Status
	// check, when set, sees every schedule before the step's Update.
	check    func(out *Output)
	finished map[string]Finished
}

func newHarness(t *testing.T, blocks int, cfg Config, conn *testConnector) *harness {
	t.Helper()
	pool, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: bs, NumBlocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	var c Connector
	if conn != nil {
		c = conn
	}
	s, err := New(cfg, pool, c)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, pool: pool, s: s, conn: conn, finished: map[string]Finished{}}
	t.Cleanup(func() {
		if !t.Failed() {
			h.assertDrained()
		}
	})
	return h
}

func nextToken(tokens []int32) int32 {
	var sum int64
	for i, t := range tokens {
		sum = sum*31 + int64(t) + int64(i)
		sum %= 1_000_003
	}
	return int32(sum%400) + 3
}

func prompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*97+i*13)%400) + 3
	}
	return p
}

func (h *harness) add(id string, p []int32, maxTokens int) *Request {
	h.t.Helper()
	r := &Request{ID: id, Prompt: p, MaxTokens: maxTokens}
	if err := h.s.Add(r); err != nil {
		h.t.Fatal(err)
	}
	return r
}

// step runs one Schedule/Update round and returns the schedule.
func (h *harness) step() *Output {
	h.t.Helper()
	out := h.s.Schedule()
	h.record(out.Finished)
	if h.check != nil {
		h.check(out)
	}
	var res []Result
	for _, sc := range out.Scheduled {
		if len(sc.Blocks)*bs < sc.Pos+len(sc.Tokens) {
			h.t.Fatalf("%s: %d blocks cannot hold %d tokens", sc.Req.ID, len(sc.Blocks), sc.Pos+len(sc.Tokens))
		}
		if sc.Sample {
			tok := nextToken(sc.Req.tokens)
			var st Status
			if h.stop != nil {
				st = h.stop(sc.Req, tok)
			}
			res = append(res, Result{ID: sc.Req.ID, Token: tok, Finish: st})
		}
	}
	h.record(h.s.Update(out, res))
	return out
}

func (h *harness) record(fs []Finished) {
	for _, f := range fs {
		if _, dup := h.finished[f.Req.ID]; dup {
			h.t.Errorf("request %s reported finished twice", f.Req.ID)
		}
		h.finished[f.Req.ID] = f
	}
}

// runAll steps until nothing is left to do, failing after limit steps.
func (h *harness) runAll(limit int) int {
	h.t.Helper()
	for n := 0; ; n++ {
		if !h.s.HasWork() {
			return n
		}
		if n == limit {
			h.t.Fatalf("still busy after %d steps: %+v", limit, h.s.Stats())
		}
		h.step()
	}
}

// want returns the output a request produces alone.
func want(p []int32, maxTokens int) []int32 {
	toks := append([]int32(nil), p...)
	for range maxTokens {
		toks = append(toks, nextToken(toks))
	}
	return toks[len(p):]
}

func (h *harness) assertDrained() {
	h.t.Helper()
	if st := h.s.Stats(); st.Running+st.Waiting+st.Held != 0 {
		h.t.Errorf("scheduler not empty at the end: %+v", st)
	}
	if h.pool.FreeBlocks() != h.pool.NumBlocks() {
		h.t.Errorf("leaked blocks: %d of %d free at the end", h.pool.FreeBlocks(), h.pool.NumBlocks())
	}
}

func ids(sched []Scheduled) []string {
	var out []string
	for _, sc := range sched {
		out = append(out, fmt.Sprintf("%s@%d+%d", sc.Req.ID, sc.Pos, len(sc.Tokens)))
	}
	return out
}

// testConnector is a scriptable connector: per request id it offers
// external tokens (sync or async), may delay freeing, and records calls.
type testConnector struct {
	offer      map[string]int // external tokens offered beyond the local hit, -1: all the rest
	async      map[string]bool
	once       map[string]bool // offer only until a load is allocated, as a real connector does
	delayFree  map[string]bool
	retry      map[string]int // ErrRetryLater this many times
	fail       map[string]error
	added      []string
	allocs     []string // "id:numExternal"
	finished   map[string]int
	metaCalls  int
	localSeen  map[string]int
	blocksSeen map[string][]int32
}

func newTestConnector() *testConnector {
	return &testConnector{offer: map[string]int{}, async: map[string]bool{}, once: map[string]bool{}, delayFree: map[string]bool{}, retry: map[string]int{},
		fail: map[string]error{}, finished: map[string]int{}, localSeen: map[string]int{}, blocksSeen: map[string][]int32{}}
}

func (c *testConnector) OnNewRequest(r *Request) { c.added = append(c.added, r.ID) }

func (c *testConnector) GetNumNewMatchedTokens(r *Request, local int) (int, bool, error) {
	c.localSeen[r.ID] = local
	if c.retry[r.ID] > 0 {
		c.retry[r.ID]--
		return 0, false, ErrRetryLater
	}
	if err := c.fail[r.ID]; err != nil {
		return 0, false, err
	}
	n, ok := c.offer[r.ID]
	if !ok {
		return 0, false, nil
	}
	if n < 0 {
		n = len(r.Prompt) - local
	}
	return n, n > 0 && c.async[r.ID], nil
}

func (c *testConnector) UpdateStateAfterAlloc(r *Request, blocks []int32, ext int) {
	c.allocs = append(c.allocs, fmt.Sprintf("%s:%d", r.ID, ext))
	if c.once[r.ID] {
		delete(c.offer, r.ID)
	}
	c.blocksSeen[r.ID] = append([]int32(nil), blocks...)
}

// testMeta is testConnector's connector metadata: the step's number.
type testMeta int

func (testMeta) Start() {}

func (c *testConnector) BuildConnectorMeta(*Output) ConnectorMeta {
	c.metaCalls++
	return testMeta(c.metaCalls)
}

func (c *testConnector) RequestFinished(r *Request, blocks []int32) (bool, json.RawMessage) {
	c.finished[r.ID]++
	params, _ := json.Marshal(map[string]any{"remote_block_ids": blocks})
	return c.delayFree[r.ID], params
}

// heldBlocks reads the block ids testConnector returned in params.
func heldBlocks(t *testing.T, params json.RawMessage) []int32 {
	t.Helper()
	var p struct {
		IDs []int32 `json:"remote_block_ids"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		t.Fatalf("params %s: %v", params, err)
	}
	return p.IDs
}
