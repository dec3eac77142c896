// Package metrics holds an engine's Prometheus collectors under vLLM's metric
// names (so existing dashboards work) plus Tandem's own kv-transfer metrics.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Engine is the set of collectors one engine process exports. Each Engine has
// its own registry so tests can run several engines in one process.
type Engine struct {
	Registry *prometheus.Registry

	NumRequestsRunning prometheus.Gauge
	NumRequestsWaiting prometheus.Gauge
	KVCacheUsage       prometheus.Gauge
	PrefixCacheQueries prometheus.Counter
	PrefixCacheHits    prometheus.Counter
	PromptTokens       prometheus.Counter
	GenerationTokens   prometheus.Counter
	RequestSuccess     *prometheus.CounterVec // finish_reason
	NumPreemptions     prometheus.Counter
	TimeToFirstToken   prometheus.Histogram
	InterTokenLatency  prometheus.Histogram
	E2ELatency         prometheus.Histogram
	QueueTime          prometheus.Histogram
	PromptTokensBySrc  *prometheus.CounterVec // source=local_compute|local_cache_hit|external_kv_transfer

	KVTransferBytes    prometheus.Counter
	KVTransferSeconds  prometheus.Histogram
	KVTransferFailures *prometheus.CounterVec // reason
	KVBlocksHeld       prometheus.Gauge
	KVPullsInFlight    prometheus.Gauge // decode side: pulls under way
	KVLeasesExpired    prometheus.Counter
	// KVReleases counts prefill holds released before their lease, by
	// reason: request (POST /tandem/kv/release), client_gone (the answer
	// carrying the params could not be delivered).
	KVReleases  *prometheus.CounterVec
	PDFallbacks *prometheus.CounterVec // reason
	// KVParamsRejected counts kv_transfer_params naming remote KV that an
	// engine refused or could not use, by reason: expired (genuine, but
	// the leg came after the issuer's hold ended; the load-failure policy
	// then recomputes or fails), bad_signature, peer_not_allowed,
	// other_prompt.
	KVParamsRejected *prometheus.CounterVec
	// HistoryRecomputed counts turn-2 prefills that computed a
	// conversation's history locally instead of pulling it from the
	// decode that holds it, by reason (below_threshold, history_mismatch,
	// local_hit); failed pulls count in KVTransferFailures.
	HistoryRecomputed *prometheus.CounterVec
	// HistoryTokensPulled counts the history tokens turn-2 prefills pulled.
	HistoryTokensPulled prometheus.Counter
	// ConversationHolds is the number of conversations a decode holds.
	ConversationHolds prometheus.Gauge

	// PrefillStepsDeferred counts steps in which the prefill cadence
	// (--prefill-schedule-interval) held prefill compute back while
	// requests decoded; PrefillCadenceLifted counts off-cadence steps that
	// ran prefill because the capacity-bound guard was set (the waiting
	// queue did not drain at the last admitting step).
	PrefillStepsDeferred prometheus.Counter
	PrefillCadenceLifted prometheus.Counter
	// PrefillScheduleInterval is the prefill cadence in use: the flag's at
	// start, then whatever the admin route last set.
	PrefillScheduleInterval prometheus.Gauge
	// KVFetchByStage counts the requests whose KV comes from a remote
	// engine by fetch stage (stage=waiting_to_start|in_progress|
	// completed_waiting), under the name third-party vLLM scrapers read.
	KVFetchByStage *prometheus.GaugeVec
	// KVFetchStageSeconds is the time a request's KV fetch spent in each
	// stage, observed when the request first runs.
	KVFetchStageSeconds *prometheus.HistogramVec
	// KVHoldAges exports the KV holds by age (tandem:kv_holds_by_age); the
	// engine's KV producer sets its source.
	KVHoldAges *HoldAges
}

// KVFetchStages are the stage label values of KVFetchByStage and
// KVFetchStageSeconds, in the order a fetch goes through them.
var KVFetchStages = []string{"waiting_to_start", "in_progress", "completed_waiting"}

// RegisterRuntime registers the Go runtime collector (go_goroutines,
// go_memstats_*, go_gc_*, go_threads, ...) and the process collector
// (process_resident_memory_bytes, process_open_fds, ...) on r, so a
// goroutine or memory leak shows in /metrics before it shows as threads or
// RSS. Engines and the proxy both call it on their registries.
func RegisterRuntime(r *prometheus.Registry) {
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

// NewEngine creates the collectors, labelled with the served model name.
func NewEngine(modelName string) *Engine {
	r := prometheus.NewRegistry()
	l := prometheus.Labels{"model_name": modelName}
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	g := func(name, help string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l})
		f(x)
		return x
	}
	c := func(name, help string) prometheus.Counter {
		x := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
		f(x)
		return x
	}
	cv := func(name, help, label string) *prometheus.CounterVec {
		x := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l}, []string{label})
		f(x)
		return x
	}
	h := func(name, help string, b []float64) prometheus.Histogram {
		x := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: l, Buckets: b})
		f(x)
		return x
	}
	RegisterRuntime(r)
	e := &Engine{Registry: r}
	e.NumRequestsRunning = g("vllm:num_requests_running", "Number of requests in model execution batches.")
	e.NumRequestsWaiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	e.KVCacheUsage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	e.PrefixCacheQueries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
	e.PrefixCacheHits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
	e.PromptTokens = c("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	e.GenerationTokens = c("vllm:generation_tokens_total", "Number of generation tokens processed.")
	e.RequestSuccess = cv("vllm:request_success_total", "Count of successfully processed requests.", "finish_reason")
	e.NumPreemptions = c("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.")
	e.TimeToFirstToken = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", latencyBuckets)
	e.InterTokenLatency = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", latencyBuckets)
	e.E2ELatency = h("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", latencyBuckets)
	e.QueueTime = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", latencyBuckets)
	e.PromptTokensBySrc = cv("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", "source")
	for _, s := range []string{"local_compute", "local_cache_hit", "external_kv_transfer"} {
		e.PromptTokensBySrc.WithLabelValues(s)
	}
	e.KVTransferBytes = c("tandem:kv_transfer_bytes_total", "KV-cache bytes moved between engines.")
	e.KVTransferSeconds = h("tandem:kv_transfer_seconds", "Histogram of the time one request's KV transfer took.", latencyBuckets)
	e.KVTransferFailures = cv("tandem:kv_transfer_failures_total", "KV transfers that failed, by reason.", "reason")
	e.KVBlocksHeld = g("tandem:kv_blocks_held", "KV blocks held under a lease for a remote decode (prefill side).")
	e.KVReleases = cv("tandem:kv_releases_total", "KV holds a prefill released before their lease, by reason (request: POST /tandem/kv/release; client_gone: the answer could not be delivered).", "reason")
	e.KVPullsInFlight = g("tandem:kv_pulls_in_flight", "KV pulls from prefill engines under way (decode side).")
	e.KVLeasesExpired = c("tandem:kv_leases_expired_total", "Leases on KV blocks that expired before the decode read them.")
	e.KVParamsRejected = cv("tandem:kv_params_rejected_total", "kv_transfer_params naming remote KV that this engine refused or could not use, by reason (expired, bad_signature, peer_not_allowed, other_prompt).", "reason")
	e.PDFallbacks = cv("tandem:pd_fallbacks_total", "Requests meant for the P/D path that did not take it, by reason.", "reason")
	e.HistoryRecomputed = cv("tandem:kv_history_recomputed_total", "Turn-2 prefills that computed the conversation history locally instead of pulling it, by reason.", "reason")
	e.HistoryTokensPulled = c("tandem:kv_history_tokens_pulled_total", "Conversation-history tokens turn-2 prefills pulled from a decode engine.")
	e.ConversationHolds = g("tandem:kv_conversation_holds", "Conversations whose KV this decode engine holds for the next turn.")
	e.PrefillStepsDeferred = c("tandem:prefill_steps_deferred_total", "Steps in which the prefill cadence deferred prefill compute while requests decoded.")
	e.PrefillScheduleInterval = g("tandem:prefill_schedule_interval", "The prefill cadence in use: prefill compute runs on every Nth step while requests decode (1: every step).")
	e.PrefillCadenceLifted = c("tandem:prefill_cadence_lifted_total", "Off-cadence steps that ran prefill because the waiting queue did not drain (capacity-bound guard).")
	e.KVFetchByStage = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_kv_fetch_by_stage", Help: "Requests whose KV is fetched from a remote engine, by fetch stage.", ConstLabels: l}, []string{"stage"})
	f(e.KVFetchByStage)
	e.KVFetchStageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem:kv_fetch_stage_seconds", Help: "Histogram of the time a request's remote KV fetch spent in each stage.", ConstLabels: l, Buckets: latencyBuckets}, []string{"stage"})
	f(e.KVFetchStageSeconds)
	e.KVHoldAges = NewHoldAges(l)
	f(e.KVHoldAges)
	for _, st := range KVFetchStages {
		e.KVFetchByStage.WithLabelValues(st)
		e.KVFetchStageSeconds.WithLabelValues(st)
	}
	return e
}

// Handler serves the registry in the Prometheus text format.
func (e *Engine) Handler() http.Handler {
	return promhttp.HandlerFor(e.Registry, promhttp.HandlerOpts{})
}
