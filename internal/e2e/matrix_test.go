package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

const blockSize = 16 // the engines' default --block-size, which these tests keep

// sampling is one way of choosing tokens, as request fields.
type sampling struct {
	name   string
	fields map[string]any
}

var samplings = []sampling{
	{"greedy", map[string]any{"temperature": 0}},
	{"seeded at temperature 0.8", map[string]any{"temperature": 0.8, "seed": 1234}},
}

var streamings = []struct {
	name   string
	stream bool
}{{"not streamed", false}, {"streamed", true}}

// transferCounters are a decode engine's prompt-source and transfer
// counters.
type transferCounters struct {
	external, cached, local, bytes float64
}

func decodeCounters(t *testing.T, e *engine) transferCounters {
	t.Helper()
	m := scrape(t, e.url)
	return transferCounters{
		external: m.must(t, "vllm:prompt_tokens_by_source", `source="external_kv_transfer"`),
		cached:   m.must(t, "vllm:prompt_tokens_by_source", `source="local_cache_hit"`),
		local:    m.must(t, "vllm:prompt_tokens_by_source", `source="local_compute"`),
		bytes:    m.must(t, "tandem:kv_transfer_bytes_total"),
	}
}

func (a transferCounters) sub(b transferCounters) transferCounters {
	return transferCounters{a.external - b.external, a.cached - b.cached, a.local - b.local, a.bytes - b.bytes}
}

// checkPulled fails t unless d (a decode's counters across one request
// with a prompt of n tokens, of which cached were prefix-cache hits there)
// says the rest of the prompt came over the side channel: the decode
// computes at most the last prompt token itself.
func checkPulled(t *testing.T, d transferCounters, n, cached int) {
	t.Helper()
	if int(d.cached) != cached {
		t.Errorf("decode counted %v prompt tokens as local cache hits, want %d", d.cached, cached)
	}
	if d.local < 0 || d.local > 1 {
		t.Errorf("decode computed %v prompt tokens itself, want at most the last one (external %v)", d.local, d.external)
	}
	if got := int(d.external + d.local + d.cached); got != n {
		t.Errorf("decode's prompt_tokens_by_source grew by %d (external %v, cached %v, local %v), want the prompt's %d tokens",
			got, d.external, d.cached, d.local, n)
	}
	if d.external < float64(n-cached-1) {
		t.Errorf("decode pulled %v prompt tokens, want at least %d", d.external, n-cached-1)
	}
	if d.bytes <= 0 {
		t.Errorf("tandem:kv_transfer_bytes_total grew by %v on the decode, want > 0", d.bytes)
	}
}

// tokenPrompt is n pseudo-random token ids (BOS first) that no other
// prompt of the run shares a block with: seed picks the stream.
func tokenPrompt(seed uint64, n, vocab int) []int {
	r := rand.New(rand.NewPCG(seed, 0x7a6d))
	ids := make([]int, n)
	ids[0] = 1
	for i := 1; i < n; i++ {
		ids[i] = 3 + r.IntN(vocab-3) // past <unk>, <s>, </s>
	}
	return ids
}

// storyWords is a body of text the text prompts are cut from; each prompt
// starts with its own opener so that no two share a block.
var storyWords = strings.Fields(`there was a little girl named Lily. She loved to play outside in the park
with her red ball. One day, she saw a big dog. The dog was very friendly and wanted to play too. Lily threw
the ball and the dog ran after it. They played all day long until the sun went down. Then Lily went home and
told her mom about the dog. Her mom smiled and said that she could play with the dog again tomorrow. Lily was
so happy that she could not sleep. The next morning she ran to the park and looked for the dog. She looked
behind the trees and under the slide, but the dog was not there. Lily felt sad and sat down on the grass. Then
she heard a bark. The dog was running to her with the ball in its mouth. Lily laughed and hugged the dog. They
were best friends forever and played together every day in the sun and in the rain. The end of the story was
a happy one for Lily and the dog and her mom and all of their friends in the little town by the big blue sea`)

var openers = []string{
	"Once upon a time,", "One day,", "Long ago,", "In a small town,", "Yesterday,", "Every morning,",
	"At the park,", "On a sunny day,", "Near the sea,", "In the big forest,", "Last summer,", "After school,",
}

// tokenCount asks the engine at url how many tokens text is as a prompt.
func tokenCount(t *testing.T, url, text string) int {
	t.Helper()
	r := postJSON(t, url+"/tokenize", map[string]any{"model": servedName, "prompt": text})
	var out struct {
		Count int `json:"count"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
		t.Fatalf("POST /tokenize: status %d: %s", r.status, r.body)
	}
	return out.Count
}

// fitText returns a text prompt of exactly n tokens (BOS included, as the
// engine counts a prompt) starting with opener, cut from storyWords.
func fitText(t *testing.T, url, opener string, n int) string {
	t.Helper()
	words := append(strings.Fields(opener), storyWords...)
	text := func(k int) string { return strings.Join(words[:k], " ") }
	// The count grows with the number of words: find the most words that
	// fit, then pad with one-token words.
	k := sort.Search(len(words)+1, func(k int) bool { return k > 0 && tokenCount(t, url, text(k)) > n }) - 1
	if k < 1 {
		t.Fatalf("no text of %d tokens starts with %q", n, opener)
	}
	base := text(k)
	for _, pad := range []string{" a", " the", "."} {
		s := base
		for c := tokenCount(t, url, s); c < n; c++ {
			s += pad
		}
		if tokenCount(t, url, s) == n {
			return s
		}
	}
	t.Fatalf("could not pad %q to exactly %d tokens", base, n)
	return ""
}

// promptCase is one row of the prompt-shape axis. prompt returns a fresh
// prompt (one the decode has not seen) for the i-th request of the row.
type promptCase struct {
	name   string
	tokens int
	prompt func(i int) any
}

// TestDisaggregatedMatchesColocated runs the equivalence matrix on
// stories260K: every request through the proxy (prefill engine, KV pulled
// by a decode engine) must answer bit-identically to a colocated engine,
// take the P/D path, and show on the decode's metrics that the prompt came
// by transfer. It runs once with a decode forced onto TCP and once with one
// forced onto shared memory, both pulling from the same prefill.
func TestDisaggregatedMatchesColocated(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-transport")
	const vocab = 512

	ref := startEngine(t, engineSpec{name: "reference", model: model})
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill"})

	seed := uint64(0)
	ids := func(n int) func(int) any {
		return func(int) any { seed++; return tokenPrompt(seed, n, vocab) }
	}
	// Text rows take their openers from disjoint ranges (one per request
	// of a row): texts that begin alike would share a first block, and the
	// decode would find it cached. They are fitted here, once: the two
	// decodes have separate caches, so the runs over TCP and shared memory
	// can share them.
	perRow := len(samplings) * len(streamings)
	if len(openers) < 3*perRow {
		t.Fatalf("%d openers for three text rows of %d requests", len(openers), perRow)
	}
	texts := func(n, row int) func(int) any {
		var fitted []string
		for i := range perRow {
			fitted = append(fitted, fitText(t, ref.url, openers[perRow*row+i], n))
		}
		return func(i int) any { return fitted[i] }
	}
	shortTexts := func(i int) any { return openers[2*perRow+i] + " the cat sat" }
	cases := []promptCase{
		{"token ids shorter than a block", 5, ids(5)},
		{"token ids filling exactly one block", blockSize, ids(blockSize)},
		{"token ids filling exactly three blocks", 3 * blockSize, ids(3 * blockSize)},
		{"token ids one past a block boundary", blockSize + 1, ids(blockSize + 1)},
		{"token ids spanning many blocks", 200, ids(200)},
		{"text shorter than a block", 0, shortTexts},
		{"text filling exactly one block", blockSize, texts(blockSize, 0)},
		{"text spanning many blocks", 200, texts(200, 1)},
	}

	for _, transport := range []string{"tcp", "shm"} {
		t.Run("with the decode pulling over "+transport, func(t *testing.T) {
			decode := startEngine(t, engineSpec{name: "decode-" + transport, model: model, role: "decode",
				args: []string{"--kv-transport", transport}})
			proxy := startProxy(t, "proxy-"+transport, []*engine{prefill}, []*engine{decode})

			for _, pc := range cases {
				t.Run(pc.name, func(t *testing.T) {
					i := 0
					for _, s := range samplings {
						for _, st := range streamings {
							prompt := pc.prompt(i)
							i++
							t.Run(s.name+", "+st.name, func(t *testing.T) {
								body := completionBody(prompt, s, st.stream)
								want, _ := generate(t, ref.url, "/v1/completions", body)
								if pc.tokens > 0 && want.PromptTokens != pc.tokens {
									t.Fatalf("the prompt is %d tokens, want %d", want.PromptTokens, pc.tokens)
								}
								before := decodeCounters(t, decode)
								got, r := generate(t, proxy, "/v1/completions", body)
								if r.pd() != "remote" {
									t.Errorf("x-tandem-pd %q, want remote", r.pd())
								}
								sameGeneration(t, want, got)
								checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)
							})
						}
					}
				})
			}

			t.Run("a prompt the decode has cached in full is not pulled again", func(t *testing.T) {
				// 33 tokens: two full blocks the decode caches on the first
				// request, and the last token, which it computes itself.
				body := completionBody(tokenPrompt(1000, 2*blockSize+1, vocab), samplings[0], false)
				want, _ := generate(t, ref.url, "/v1/completions", body)
				before := decodeCounters(t, decode)
				got, r := generate(t, proxy, "/v1/completions", body)
				if r.pd() != "remote" {
					t.Errorf("first request: x-tandem-pd %q, want remote", r.pd())
				}
				sameGeneration(t, want, got)
				checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)

				// The prefill still holds the prompt's blocks for this
				// request; the decode must tell it to free them without
				// reading (waitPoolsIdle below sees it, well inside the 30s
				// lease that would otherwise free them).
				before = decodeCounters(t, decode)
				got, r = generate(t, proxy, "/v1/completions", body)
				if r.pd() != "remote" {
					t.Errorf("second request: x-tandem-pd %q, want remote", r.pd())
				}
				sameGeneration(t, want, got)
				d := decodeCounters(t, decode).sub(before)
				if d.external != 0 || d.bytes != 0 {
					t.Errorf("decode pulled %v tokens (%v bytes) of a prompt it had cached, want none", d.external, d.bytes)
				}
				if int(d.cached) != 2*blockSize || d.local != 1 {
					t.Errorf("decode counted %v tokens as cache hits and computed %v, want %d and 1", d.cached, d.local, 2*blockSize)
				}
			})

			t.Run("a prompt sharing two blocks with a cached one pulls only its tail", func(t *testing.T) {
				prefix := tokenPrompt(2000, 2*blockSize, vocab)
				tailA, tailB := tokenPrompt(2001, 21, vocab)[1:], tokenPrompt(2002, 21, vocab)[1:]
				var bytesA float64
				for i, tl := range [][]int{tailA, tailB} {
					body := completionBody(append(append([]int(nil), prefix...), tl...), samplings[i%2], i == 1)
					want, _ := generate(t, ref.url, "/v1/completions", body)
					before := decodeCounters(t, decode)
					got, r := generate(t, proxy, "/v1/completions", body)
					if r.pd() != "remote" {
						t.Errorf("request %d: x-tandem-pd %q, want remote", i, r.pd())
					}
					sameGeneration(t, want, got)
					d := decodeCounters(t, decode).sub(before)
					if i == 0 {
						checkPulled(t, d, want.PromptTokens, 0)
						bytesA = d.bytes
						continue
					}
					checkPulled(t, d, want.PromptTokens, 2*blockSize)
					if d.bytes >= bytesA {
						t.Errorf("decode pulled %v bytes for a prompt sharing two blocks with a cached one, want fewer than the %v of the first", d.bytes, bytesA)
					}
				}
			})

			// The transport axis is only real if the decode used the one it
			// was told to; it says which in one log line per prefill engine.
			logLine := map[string]string{"tcp": "kv transfer via tcp", "shm": "kv transfer via shared memory"}[transport]
			if !strings.Contains(decode.out.String(), logLine) {
				t.Errorf("the decode's log has no %q line: did it pull over %s?", logLine, transport)
			}
			waitPoolsIdle(t, prefill, decode)
		})
	}
	waitPoolsIdle(t, ref, prefill)
}

// completionBody is a /v1/completions request for prompt with logprobs.
func completionBody(prompt any, s sampling, stream bool) map[string]any {
	body := map[string]any{"model": servedName, "prompt": prompt, "max_tokens": 24, "logprobs": 2, "stream": stream}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	maps.Copy(body, s.fields)
	return body
}

// chatBody is a /v1/chat/completions request for messages with logprobs.
func chatBody(messages []map[string]any, s sampling, stream bool) map[string]any {
	body := map[string]any{"model": servedName, "messages": messages, "max_tokens": 16, "logprobs": true,
		"top_logprobs": 2, "stream": stream}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	maps.Copy(body, s.fields)
	return body
}

// TestDisaggregatedChatMatchesColocated runs chat through the proxy on a
// random-weight bf16 model with a ChatML template (stories260K has none):
// short and many-block conversations, greedy and seeded, streamed and not.
// Being bf16, the engines keep a bf16 KV cache (--kv-cache-dtype auto), so
// this is also the cross-process test of bf16 KV transfer.
func TestDisaggregatedChatMatchesColocated(t *testing.T) {
	bin := tandem(t)
	requirePD(t, bin)
	model := t.TempDir()
	initModel := startProc(t, "model init", "model", "init", "--shape", "tiny", "--dtype", "bf16", "--out", model)
	<-initModel.done
	if initModel.err != nil {
		t.Fatalf("tandem model init: %v\n%s", initModel.err, initModel.out.String())
	}

	ref := startEngine(t, engineSpec{name: "reference", model: model})
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill"})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode"})
	proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})

	n := 0
	conversation := func(turns int) []map[string]any {
		n++
		// The number comes first so that no two conversations share a
		// block (the template's own tokens are the same for all).
		msgs := []map[string]any{{"role": "system", "content": fmt.Sprintf("%d. You are a helpful assistant.", n)}}
		for i := range turns {
			msgs = append(msgs,
				map[string]any{"role": "user", "content": fmt.Sprintf("Question %d of conversation %d: what comes after %d?", i, n, i*7)},
				map[string]any{"role": "assistant", "content": fmt.Sprintf("After %d comes %d.", i*7, i*7+1)})
		}
		return append(msgs, map[string]any{"role": "user", "content": "Tell me a story."})
	}
	cases := []struct {
		name      string
		turns     int
		minTokens int
	}{
		{"a short conversation", 0, 1},
		{"a conversation spanning many blocks", 8, 8 * blockSize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range samplings {
				for _, st := range streamings {
					t.Run(s.name+", "+st.name, func(t *testing.T) {
						body := chatBody(conversation(c.turns), s, st.stream)
						want, _ := generate(t, ref.url, "/v1/chat/completions", body)
						if want.PromptTokens < c.minTokens {
							t.Fatalf("the prompt is %d tokens, want at least %d", want.PromptTokens, c.minTokens)
						}
						before := decodeCounters(t, decode)
						got, r := generate(t, proxy, "/v1/chat/completions", body)
						if r.pd() != "remote" {
							t.Errorf("x-tandem-pd %q, want remote", r.pd())
						}
						sameGeneration(t, want, got)
						checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)
					})
				}
			}
		})
	}
	waitPoolsIdle(t, ref, prefill, decode)
}
