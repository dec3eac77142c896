package proxy

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Outcomes of a proxied request, the outcome label of
// tandem:proxy_requests_total.
const (
	outcomeRemote         = "remote"          // P/D path taken
	outcomeFallback       = "fallback"        // decode did the whole request; see fallbacks_total
	outcomePrefillReject  = "prefill_4xx"     // the prefill's 4xx relayed to the client
	outcomeBadRequest     = "bad_request"     // rejected by the proxy itself (400, 413, 405)
	outcomeNoBackend      = "no_backend"      // 503: no healthy decode (or prefill without fallback)
	outcomePrefillFailed  = "prefill_failed"  // prefill failed and fallback is disabled
	outcomeDecodeFailed   = "decode_failed"   // decode unreachable or timed out before answering
	outcomeStreamBroken   = "stream_broken"   // decode answer cut mid-body (idle timeout, backend died)
	outcomeClientCanceled = "client_canceled" // client went away
	outcomeLocal          = "local"           // the decider chose a local prefill on the decode
	outcomeSaturated      = "saturated"       // 429: every candidate saturated, queue full or timed out
)

// metrics are the proxy's Prometheus collectors, on their own registry so
// several proxies (tests, tandem up) can live in one process.
type metrics struct {
	registry       *prometheus.Registry
	prefillSeconds prometheus.Histogram
	decodeTTFB     prometheus.Histogram
	requestSeconds prometheus.Histogram
	stageSeconds   *prometheus.HistogramVec // stage: the stage* constants
	stage          map[string]prometheus.Observer
	requests       *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	kvReleases     *prometheus.CounterVec
	inFlight       *prometheus.GaugeVec
	healthy        *prometheus.GaugeVec

	// Router.
	pdDecisions    *prometheus.CounterVec
	legRetries     *prometheus.CounterVec
	tokenMode      *prometheus.GaugeVec
	admission      *prometheus.CounterVec
	scrapeFailures *prometheus.CounterVec

	// Conversation mode (zero when it is off).
	convLookups     *prometheus.CounterVec
	prefixLookups   *prometheus.CounterVec
	convEvictions   *prometheus.CounterVec
	convStored      prometheus.Counter
	historyPrefills prometheus.Counter
	prefillRetries  *prometheus.CounterVec
	decodeAffinity  *prometheus.CounterVec
}

// Stages of a request, the stage label of tandem:proxy_stage_seconds.
const (
	stageRoute     = "route"
	stagePrefill   = "prefill_leg"
	stageFirstByte = "decode_first_byte"
	stageRelay     = "relay"
)

var stages = []string{stageRoute, stagePrefill, stageFirstByte, stageRelay}

// observeStage records that stage took from since to now.
func (m *metrics) observeStage(stage string, since time.Time) {
	m.stage[stage].Observe(time.Since(since).Seconds())
}

var legBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}

func newMetrics() *metrics {
	r := prometheus.NewRegistry()
	// Go runtime and process metrics (go_goroutines, process_*), so a
	// goroutine leak shows here before it shows as threads.
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &metrics{
		registry: r,
		prefillSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tandem:proxy_prefill_seconds",
			Help:    "Time of the prefill leg, from sending it to reading the prefill's whole answer.",
			Buckets: legBuckets,
		}),
		decodeTTFB: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tandem:proxy_decode_ttfb_seconds",
			Help:    "Time from sending the decode leg to the first byte of its body.",
			Buckets: legBuckets,
		}),
		requestSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tandem:proxy_request_seconds",
			Help:    "Time from receiving a request to relaying the last byte of its answer.",
			Buckets: legBuckets,
		}),
		stageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tandem:proxy_stage_seconds",
			Help:    "Time of each stage of a request through the proxy: route (from arrival to the decode picked and the P/D decision, admission queueing included), prefill_leg (the prefill leg, its retries included), decode_first_byte (from sending the decode leg to its first byte, retries included) and relay (from the decode's first byte to the answer's last byte relayed).",
			Buckets: legBuckets,
		}, []string{"stage"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_requests_total",
			Help: "Requests handled by the proxy, by API path and outcome.",
		}, []string{"path", "outcome"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_fallbacks_total",
			Help: "Requests sent to decode without remote prefill, by reason.",
		}, []string{"reason"}),
		kvReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_kv_releases_total",
			Help: "Held KV released through the engine's /tandem/kv/release, by reason and result: a prefill's because the decode leg never started, or (conversation mode) a decode's conversation hold no turn will use.",
		}, []string{"reason", "result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tandem:proxy_backend_in_flight",
			Help: "Requests the proxy has open on a backend.",
		}, []string{"role", "backend"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tandem:proxy_backend_healthy",
			Help: "1 when the backend's last health check passed.",
		}, []string{"role", "backend"}),
		pdDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_pd_decisions_total",
			Help: "Requests by how their prompt was prefilled (remote, local, fallback) and why.",
		}, []string{"decision", "reason"}),
		legRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_leg_retries_total",
			Help: "Legs retried on another engine of the pool after a failure, by role and the failure.",
		}, []string{"role", "reason"}),
		tokenMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tandem:proxy_token_count_mode",
			Help: "1 for how the router counts prompt tokens: exact (the model's tokenizer) or approximate (bytes/4, prefix blocks of 64 bytes).",
		}, []string{"mode"}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_admission_total",
			Help: "Requests that found every candidate engine saturated, by result: admitted after queueing, or rejected with 429.",
		}, []string{"result"}),
		scrapeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_scrape_failures_total",
			Help: "Failed scrapes of an engine's /metrics.",
		}, []string{"role", "backend"}),
		convLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_lookups_total",
			Help: "Requests naming a conversation (conversation mode), by whether the proxy held the decode's params from its last turn (hit) or not (miss: first turn, expired, evicted, or the last turn returned none).",
		}, []string{"result"}),
		prefixLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_prefix_lookups_total",
			Help: "Requests naming no conversation looked up by their prompt's leading blocks (conversation mode with --model), by result: hit (the prompt has every block of a remembered history), partial (it leaves the history after at least --conversation-min-prefix-tokens: an edited history, or a prefix another conversation shares) or miss.",
		}, []string{"result"}),
		convEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_evictions_total",
			Help: "Conversations forgotten before their next turn used them, by reason: capacity (least recently used, beyond --conversation-max-entries; the decode's hold is released), replaced (two turns ran at once, or a turn matched by prompt prefix remembered a history extending an older one; the older hold is released) or expired (the decode's hold had ended).",
		}, []string{"reason"}),
		convStored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_params_stored_total",
			Help: "Turns whose decode returned kv_transfer_params that the proxy kept for the conversation's next turn (by conversation id, or by the history's blocks for requests naming none).",
		}),
		historyPrefills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_history_prefills_total",
			Help: "Prefill legs sent with a decode's kv_transfer_params naming the conversation's history (turn 2 and later).",
		}),
		prefillRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_prefill_retries_total",
			Help: "Prefill legs with a conversation's history that failed and were retried once without it, by the failure (a fallback reason, or prefill_4xx).",
		}, []string{"reason"}),
		decodeAffinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_conversation_decode_affinity_total",
			Help: "Decode legs of a conversation's later turns: sent to the decode that answered the last turn (same_decode), or picked by the policy because it was unhealthy (decode_unhealthy).",
		}, []string{"result"}),
	}
	r.MustRegister(m.prefillSeconds, m.decodeTTFB, m.requestSeconds, m.stageSeconds, m.requests, m.fallbacks, m.kvReleases, m.inFlight, m.healthy,
		m.pdDecisions, m.legRetries, m.tokenMode, m.admission, m.scrapeFailures)
	m.stage = map[string]prometheus.Observer{}
	for _, stage := range stages {
		m.stage[stage] = m.stageSeconds.WithLabelValues(stage)
	}
	for _, reason := range append(fallbackReasons, reasonDecodeRetry) {
		m.fallbacks.WithLabelValues(reason)
	}
	for _, reason := range releaseReasons {
		for _, result := range releaseResults {
			m.kvReleases.WithLabelValues(reason, result)
		}
	}
	return m
}

// watchConversations registers the conversation-mode metrics, with their
// label values at zero, and a gauge of the conversations remembered.
func (m *metrics) watchConversations(c *conversations) {
	m.registry.MustRegister(m.convLookups, m.prefixLookups, m.convEvictions, m.convStored, m.historyPrefills, m.prefillRetries, m.decodeAffinity,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tandem:proxy_conversations",
			Help: "Conversations whose last turn's decode params the proxy holds (expired ones included until dropped).",
		}, func() float64 { return float64(c.len()) }))
	for _, v := range convLookupResults {
		m.convLookups.WithLabelValues(v)
	}
	for _, v := range prefixLookupResults {
		m.prefixLookups.WithLabelValues(v)
	}
	for _, v := range convEvictReasons {
		m.convEvictions.WithLabelValues(v)
	}
	for _, reason := range convReleaseReasons {
		for _, result := range releaseResults {
			m.kvReleases.WithLabelValues(reason, result)
		}
	}
	for _, v := range convAffinity {
		m.decodeAffinity.WithLabelValues(v)
	}
	for _, v := range append([]string{outcomePrefillReject}, fallbackReasons...) {
		if v != reasonNoPrefill {
			m.prefillRetries.WithLabelValues(v)
		}
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
