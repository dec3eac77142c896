package vllmtest

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// benchWorkload is the workload both benchmark clients run: fixed prompt
// and output lengths (ignore_eos), Poisson arrivals.
type benchWorkload struct {
	requests, input, output int
	rate                    float64
}

// benchNumbers are what the comparison reads from either client's result.
type benchNumbers struct {
	completed, failed, outputTokens int
	ttftP50, tpotP50                float64 // milliseconds
}

func (n benchNumbers) String() string {
	return fmt.Sprintf("%d completed, %d failed, %d output tokens, median TTFT %.0f ms, median TPOT %.1f ms",
		n.completed, n.failed, n.outputTokens, n.ttftP50, n.tpotP50)
}

// vllmBenchServe runs `vllm bench serve` (the vllm backend: streamed
// /v1/completions) against url and reads its saved result.
func vllmBenchServe(t *testing.T, env Env, url, model string, w benchWorkload, seed int) benchNumbers {
	t.Helper()
	out := filepath.Join(t.TempDir(), "vllm-bench.json")
	cmd := exec.Command(env.VLLM(), "bench", "serve", "--backend", "vllm", "--base-url", url,
		"--model", "tiny", "--tokenizer", model, "--dataset-name", "random",
		"--random-input-len", strconv.Itoa(w.input), "--random-output-len", strconv.Itoa(w.output),
		"--num-prompts", strconv.Itoa(w.requests), "--request-rate", strconv.FormatFloat(w.rate, 'f', -1, 64),
		"--ignore-eos", "--seed", strconv.Itoa(seed), "--disable-tqdm",
		"--save-result", "--save-detailed", "--result-filename", out)
	cmd.Env = append(os.Environ(), CPUEnv(1)...)
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("vllm bench serve: %v\n%s", err, tail(string(log), 4000))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("vllm bench serve wrote no result: %v\n%s", err, tail(string(log), 4000))
	}
	var r struct {
		Completed         int      `json:"completed"`
		Failed            int      `json:"failed"`
		TotalOutputTokens int      `json:"total_output_tokens"`
		MedianTTFT        float64  `json:"median_ttft_ms"`
		MedianTPOT        float64  `json:"median_tpot_ms"`
		Errors            []string `json:"errors"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("vllm bench serve's result %s: %v", tail(string(b), 2000), err)
	}
	for _, e := range r.Errors {
		if e != "" {
			t.Logf("vllm bench serve: a request failed: %s", tail(e, 1000))
		}
	}
	return benchNumbers{r.Completed, r.Failed, r.TotalOutputTokens, r.MedianTTFT, r.MedianTPOT}
}

// tandemBench runs `tandem bench` with the same workload against url.
func tandemBench(t *testing.T, bin, url, model string, w benchWorkload, seed int) benchNumbers {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tandem-bench.json")
	cmd := exec.Command(bin, "bench", "--url", url, "--model", "tiny", "--tokenizer", model,
		"--prompt-tokens", strconv.Itoa(w.input), "--max-tokens", strconv.Itoa(w.output),
		"--requests", strconv.Itoa(w.requests), "--rate", strconv.FormatFloat(w.rate, 'f', -1, 64),
		"--seed", strconv.Itoa(seed), "--progress", "0", "--json", out)
	if log, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tandem bench: %v\n%s", err, tail(string(log), 4000))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Results []struct {
			Completed         int `json:"completed"`
			Failed            int `json:"failed"`
			TotalOutputTokens int `json:"total_output_tokens"`
			TTFT              struct {
				P50 float64 `json:"p50_ms"`
			} `json:"ttft"`
			TPOT struct {
				P50 float64 `json:"p50_ms"`
			} `json:"tpot"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &s); err != nil || len(s.Results) != 1 {
		t.Fatalf("tandem bench's result (%v): want one result", err)
	}
	r := s.Results[0]
	return benchNumbers{r.Completed, r.Failed, r.TotalOutputTokens, r.TTFT.P50, r.TPOT.P50}
}

// spread is max/min of xs (1 for equal values).
func spread(xs ...float64) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return hi / lo
}

// TestVLLMBenchServeAgainstTandemUp runs vLLM's benchmark client against
// `tandem up` (a prefill, a decode and the proxy) on a model directory
// Tandem wrote, alternated with `tandem bench` on the same workload (vLLM,
// Tandem, vLLM, Tandem): vLLM's client completes every request, and its
// median TTFT and TPOT agree with tandem bench's within the noise. The noise
// is the larger spread (max/min) between one client's own two runs; the
// clients agree when the ratio of their means is within 1.5 times that.
func TestVLLMBenchServeAgainstTandemUp(t *testing.T) {
	env := Require(t)
	model := smolModel(t)
	bin := buildTandem(t)
	// A first byte may take minutes on a loaded 2-core host; the proxy's
	// default limit (1m) would turn that into a 504 the comparison is not
	// about.
	up := startTandem(t, bin, 5*time.Minute, "up", "--model", model, "--served-model-name", "tiny", "--first-byte-timeout", "5m")
	w := benchWorkload{requests: 8, input: 128, output: 16, rate: 1}
	var vl, td []benchNumbers
	for i := range 2 {
		vl = append(vl, vllmBenchServe(t, env, up.url, model, w, 100+i))
		td = append(td, tandemBench(t, bin, up.url, model, w, 200+i))
	}
	for i := range vl {
		t.Logf("round %d: vllm bench serve: %v", i, vl[i])
		t.Logf("round %d: tandem bench:     %v", i, td[i])
		for _, n := range []benchNumbers{vl[i], td[i]} {
			if n.completed != w.requests || n.failed != 0 || n.outputTokens != w.requests*w.output {
				t.Errorf("round %d: %v: want %d completed, none failed, %d output tokens", i, n, w.requests, w.requests*w.output)
			}
		}
	}
	for _, m := range []struct {
		name string
		get  func(benchNumbers) float64
	}{
		{"median TTFT", func(n benchNumbers) float64 { return n.ttftP50 }},
		{"median TPOT", func(n benchNumbers) float64 { return n.tpotP50 }},
	} {
		noise := max(spread(m.get(vl[0]), m.get(vl[1])), spread(m.get(td[0]), m.get(td[1])))
		ratio := spread((m.get(vl[0])+m.get(vl[1]))/2, (m.get(td[0])+m.get(td[1]))/2)
		t.Logf("%s: clients differ by a factor %.2f, repeats by %.2f", m.name, ratio, noise)
		if ratio > 1.5*noise {
			t.Errorf("%s: vllm bench serve and tandem bench differ by a factor %.2f, beyond the noise (repeats differ by %.2f)", m.name, ratio, noise)
		}
	}
}
