package openai

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Reasons of a KV release, passed to Config.KVReleased.
const (
	// KVReleaseByRequest is a release asked for on POST /tandem/kv/release.
	KVReleaseByRequest = "request"
	// KVReleaseClientGone is a prefill leg's hold released because its
	// answer (and so its kv_transfer_params) could not be delivered: the
	// client or its connection was gone when the forward pass finished.
	KVReleaseClientGone = "client_gone"
)

// writeAnswer writes a complete (non-streaming) answer and, when it reached
// the client, marks the run's answer delivered. A client whose request
// context ended before the write, or whose connection fails the write or
// its flush, did not get it; the run then releases any KV the answer's
// kv_transfer_params name (settle).
func (s *Server) writeAnswer(w http.ResponseWriter, r *http.Request, run *run, v any) {
	if r.Context().Err() != nil {
		return
	}
	if err := s.writeJSON(w, http.StatusOK, v); err != nil {
		s.cfg.Logger.Debug("answer not delivered", "err", err)
		return
	}
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.cfg.Logger.Debug("answer not delivered", "err", err)
		return
	}
	run.markDelivered()
}

// releaseUndelivered frees the KV that the undelivered answer's
// kv_transfer_params name, through the same connector release that
// POST /tandem/kv/release uses (which checks that this engine signed
// them), and counts it.
func (s *Server) releaseUndelivered(raw json.RawMessage) {
	if s.cfg.KVReleaser == nil {
		return
	}
	kv, perr := parseKVTransfer(raw)
	if perr != nil || kv == nil {
		s.cfg.Logger.Warn("an undelivered prefill answer carries unreadable kv_transfer_params; its KV is held until its lease", "err", perr)
		return
	}
	if err := s.cfg.KVReleaser.ReleaseKV(*kv); err != nil {
		s.cfg.Logger.Debug("kv release of an undelivered answer: nothing held", "err", err)
		return
	}
	s.cfg.Logger.Info("released the KV of a prefill whose client left before its answer", "remote_request_id", kv.RemoteRequestID)
	s.countRelease(KVReleaseClientGone)
}

// countRelease reports a successful KV release to Config.KVReleased.
func (s *Server) countRelease(reason string) {
	if s.cfg.KVReleased != nil {
		s.cfg.KVReleased(reason)
	}
}
