package openai

import (
	"net/http"
	"time"
)

// generation is a request of one of the two generation routes
// (/v1/chat/completions, /v1/completions): what their handlers differ in.
type generation interface {
	// sampling is the request's shared fields.
	sampling() *SamplingFields
	// job validates the request and tokenizes its prompts.
	job(s *Server, extID string) (*job, *Error)
	// idPrefix prefixes the response id ("chatcmpl-", "cmpl-").
	idPrefix() string
	// logprobsOut is how the answer reports logprobs.
	logprobsOut() logprobsOut
	// stream and complete write the answer, as server-sent events or one
	// JSON body.
	stream(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, includeUsage bool, lp logprobsOut)
	complete(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, lp logprobsOut)
}

// serveGeneration serves a generation route: the request id, the body
// decoded into req, the job, the engine run, then the answer. A request
// refused after its kv_transfer_params were read hands them back
// (rejectKV), so a hold they name is released, not left to its lease.
func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, req generation) {
	received := time.Now()
	extID, aerr := requestID(w, r)
	if aerr != nil {
		WriteError(w, aerr)
		return
	}
	if err := s.decode(w, r, req); err != nil {
		WriteError(w, err)
		return
	}
	j, err := req.job(s, extID)
	if err != nil {
		s.rejectKV(req.sampling().KVTransferParams)
		WriteError(w, err)
		return
	}
	// api ends where the engine's clock starts (Submit): measured after
	// start, it would overlap the engine's queue and prefill.
	api := time.Since(received)
	run, err := s.start(r.Context(), j)
	if err != nil {
		WriteError(w, err)
		return
	}
	defer run.close()
	run.api = api
	meta := responseMeta{id: req.idPrefix() + extID, created: s.cfg.Now().Unix(), model: s.cfg.ModelName}
	lp := req.logprobsOut()
	if f := req.sampling(); f.Stream {
		req.stream(s, w, r, run, meta, f.StreamOptions != nil && f.StreamOptions.IncludeUsage, lp)
		return
	}
	req.complete(s, w, r, run, meta, lp)
}
