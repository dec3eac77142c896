package openai

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

// KVReleasePath is the route on which a prefill engine frees the KV it holds
// for a remote decode that will never come. The P/D proxy calls it when it
// holds a prefill's kv_transfer_params but the decode leg did not start
// (client gone, no decode reachable, decode refused the request), so the
// blocks return at once instead of at lease expiry.
const KVReleasePath = "/tandem/kv/release"

// KVReleaser frees the KV blocks named by kv_transfer_params that this
// engine returned from a prefill. The engine's KV connector implements it;
// it must refuse params this engine did not issue (they are signed), so that
// only whoever received the prefill's answer can release its blocks.
type KVReleaser interface {
	// ReleaseKV frees the blocks now. It returns an error wrapping an
	// *engine.InvalidRequestError for params that are malformed or not this
	// engine's, and any other error when nothing is held for them (never
	// held, already released or expired).
	ReleaseKV(kv kvparams.Params) error
}

// KVReleaseRequest is the body of POST /tandem/kv/release: the
// kv_transfer_params of the prefill's answer, verbatim.
type KVReleaseRequest struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// KVReleaseResponse is the answer of a successful release.
type KVReleaseResponse struct {
	Released bool `json:"released"`
}

// handleKVRelease answers 200 {"released": true} when the blocks were freed,
// 400 for params this engine refuses, and 404 when it holds nothing for them
// or has no KV connector. The 404 says no more than that: whether the params
// were never held, released or expired is in the engine's debug log.
func (s *Server) handleKVRelease(w http.ResponseWriter, r *http.Request) {
	var req KVReleaseRequest
	if err := s.decode(w, r, &req); err != nil {
		WriteError(w, err)
		return
	}
	kv, perr := parseKVTransfer(req.KVTransferParams)
	if perr != nil {
		WriteError(w, perr)
		return
	}
	if kv == nil {
		WriteError(w, BadRequest("kv_transfer_params", "send the kv_transfer_params of the prefill's answer"))
		return
	}
	if s.cfg.KVReleaser == nil {
		WriteError(w, NewError(http.StatusNotFound, "", "this engine holds no KV for remote decodes"))
		return
	}
	if err := s.cfg.KVReleaser.ReleaseKV(*kv); err != nil {
		if ire, ok := errors.AsType[*engine.InvalidRequestError](err); ok {
			param := ire.Param
			if param == "" {
				param = "kv_transfer_params"
			}
			WriteError(w, BadRequest(param, "%s", ire.Message))
			return
		}
		s.cfg.Logger.Debug("kv release: nothing held", "err", err)
		WriteError(w, NewError(http.StatusNotFound, "", "no KV is held for these kv_transfer_params (never held, already released or expired)"))
		return
	}
	s.countRelease(KVReleaseByRequest)
	s.writeJSON(w, http.StatusOK, KVReleaseResponse{Released: true})
}
