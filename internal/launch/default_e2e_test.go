package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestTandemUpDefaultModel runs the README's first command, `tandem up` with
// no model, as a fresh user would (only the port is chosen, and the cache is
// a temporary one): it must write the embedded stories260K model to the
// cache, say what it is and where its license is, and answer the README's
// curls, through the P/D path, with the README's sample answers and with the
// golden greedy text of the shared model, for completions and for chat.
func TestTandemUpDefaultModel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the tandem binary; skipped in -short mode")
	}
	hf := testmodels.Stories260K(t)
	examples := readmeExamples(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // after startUp's shutdown
	exe := buildTandem(ctx, t)

	cache := t.TempDir()
	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	// --pd-decider always: the answers below are checked through the P/D
	// path, which the default decider skips for prompts this short.
	cmd := exec.CommandContext(ctx, exe, "up", "--port", strconv.Itoa(ports[0]), "--pd-decider", "always")
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache)
	up := startUp(t, cmd)
	url := waitEndpoint(t, &up.stdout, up.done)

	t.Run("the default model is written to the cache and described with its license", func(t *testing.T) {
		dir := filepath.Join(cache, "tandem", "models", defaultmodel.Name)
		if err := defaultmodel.Verify(dir); err != nil {
			t.Error(err)
		}
		if !strings.Contains(up.stdout.String(), defaultmodel.Describe(dir)+"\n") {
			t.Errorf("stdout lacks the line %q", defaultmodel.Describe(dir))
		}
		notice, err := os.ReadFile(filepath.Join(dir, defaultmodel.NoticeFile))
		if err != nil || !bytes.Contains(notice, []byte("MIT License")) {
			t.Errorf("the printed NOTICE.md does not hold the MIT license (%v)", err)
		}
		if !strings.Contains(up.stdout.String(), `model "stories260K"`) {
			t.Error("the endpoint line does not name the model stories260K")
		}
	})

	for _, ex := range examples {
		t.Run("the README's "+ex.path+" curl gets the README's answer", func(t *testing.T) {
			got := generate(t, url, ex.path, ex.body)
			if strings.TrimSpace(got) != strings.TrimSpace(ex.answer) {
				t.Errorf("answer\n%q\nREADME says\n%q", got, ex.answer)
			}
		})
	}

	// The greedy continuation of the golden text's first words is the rest
	// of the golden text, through the proxy and both engines.
	g := testutil.StoriesGolden(t)
	const prompt = "Once upon a time"
	tok, err := tokenizer.Load(hf)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(prompt, true)
	if len(ids) >= len(g.GreedyIDs) || !slices.Equal(ids, g.GreedyIDs[:len(ids)]) {
		t.Fatalf("%q encodes to %v, not a prefix of the golden ids", prompt, ids)
	}
	maxTokens := strconv.Itoa(len(g.GreedyIDs) - len(ids))
	want := strings.TrimPrefix(g.GreedyText, prompt)
	requests := []struct{ name, path, body string }{
		{"completions", "/v1/completions", `{"model":"stories260K","prompt":"` + prompt + `","max_tokens":` + maxTokens + `,"temperature":0}`},
		{"chat continuing the message", "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"` + prompt + `"}],"add_generation_prompt":false,"max_tokens":` + maxTokens + `,"temperature":0}`},
	}
	for _, r := range requests {
		t.Run(r.name+" through P/D is the golden greedy text", func(t *testing.T) {
			if got := generate(t, url, r.path, r.body); got != want {
				t.Errorf("answer\n%q\nwant the golden\n%q", got, want)
			}
		})
	}
}

// generate posts body to url+path, requires the P/D path, and returns the
// answer's text (completions) or message content (chat).
func generate(t *testing.T, url, path, body string) string {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s %s: %s %s", path, body, resp.Status, b)
	}
	if pd := resp.Header.Get("X-Tandem-Pd"); pd != "remote" {
		t.Errorf("x-tandem-pd %q, want remote", pd)
	}
	var out struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("answer %s: %v, want one choice", b, err)
	}
	return out.Choices[0].Text + out.Choices[0].Message.Content
}

// buildTandem builds the tandem binary into a temporary directory.
func buildTandem(ctx context.Context, t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "tandem")
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, "github.com/tandem-serve/tandem/cmd/tandem")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
}

// readmeExample is a curl of the README's "Run the whole system" section
// and the answer the README shows for it.
type readmeExample struct {
	path, body, answer string
}

var (
	fenceRE = regexp.MustCompile("(?s)```(\\w*)\\n(.*?)```")
	curlRE  = regexp.MustCompile(`(?s)curl .*?localhost:8000(/v1/\S+) .*?-d '([^']*)'`)
)

// readmeExamples returns the curls of the README's "Run the whole system on
// one machine" section, each with the text block that follows it.
func readmeExamples(t *testing.T) []readmeExample {
	t.Helper()
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			t.Fatal("no go.mod above the test's directory")
		}
		root = filepath.Dir(root)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	const heading = "## Run the whole system on one machine\n"
	i := strings.Index(readme, heading)
	if i < 0 {
		t.Fatalf("README.md has no %q section", strings.TrimSpace(heading))
	}
	section := readme[i+len(heading):]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	var out []readmeExample
	var pending *readmeExample
	for _, f := range fenceRE.FindAllStringSubmatch(section, -1) {
		if m := curlRE.FindStringSubmatch(f[2]); f[1] == "sh" && m != nil {
			pending = &readmeExample{path: m[1], body: m[2]}
		} else if f[1] == "text" && pending != nil {
			pending.answer = f[2]
			out = append(out, *pending)
			pending = nil
		}
	}
	paths := map[string]bool{}
	for _, ex := range out {
		paths[ex.path] = true
	}
	if !paths["/v1/completions"] || !paths["/v1/chat/completions"] {
		t.Fatalf("the README's section shows %d curls with answers; want a completions and a chat one, each followed by a text block with its answer", len(out))
	}
	return out
}
