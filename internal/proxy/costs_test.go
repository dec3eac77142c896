package proxy

import (
	"bufio"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseEngineMetricsReadsTheCostCounters(t *testing.T) {
	text := `vllm:num_requests_waiting{model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3
vllm:time_to_first_token_seconds_sum{model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{model_name="m"} 4
vllm:request_queue_time_seconds_sum{model_name="m"} 0.5
vllm:request_queue_time_seconds_count{model_name="m"} 4
vllm:prompt_tokens_by_source{model_name="m",source="local_compute"} 2000
vllm:prompt_tokens_by_source{model_name="m",source="local_cache_hit"} 700
vllm:prompt_tokens_by_source{model_name="m",source="external_kv_transfer"} 300
tandem:kv_transfer_seconds_sum{model_name="m"} 0.03
tandem:kv_transfer_bytes_total{model_name="m"} 9e6
`
	s, ok := parseEngineMetrics(bufio.NewScanner(strings.NewReader(text)))
	want := engineSample{waiting: 1, ttftSum: 2.5, ttftCount: 4, queueSum: 0.5, queueCount: 4, computed: 2000, pulled: 300, transferSum: 0.03}
	if !ok || s != want {
		t.Errorf("got %+v ok=%v, want %+v", s, ok, want)
	}
}

func TestCostsAreMeasuredPerWindow(t *testing.T) {
	// at is a sample of an engine with no request between being scheduled
	// and its first token (the TTFT and queue counts agree).
	at := func(ttft, queue, queued, computed, pulled, transfer float64) engineSample {
		return engineSample{ttftSum: ttft, ttftCount: queued, queueSum: queue, queueCount: queued, computed: computed, pulled: pulled, transferSum: transfer}
	}
	t0 := time.Unix(1000, 0)
	// busy is a sample at second sec of an engine with requests waiting.
	busy := func(sec, computed float64, scheduled float64) engineSample {
		return engineSample{at: t0.Add(time.Duration(sec * float64(time.Second))), waiting: 3, ttftSum: 50 * scheduled, ttftCount: scheduled, queueSum: 49 * scheduled, queueCount: scheduled + 1, computed: computed}
	}
	// midway is at with one more request scheduled but not yet answered.
	midway := func(s engineSample, queue float64) engineSample {
		s.queueCount++
		s.queueSum += queue
		return s
	}
	type want struct{ prefill, transfer, queue float64 }
	tests := []struct {
		name    string
		samples []engineSample
		want    want
	}{
		{"one sample measures nothing", []engineSample{at(1, 0.2, 2, 1000, 100, 0.01)}, want{}},
		{"a window: (TTFT - queue) per computed token, transfer per pulled token, mean queue",
			[]engineSample{at(1, 0.2, 2, 1000, 100, 0.01), at(1.5, 0.3, 4, 2000, 100, 0.01), at(1.6, 0.4, 6, 2000, 300, 0.03)}, want{0.4 / 1000, 0.02 / 200, 0.05}},
		{"a window with a KV pull is no prefill measurement",
			[]engineSample{at(1, 0.2, 2, 1000, 100, 0.01), at(1.5, 0.3, 4, 2000, 300, 0.03), at(1.8, 0.3, 5, 3000, 300, 0.03)}, want{0.3 / 1000, 0.02 / 200, 0}},
		{"too few tokens: the window grows until it has enough",
			[]engineSample{at(0, 0, 0, 0, 0, 0), at(0.01, 0, 1, 32, 0, 0), at(0.02, 0, 2, 80, 0, 0), at(0.02, 0, 2, 80, 10, 0.001), at(0.02, 0, 2, 80, 70, 0.007)}, want{0.02 / 80, 0.007 / 70, 0}},
		{"the latest window replaces the last",
			[]engineSample{at(0, 0, 0, 0, 0, 0), at(1, 0, 1, 1000, 0, 0), at(1.2, 0, 2, 2000, 0, 0)}, want{0.2 / 1000, 0, 0}},
		{"requests waiting at both ends: the throughput over the window",
			[]engineSample{busy(0, 0, 0), busy(0.5, 400, 2), busy(1, 1000, 4)}, want{0.5 / 600, 0, 49}},
		{"a request scheduled but not answered at the window's end: the window grows",
			[]engineSample{at(0, 0, 0, 0, 0, 0), midway(at(1, 0, 1, 1000, 0, 0), 0.2), at(1.5, 0.2, 2, 2000, 0, 0)}, want{1.3 / 2000, 0, 0.1}},
		{"a restarted engine starts again and keeps the last measurement",
			[]engineSample{at(0, 0, 0, 0, 0, 0), at(1, 0, 1, 1000, 0, 0), at(0.1, 0, 1, 100, 0, 0), at(0.3, 0, 2, 200, 0, 0)}, want{0.2 / 100, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c costs
			for _, s := range tt.samples {
				c.observe(s)
			}
			if got := (want{c.prefillPerToken, c.transferPerToken, c.queue}); !closeTo(got.prefill, tt.want.prefill) || !closeTo(got.transfer, tt.want.transfer) || !closeTo(got.queue, tt.want.queue) {
				t.Errorf("costs %+v, want %+v", got, tt.want)
			}
		})
	}
}

func closeTo(a, b float64) bool { return math.Abs(a-b) <= 1e-12+1e-9*math.Abs(b) }
