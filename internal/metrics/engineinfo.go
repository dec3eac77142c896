package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// EngineInfoName is the info metric an engine publishes its configuration
// under, as vLLM publishes its cache's under vllm:cache_config_info: one
// series, value 1, the configuration in its labels. A router's planner
// reads the role (only --role both engines may change pools) and the
// chunk its local prefills are computed in.
const EngineInfoName = "tandem:engine_info"

// The labels of EngineInfoName.
const (
	InfoRole                = "role"
	InfoMaxNumSeqs          = "max_num_seqs"
	InfoMaxNumBatchedTokens = "max_num_batched_tokens"
)

// SetInfo publishes the engine's role (--role) and step bounds
// (--max-num-seqs, --max-num-batched-tokens, as in effect) as
// EngineInfoName. Call it once.
func (e *Engine) SetInfo(role string, maxNumSeqs, maxNumBatchedTokens int) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: EngineInfoName,
		Help: "The engine's configuration in its labels (role, max_num_seqs, max_num_batched_tokens); the value is 1.",
		ConstLabels: prometheus.Labels{InfoRole: role, InfoMaxNumSeqs: strconv.Itoa(maxNumSeqs),
			InfoMaxNumBatchedTokens: strconv.Itoa(maxNumBatchedTokens)}})
	g.Set(1)
	e.Registry.MustRegister(g)
}
