package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Turn is one request of a conversation.
type Turn struct {
	// Prompt is the turn's new tokens; the request's prompt is the
	// conversation so far (earlier prompts and answers) followed by these.
	Prompt []int32 `json:"-"`
	// PromptLen is len(Prompt), kept for the JSON description.
	PromptLen int `json:"prompt_tokens"`
	// MaxTokens is the exact output length (the requests set ignore_eos).
	MaxTokens int `json:"max_tokens"`
	// Think is the pause between the previous turn's answer and this turn.
	Think time.Duration `json:"think_ns,omitempty"`
}

// Conversation is a sequence of turns sent one after another. A single-turn
// request is a Conversation of one Turn with no ID.
type Conversation struct {
	// ID, when set, is sent as the conversation_id body field of every turn,
	// so a server that keeps a conversation's KV (Tandem's proxy with
	// --conversations) can reuse it.
	ID string `json:"id,omitempty"`
	// Arrival is when the first turn is sent, from the start of the run;
	// used only when the Workload's TimedArrivals is set (a trace).
	Arrival time.Duration `json:"arrival_ns,omitempty"`
	// Group is the shared-prefix group, -1 for none.
	Group int    `json:"group"`
	Turns []Turn `json:"turns"`
}

// Workload is the requests of one benchmark.
type Workload struct {
	// Name describes the workload in reports, e.g. "chat" or
	// "trace:mooncake.jsonl".
	Name          string         `json:"name"`
	Conversations []Conversation `json:"-"`
	// TimedArrivals says that Conversation.Arrival holds the arrival times
	// (trace replay); otherwise an arrival process assigns them.
	TimedArrivals bool `json:"timed_arrivals,omitempty"`
	// Clipped counts requests shortened to fit a context limit (Fit).
	Clipped int `json:"clipped,omitempty"`
}

// Requests is the number of turns in w.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Conversations {
		n += len(w.Conversations[i].Turns)
	}
	return n
}

// Stats are the mean prompt and output lengths of w's requests, counting
// the whole history as the prompt of a later turn.
func (w *Workload) Stats() (meanPrompt, meanOutput float64) {
	var p, o, n float64
	for _, c := range w.Conversations {
		hist := 0
		for _, t := range c.Turns {
			p += float64(hist + len(t.Prompt))
			o += float64(t.MaxTokens)
			hist += len(t.Prompt) + t.MaxTokens
			n++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return p / n, o / n
}

// newRand is the generator of one workload: the same seed and stream give
// the same draws.
func newRand(seed uint64, stream string) *rand.Rand {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(stream); i++ {
		h = (h ^ uint64(stream[i])) * 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

func tokens(r *rand.Rand, n int, pool []int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = pool[r.IntN(len(pool))]
	}
	return p
}

func single(prompt []int32, maxTokens, group int) Conversation {
	return Conversation{Group: group, Turns: []Turn{{Prompt: prompt, PromptLen: len(prompt), MaxTokens: maxTokens}}}
}

// Lengths returns n single-turn requests with prompt lengths drawn from in
// and output lengths from out, prompt tokens drawn uniformly from pool.
func Lengths(name string, seed uint64, n int, in, out Dist, pool []int32) *Workload {
	r := newRand(seed, "lengths:"+name)
	w := &Workload{Name: name}
	for range n {
		p := tokens(r, in.Draw(r), pool)
		w.Conversations = append(w.Conversations, single(p, out.Draw(r), -1))
	}
	return w
}

// ChatInput and ChatOutput shape the synthetic chat mix after public
// ShareGPT statistics: heavy-tailed (lognormal) prompts and answers with
// means of roughly 200 and 240 tokens and long tails, clamped to 1024 and
// 512. The parameters are ours, not fitted to a data set; override them
// with explicit distributions to match a particular trace.
var (
	ChatInput  = Dist{Kind: "lognormal", A: 128, B: 1.0, Min: 4, Max: 1024}
	ChatOutput = Dist{Kind: "lognormal", A: 160, B: 0.9, Min: 4, Max: 512}
)

// Chat is n requests of the synthetic ShareGPT-shaped chat mix.
func Chat(seed uint64, n int, pool []int32) *Workload {
	return Lengths("chat", seed, n, ChatInput, ChatOutput, pool)
}

// LongInput and LongOutput are the long-prompt mix: prompts of 1–2k tokens
// (a document, a long history) and answers of 100–300.
var (
	LongInput  = Dist{Kind: "uniform", A: 1024, B: 2048, Min: 1024, Max: 2048}
	LongOutput = Dist{Kind: "uniform", A: 100, B: 300, Min: 100, Max: 300}
)

// Long is n requests of the long-prompt mix.
func Long(seed uint64, n int, pool []int32) *Workload {
	return Lengths("long", seed, n, LongInput, LongOutput, pool)
}

// SharedPrefix returns n single-turn requests in groups groups: request i
// belongs to group i % groups, whose prompts all start with the same
// prefixLen tokens (a system prompt) followed by a suffix drawn from in.
func SharedPrefix(seed uint64, n, groups, prefixLen int, in, out Dist, pool []int32) (*Workload, error) {
	if groups < 1 || prefixLen < 1 {
		return nil, fmt.Errorf("shared prefix: %d groups of %d tokens: want at least one group of at least one token", groups, prefixLen)
	}
	r := newRand(seed, "prefix")
	prefixes := make([][]int32, groups)
	for g := range prefixes {
		prefixes[g] = tokens(r, prefixLen, pool)
	}
	w := &Workload{Name: fmt.Sprintf("prefix(%dx%d)", groups, prefixLen)}
	for i := range n {
		g := i % groups
		p := append(append(make([]int32, 0, prefixLen+in.Bound()), prefixes[g]...), tokens(r, in.Draw(r), pool)...)
		w.Conversations = append(w.Conversations, single(p, out.Draw(r), g))
	}
	return w, nil
}

// MultiTurn returns n conversations with turns drawn from turns, each turn
// adding a user message of in tokens and an answer of out tokens, with a
// think time (milliseconds) drawn from think before every turn but the
// first. Conversation ids are unique per seed.
func MultiTurn(seed uint64, n int, turns, in, out, think Dist, pool []int32) *Workload {
	r := newRand(seed, "multiturn")
	w := &Workload{Name: "multiturn"}
	for i := range n {
		c := Conversation{ID: fmt.Sprintf("bench-%d-%d", seed, i), Group: -1}
		k := turns.Draw(r)
		for j := range k {
			t := Turn{MaxTokens: out.Draw(r)}
			t.Prompt = tokens(r, in.Draw(r), pool)
			t.PromptLen = len(t.Prompt)
			if j > 0 {
				t.Think = time.Duration(think.Draw(r)) * time.Millisecond
			}
			c.Turns = append(c.Turns, t)
		}
		w.Conversations = append(w.Conversations, c)
	}
	return w
}

// Fit shortens w so that no request needs more than maxContext tokens
// (prompt, history and output): outputs are cut first down to 1 token,
// then prompts, and turns that do not fit at all are dropped. It counts the
// requests it changed in w.Clipped. maxContext <= 0 leaves w as it is.
func (w *Workload) Fit(maxContext int) {
	if maxContext <= 0 {
		return
	}
	for ci := range w.Conversations {
		c := &w.Conversations[ci]
		hist := 0
		for ti := range c.Turns {
			t := &c.Turns[ti]
			room := maxContext - hist
			if room < 2 {
				w.Clipped += len(c.Turns) - ti
				c.Turns = c.Turns[:ti]
				break
			}
			if len(t.Prompt)+t.MaxTokens > room {
				w.Clipped++
				t.MaxTokens = max(1, room-len(t.Prompt))
				if len(t.Prompt)+t.MaxTokens > room {
					t.Prompt = t.Prompt[:room-t.MaxTokens]
					t.PromptLen = len(t.Prompt)
				}
			}
			hist += len(t.Prompt) + t.MaxTokens
		}
	}
	kept := w.Conversations[:0]
	for _, c := range w.Conversations {
		if len(c.Turns) > 0 {
			kept = append(kept, c)
		}
	}
	w.Conversations = kept
}

// Alphabet is the sorted distinct ids of pool and of every prompt of w: the
// ids Relabel permutes.
func (w *Workload) Alphabet(pool []int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	add := func(id int32) {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	for _, id := range pool {
		add(id)
	}
	for i := range w.Conversations {
		for _, t := range w.Conversations[i].Turns {
			for _, id := range t.Prompt {
				add(id)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Relabel returns a copy of w for one level of a run (one load and round):
// every prompt id alphabet[i] becomes alphabet[(i+level) mod len(alphabet)],
// and conversation ids get a "-l<level>" suffix. The lengths, the arrival
// times and every sharing the workload means (shared-prefix groups, a
// conversation's history, a trace's common hash ids) are kept, because the
// map is one-to-one; but two levels whose numbers differ modulo
// len(alphabet) differ in every token at every position, so no prompt of
// one shares even a first block with a prompt of the other and a server's
// prefix cache cannot carry work from level to level. The ids stay in
// alphabet (ordinary, non-special tokens when the pool is). Level 0 keeps
// the prompts as they are.
func (w *Workload) Relabel(alphabet []int32, level int) *Workload {
	out := *w
	out.Conversations = make([]Conversation, len(w.Conversations))
	n := len(alphabet)
	shift := 0
	if n > 0 {
		shift = ((level % n) + n) % n
	}
	index := make(map[int32]int, n)
	for i, id := range alphabet {
		index[id] = i
	}
	for ci, c := range w.Conversations {
		c.Turns = slices.Clone(c.Turns)
		if c.ID != "" && level != 0 {
			c.ID = fmt.Sprintf("%s-l%d", c.ID, level)
		}
		for ti := range c.Turns {
			t := &c.Turns[ti]
			if shift == 0 {
				continue
			}
			p := make([]int32, len(t.Prompt))
			for k, id := range t.Prompt {
				if i, ok := index[id]; ok {
					id = alphabet[(i+shift)%n]
				}
				p[k] = id
			}
			t.Prompt = p
		}
		out.Conversations[ci] = c
	}
	return &out
}
