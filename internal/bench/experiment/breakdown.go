package experiment

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// scrapeAll reads the _sum and _count of every histogram on the /metrics
// pages of urls, keyed by metric name.
func scrapeAll(ctx context.Context, urls []string) map[string]float64 {
	out := map[string]float64{}
	for _, u := range urls {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			name, val, ok := strings.Cut(line, " ")
			if !ok || strings.HasPrefix(line, "#") {
				continue
			}
			base, _, _ := strings.Cut(name, "{")
			if strings.HasSuffix(base, "_sum") || strings.HasSuffix(base, "_count") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					out[base] += f
				}
			}
		}
		resp.Body.Close()
	}
	return out
}

// writeBreakdown prints the mean time per request of each P/D phase the
// proxy and engines measure, from their histograms' growth over a workload:
// means over all rates and rounds, beside the per-request spans of the
// table's TTFT breakdown (from the answers' Server-Timing headers), which
// they cross-check.
func writeBreakdown(w io.Writer, config string, before, after map[string]float64) {
	mean := func(name string) (float64, bool) {
		n := after[name+"_count"] - before[name+"_count"]
		if n <= 0 {
			return 0, false
		}
		return 1000 * (after[name+"_sum"] - before[name+"_sum"]) / n, true
	}
	fmt.Fprintf(w, "P/D time breakdown (means over the %s configuration's requests of all rates, from the proxy's and engines' /metrics histograms):\n", config)
	for _, m := range []struct{ name, what string }{
		{"tandem:proxy_prefill_seconds", "proxy: prefill leg (queue + prefill on the prefill engine)"},
		{"tandem:proxy_decode_ttfb_seconds", "proxy: decode leg to its first byte (KV pull + first decode step + queue)"},
		{"tandem:kv_transfer_seconds", "decode engine: KV transfer of one request"},
		{"vllm:request_queue_time_seconds", "both engines: time waiting to be scheduled"},
		{"vllm:time_to_first_token_seconds", "both engines: their own TTFT (prefill's = its leg)"},
		{"tandem:proxy_request_seconds", "proxy: whole request"},
	} {
		if v, ok := mean(m.name); ok {
			fmt.Fprintf(w, "  %-70s %8.1f ms\n", m.what, v)
		} else {
			fmt.Fprintf(w, "  %-70s %8s\n", m.what, "n/a")
		}
	}
}
