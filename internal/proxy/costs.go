package proxy

import "time"

// engineSample is one scrape of an engine's /metrics: its load gauges and
// the cumulative counters its costs are measured from (each summed over its
// label sets).
type engineSample struct {
	// at is when it was taken.
	at                        time.Time
	waiting, running, kvUsage float64
	// ttftSum, ttftCount, queueSum and queueCount are
	// vllm:time_to_first_token_seconds' and
	// vllm:request_queue_time_seconds' sums and counts.
	ttftSum, ttftCount, queueSum, queueCount float64
	// computed and pulled are vllm:prompt_tokens_by_source's local_compute
	// and external_kv_transfer tokens.
	computed, pulled float64
	// transferSum is tandem:kv_transfer_seconds' sum.
	transferSum float64
	// itlSum and itlCount are vllm:inter_token_latency_seconds' sum and
	// count (the planner's decode step cost).
	itlSum, itlCount float64
	// info is the engine's tandem:engine_info (zero when it publishes
	// none).
	info engineInfo
}

// minCostTokens is how many prompt tokens an engine must have computed (or
// pulled) since a cost was last measured before it is measured again: fewer
// would make a per-token cost of one short prompt's step.
const minCostTokens = 64

// costs are an engine's measured costs (router.Endpoint's
// PrefillSecondsPerToken, TransferSecondsPerToken and QueueSeconds) and the
// samples each was last measured at. Each is the mean over the window since
// its last measurement, so it follows the engine's load.
type costs struct {
	have                                     bool
	prefillAt, transferAt, queueAt, itlAt    engineSample
	prefillPerToken, transferPerToken, queue float64
	// itl is the mean inter-token latency over the last window with tokens
	// in it (router.Endpoint.ITLSeconds).
	itl float64
}

// observe measures the costs anew from s where enough happened since the
// last measurement. A counter that went back (the engine restarted) starts
// every window again from s.
func (c *costs) observe(s engineSample) {
	if !c.have || s.ttftSum < c.prefillAt.ttftSum || s.queueSum < c.queueAt.queueSum ||
		s.computed < c.prefillAt.computed || s.pulled < c.transferAt.pulled || s.transferSum < c.transferAt.transferSum ||
		s.itlCount < c.itlAt.itlCount {
		c.prefillAt, c.transferAt, c.queueAt, c.itlAt, c.have = s, s, s, s, true
		return
	}
	switch n := s.computed - c.prefillAt.computed; {
	case s.pulled != c.prefillAt.pulled:
		// A request whose KV was pulled has a TTFT but computed next to
		// nothing: a window with one is no measure of the prefill rate, and
		// is dropped. (A decode that pulls all the time is then priced at
		// the prefill engines' rate.)
		c.prefillAt = s
	case n >= minCostTokens && s.waiting > 0 && c.prefillAt.waiting > 0:
		// Requests waited at both ends of the window: the engine computed
		// prompts all along, and its rate is its throughput.
		if t := s.at.Sub(c.prefillAt.at).Seconds(); t > 0 {
			c.prefillPerToken = t / n
		}
		c.prefillAt = s
	case n >= minCostTokens:
		// TTFT less the queue is the compute from being scheduled to the
		// first token: the prompt's prefill (a KV pull waits in the queue).
		// The two are observed at different moments of a request, so the
		// difference is one only over the same requests: a window whose
		// counts differ grows until they agree.
		if s.ttftCount != s.queueCount || s.ttftCount-c.prefillAt.ttftCount < 1 {
			break
		}
		if c.prefillAt.ttftCount != c.prefillAt.queueCount {
			c.prefillAt = s // a clean start for the next window
			break
		}
		if t := (s.ttftSum - c.prefillAt.ttftSum) - (s.queueSum - c.prefillAt.queueSum); t > 0 {
			c.prefillPerToken = t / n
		}
		c.prefillAt = s
	}
	if n := s.pulled - c.transferAt.pulled; n >= minCostTokens {
		if t := s.transferSum - c.transferAt.transferSum; t > 0 {
			c.transferPerToken = t / n
		}
		c.transferAt = s
	}
	if n := s.itlCount - c.itlAt.itlCount; n >= 1 {
		c.itl = max(s.itlSum-c.itlAt.itlSum, 0) / n
		c.itlAt = s
	}
	if n := s.queueCount - c.queueAt.queueCount; n >= 1 {
		c.queue = max(s.queueSum-c.queueAt.queueSum, 0) / n
		c.queueAt = s
	}
}
