// Package bench is a serving benchmark for OpenAI-compatible completion
// endpoints, in the manner of vLLM's benchmarks/benchmark_serving.py. Run
// sends a Plan's workload (package workload: prompts as token ids, so their
// lengths are exact, and exact output lengths with ignore_eos) as streaming
// /v1/completions requests to one or more targets at each load (a closed
// loop, or Poisson or gamma arrivals at a rate), and reports throughput,
// the distributions of time to first token (TTFT), time per output token
// (TPOT), inter-token latency (ITL, per streamed chunk) and end-to-end
// latency, SLO attainment, goodput and each target's goodput rate and
// per-level throughput (Capacities); SearchRate bisects for the highest
// rate meeting a goodput target. Prepare fills a Plan in from its targets
// (the model name, the context limit, the prompt ids from a /tokenize or a
// local tokenizer) and builds its workload from a workload.Spec.
//
// The workload is a pure function of the seed, so two runs (or two servers)
// see the same requests in the same order. Every level (load and round) of
// a run relabels the prompts' token ids (workload.Relabel), so no level is
// served from a prefix cache an earlier level warmed, while the targets of
// one level get identical prompts; Plan.FirstLevel keeps separate runs of a
// workload apart the same way.
//
// Each answer's Server-Timing header (Tandem's engines and proxy send one)
// is kept per request and splits its TTFT into phases (Breakdown): the
// proxy's own time and prefill leg, and the engine's API, queue, KV pull
// and prefill. ModelPD fits a DistServe-style P:D placement model to a
// disaggregated target's requests: the prefill service time of the legs
// that ran alone, and the decode step time against the batch; a RatioCheck
// (NewRatioCheck) compares its predicted split of N engines with the
// goodput rates rate searches measured on several splits.
package bench
