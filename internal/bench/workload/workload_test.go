package workload

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var pool = func() []int32 {
	p := make([]int32, 990)
	for i := range p {
		p[i] = int32(10 + i)
	}
	return p
}()

func TestParseDist(t *testing.T) {
	good := []struct {
		in   string
		want Dist
	}{
		{"128", Fixed(128)},
		{"fixed:7", Fixed(7)},
		{"uniform:100:300", Dist{Kind: "uniform", A: 100, B: 300, Min: 100, Max: 300}},
		{"normal:200:50", Dist{Kind: "normal", A: 200, B: 50, Min: 1}},
		{"lognormal:128:1:4:1024", Dist{Kind: "lognormal", A: 128, B: 1, Min: 4, Max: 1024}},
	}
	for _, tc := range good {
		t.Run(tc.in+" parses", func(t *testing.T) {
			d, err := ParseDist(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d); diff != "" {
				t.Error(diff)
			}
			if back, err := ParseDist(d.String()); err != nil || back != d {
				t.Errorf("String %q does not round-trip: %+v, %v", d.String(), back, err)
			}
		})
	}
	for _, bad := range []string{"", "0", "-3", "1.5", "uniform:5", "uniform:9:3", "normal:1", "lognormal:0:1", "poisson:3", "normal:10:2:5", "fixed:x"} {
		t.Run(bad+" is refused", func(t *testing.T) {
			if _, err := ParseDist(bad); err == nil || !strings.Contains(err.Error(), "want N") {
				t.Errorf("ParseDist(%q) = %v, want an error that shows the forms", bad, err)
			}
		})
	}
}

func TestDistDrawsStayInBoundsWithTheRightMean(t *testing.T) {
	for _, d := range []Dist{Fixed(5), LongInput, LongOutput, ChatInput, ChatOutput, {Kind: "normal", A: 50, B: 10, Min: 1}} {
		r := rand.New(rand.NewPCG(1, 2))
		var sum float64
		const n = 20000
		for range n {
			x := d.Draw(r)
			if x < max(d.Min, 1) || (d.Max > 0 && x > d.Max) {
				t.Fatalf("%v drew %d, outside [%d, %d]", d, x, d.Min, d.Max)
			}
			sum += float64(x)
		}
		mean := sum / n
		want := d.Mean()
		if d.Kind == "lognormal" { // clamping cuts the tail: the mean falls below the unclamped one
			if mean > want || mean < want*0.75 {
				t.Errorf("%v: mean %.1f, want a bit below %.1f", d, mean, want)
			}
		} else if mean < want*0.98 || mean > want*1.02 {
			t.Errorf("%v: mean %.1f, want %.1f", d, mean, want)
		}
	}
}

func TestGeneratorsAreSeededAndExact(t *testing.T) {
	a, b, c := Chat(1, 50, pool), Chat(1, 50, pool), Chat(2, 50, pool)
	same := func(x, y *Workload) bool {
		for i := range x.Conversations {
			if !slices.Equal(x.Conversations[i].Turns[0].Prompt, y.Conversations[i].Turns[0].Prompt) ||
				x.Conversations[i].Turns[0].MaxTokens != y.Conversations[i].Turns[0].MaxTokens {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("the same seed gave different chat workloads")
	}
	if same(a, c) {
		t.Error("different seeds gave the same chat workload")
	}
	l := Long(3, 40, pool)
	for _, cv := range l.Conversations {
		tu := cv.Turns[0]
		if len(tu.Prompt) < 1024 || len(tu.Prompt) > 2048 || tu.MaxTokens < 100 || tu.MaxTokens > 300 || tu.PromptLen != len(tu.Prompt) {
			t.Fatalf("long request with %d prompt and %d output tokens", len(tu.Prompt), tu.MaxTokens)
		}
		if cv.ID != "" || len(cv.Turns) != 1 {
			t.Fatalf("single-turn request has id %q and %d turns", cv.ID, len(cv.Turns))
		}
	}
	f := Lengths("fixed", 0, 3, Fixed(17), Fixed(9), pool)
	for _, cv := range f.Conversations {
		if len(cv.Turns[0].Prompt) != 17 || cv.Turns[0].MaxTokens != 9 {
			t.Errorf("fixed lengths gave %d/%d", len(cv.Turns[0].Prompt), cv.Turns[0].MaxTokens)
		}
	}
}

func TestSharedPrefixGroupsShareExactlyTheirPrefix(t *testing.T) {
	w, err := SharedPrefix(4, 12, 3, 40, Fixed(10), Fixed(5), pool)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range w.Conversations {
		if c.Group != i%3 || len(c.Turns[0].Prompt) != 50 {
			t.Fatalf("request %d: group %d, %d tokens", i, c.Group, len(c.Turns[0].Prompt))
		}
		first := w.Conversations[c.Group].Turns[0].Prompt
		if !slices.Equal(c.Turns[0].Prompt[:40], first[:40]) {
			t.Errorf("request %d does not share its group's prefix", i)
		}
		if i >= 3 && slices.Equal(c.Turns[0].Prompt[40:], first[40:]) {
			t.Errorf("request %d repeats its group's suffix", i)
		}
	}
	if slices.Equal(w.Conversations[0].Turns[0].Prompt[:40], w.Conversations[1].Turns[0].Prompt[:40]) {
		t.Error("groups 0 and 1 have the same prefix")
	}
	if _, err := SharedPrefix(1, 3, 0, 10, Fixed(1), Fixed(1), pool); err == nil {
		t.Error("zero groups accepted")
	}
}

func TestMultiTurnConversations(t *testing.T) {
	w := MultiTurn(5, 10, Dist{Kind: "uniform", A: 2, B: 4, Min: 2, Max: 4}, Fixed(16), Fixed(8), Fixed(250), pool)
	ids := map[string]bool{}
	for _, c := range w.Conversations {
		if c.ID == "" || ids[c.ID] {
			t.Fatalf("conversation id %q missing or repeated", c.ID)
		}
		ids[c.ID] = true
		if len(c.Turns) < 2 || len(c.Turns) > 4 {
			t.Fatalf("%d turns", len(c.Turns))
		}
		for j, tu := range c.Turns {
			wantThink := 250 * time.Millisecond
			if j == 0 {
				wantThink = 0
			}
			if tu.Think != wantThink || len(tu.Prompt) != 16 || tu.MaxTokens != 8 {
				t.Errorf("turn %d: think %v, %d/%d tokens", j, tu.Think, len(tu.Prompt), tu.MaxTokens)
			}
		}
	}
	p, o := w.Stats()
	if o != 8 || p <= 16 {
		t.Errorf("Stats %v %v: later turns' prompts should include their history", p, o)
	}
}

func TestFitClipsToTheContext(t *testing.T) {
	w := Lengths("x", 0, 2, Fixed(100), Fixed(50), pool)
	w.Conversations[1].Turns[0].Prompt = w.Conversations[1].Turns[0].Prompt[:10]
	w.Fit(120)
	if got := w.Conversations[0].Turns[0]; len(got.Prompt) != 100 || got.MaxTokens != 20 {
		t.Errorf("first request %d+%d, want 100+20", len(got.Prompt), got.MaxTokens)
	}
	if w.Clipped != 1 {
		t.Errorf("Clipped %d, want 1", w.Clipped)
	}
	w = Lengths("x", 0, 1, Fixed(300), Fixed(50), pool)
	w.Fit(120)
	if got := w.Conversations[0].Turns[0]; len(got.Prompt)+got.MaxTokens != 120 || got.MaxTokens != 1 {
		t.Errorf("long prompt clipped to %d+%d, want 119+1", len(got.Prompt), got.MaxTokens)
	}
	m := MultiTurn(1, 1, Fixed(5), Fixed(30), Fixed(30), Fixed(1), pool)
	m.Fit(130)
	if n := len(m.Conversations[0].Turns); n != 3 {
		t.Errorf("multi-turn kept %d turns in 130 tokens, want 3 (60+60+10)", n)
	}
}

func TestReadTrace(t *testing.T) {
	trace := `{"timestamp": 1000, "input_length": 1100, "output_length": 52, "hash_ids": [1, 2, 3]}

{"timestamp": 1500, "input_length": 600, "output_length": 8, "hash_ids": [1, 9]}
{"TIMESTAMP": 3000, "ContextTokens": 20, "GeneratedTokens": 4}
`
	w, err := ReadTrace(strings.NewReader(trace), "t.jsonl", TraceOptions{Speed: 2}, 1, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !w.TimedArrivals || len(w.Conversations) != 3 {
		t.Fatalf("%d requests, timed %v", len(w.Conversations), w.TimedArrivals)
	}
	wantArr := []time.Duration{0, 250 * time.Millisecond, time.Second}
	for i, c := range w.Conversations {
		if c.Arrival != wantArr[i] {
			t.Errorf("request %d arrives at %v, want %v", i, c.Arrival, wantArr[i])
		}
	}
	a, b := w.Conversations[0].Turns[0], w.Conversations[1].Turns[0]
	if len(a.Prompt) != 1100 || a.MaxTokens != 52 || len(b.Prompt) != 600 || w.Conversations[2].Turns[0].MaxTokens != 4 {
		t.Errorf("lengths %d/%d, %d", len(a.Prompt), a.MaxTokens, len(b.Prompt))
	}
	if !slices.Equal(a.Prompt[:512], b.Prompt[:512]) {
		t.Error("requests with the same first hash id do not share their first block")
	}
	if slices.Equal(a.Prompt[512:600], b.Prompt[512:600]) {
		t.Error("different second hash ids gave the same block")
	}

	bad := []struct{ name, trace, want string }{
		{"not JSON", "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 5}\nnot json\n", "line 2: not a JSON object"},
		{"missing lengths", `{"timestamp": 1, "input_length": 5}`, "line 1: needs input_length and output_length"},
		{"zero output", `{"timestamp": 1, "input_length": 5, "output_length": 0}`, "must be at least 1"},
		{"no timestamp", `{"input_length": 5, "output_length": 5}`, "needs a timestamp"},
		{"bad timestamp", `{"timestamp": "yesterday", "input_length": 5, "output_length": 5}`, "want milliseconds or a date-time"},
		{"going backwards", "{\"timestamp\": 10, \"input_length\": 5, \"output_length\": 5}\n{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 5}", "line 2: timestamp 9 is before"},
		{"too many hashes", `{"timestamp": 1, "input_length": 5, "output_length": 5, "hash_ids": [1, 2]}`, "more than input_length 5 needs"},
		{"empty", "\n\n", "has no requests"},
	}
	for _, tc := range bad {
		t.Run(tc.name+" is a clear error", func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.trace), "t.jsonl", TraceOptions{}, 1, pool)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "t.jsonl") {
				t.Errorf("error %v, want one naming the file and containing %q", err, tc.want)
			}
		})
	}
	azure := `{"TIMESTAMP": "2023-11-16 18:15:46.6805900", "ContextTokens": 10, "GeneratedTokens": 3}
{"TIMESTAMP": "2023-11-16 18:15:47.1805900", "ContextTokens": 10, "GeneratedTokens": 3}`
	w, err = ReadTrace(strings.NewReader(azure), "azure.jsonl", TraceOptions{}, 1, pool)
	if err != nil || w.Conversations[1].Arrival != 500*time.Millisecond {
		t.Errorf("Azure-style timestamps: %v, %+v", err, w)
	}
}

func TestRelabelKeepsTheSharingAndChangesEveryToken(t *testing.T) {
	pool := []int32{10, 11, 12, 13, 14, 15, 16, 17}
	w, err := SharedPrefix(3, 6, 2, 5, Fixed(3), Fixed(2), pool)
	if err != nil {
		t.Fatal(err)
	}
	mt := MultiTurn(3, 2, Fixed(2), Fixed(3), Fixed(2), Fixed(10), pool)
	w.Conversations = append(w.Conversations, mt.Conversations...)
	alpha := w.Alphabet(append(pool, 10)) // duplicates collapse
	if len(alpha) != len(pool) {
		t.Fatalf("alphabet %v, want the pool's %d ids", alpha, len(pool))
	}
	if r := w.Relabel(alpha, 0); !reflect.DeepEqual(r.Conversations, w.Conversations) {
		t.Error("level 0 changed the workload")
	}
	for _, level := range []int{1, 3, 7} {
		r := w.Relabel(alpha, level)
		if r.Requests() != w.Requests() || r.Name != w.Name {
			t.Fatalf("level %d: %d requests, want %d", level, r.Requests(), w.Requests())
		}
		for ci, c := range r.Conversations {
			o := w.Conversations[ci]
			if c.Group != o.Group || (o.ID != "" && c.ID != fmt.Sprintf("%s-l%d", o.ID, level)) {
				t.Errorf("level %d conversation %d: group %d id %q, from %d %q", level, ci, c.Group, c.ID, o.Group, o.ID)
			}
			for ti, tu := range c.Turns {
				ot := o.Turns[ti]
				if len(tu.Prompt) != len(ot.Prompt) || tu.MaxTokens != ot.MaxTokens || tu.Think != ot.Think {
					t.Errorf("level %d: turn %d/%d lengths or think changed", level, ci, ti)
				}
				for k, id := range tu.Prompt {
					if id == ot.Prompt[k] || !slices.Contains(pool, id) {
						t.Errorf("level %d: id %d became %d: want another id of the pool", level, ot.Prompt[k], id)
					}
				}
			}
		}
		// The two groups' prompts still share their 5-token prefixes.
		for i := 2; i < 6; i++ {
			if !slices.Equal(r.Conversations[i].Turns[0].Prompt[:5], r.Conversations[i-2].Turns[0].Prompt[:5]) {
				t.Errorf("level %d: requests %d and %d of one group lost their shared prefix", level, i-2, i)
			}
		}
	}
	// The original is untouched.
	if w.Conversations[6].ID != "bench-3-0" {
		t.Errorf("Relabel changed its input: id %q", w.Conversations[6].ID)
	}
}
