package kvxfer

import (
	"context"
	"errors"
	"fmt"
)

// Errors a Pull or Notify can wrap; test with errors.Is. FailureReason maps
// them to the reason label of tandem:kv_transfer_failures_total.
var (
	// ErrIncompatible: the engines' models or KV geometry differ; the
	// message names the value, both sides and the flag to change.
	ErrIncompatible = errors.New("prefill and decode engines are incompatible")
	// ErrPeerRestarted: another engine (or the same engine id with a new
	// configuration) answers at the prefill's address; the request's KV is
	// lost with the old process.
	ErrPeerRestarted = errors.New("prefill engine was replaced")
	// ErrGenerationChanged: a block was reused while it was being read, so
	// the pulled bytes are invalid (vLLM issue #21570 made this silent).
	ErrGenerationChanged = errors.New("generation changed during read")
	// ErrProtocol: the peer broke the wire protocol.
	ErrProtocol = errors.New("kv side-channel protocol violation")
	// ErrExpired: the producer's hold ends too soon to pull (the deadline
	// it stated, within ExpiryMargin); the pull was not attempted.
	ErrExpired = errors.New("kv hold expires too soon to pull")
	// ErrClosed: the Consumer was closed.
	ErrClosed = errors.New("kv transfer consumer is closed")
)

// Is lets errors.Is match an ERROR frame against this package's sentinels.
func (e *RemoteError) Is(target error) bool {
	switch e.Code {
	case CodeNotHeld:
		return target == ErrNotHeld
	case CodeBadBlock:
		return target == ErrBadBlock
	case CodeGenerationChanged:
		return target == ErrGenerationChanged
	case CodeBadFrame, CodeVersion:
		return target == ErrProtocol
	case CodeUnauthenticated:
		return target == ErrUnauthenticated
	}
	return false
}

// FailureReason classifies a Pull or Notify error for metrics and logs:
// canceled (the request was aborted, or the engine is shutting down),
// unauthenticated, incompatible, peer_restarted, not_held, bad_block,
// generation_changed, protocol, busy, no_shm, remote, or io (including
// dial, handshake and read timeouts).
func FailureReason(err error) string {
	var re *RemoteError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		// Only a request's abort or shutdown cancels; the deadlines of
		// dials, handshakes and reads are this package's own timeouts,
		// which are I/O failures (io, below).
		return "canceled"
	case errors.Is(err, ErrUnauthenticated):
		return "unauthenticated"
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, ErrIncompatible):
		return "incompatible"
	case errors.Is(err, ErrPeerRestarted):
		return "peer_restarted"
	case errors.Is(err, ErrNotHeld):
		return "not_held"
	case errors.Is(err, ErrBadBlock):
		return "bad_block"
	case errors.Is(err, ErrGenerationChanged):
		return "generation_changed"
	case errors.Is(err, ErrProtocol), errors.Is(err, errBadFrame):
		return "protocol"
	case errors.As(err, &re) && re.Code == CodeBusy:
		return "busy"
	case errors.As(err, &re) && re.Code == CodeNoShm:
		return "no_shm"
	case errors.As(err, &re):
		return "remote"
	}
	return "io"
}

// checkCompat compares the consumer's Info with the producer's and says
// exactly what differs and what to change.
func checkCompat(local, remote Info) error {
	pe := remote.EngineID
	if local.ModelFingerprint != remote.ModelFingerprint {
		return fmt.Errorf("%w: different models or weights: prefill engine %s serves model fingerprint %q, this decode engine serves %q — start both with the same --model (same weights and config)", ErrIncompatible, pe, remote.ModelFingerprint, local.ModelFingerprint)
	}
	if local.KVDType != remote.KVDType {
		return fmt.Errorf("%w: KV dtype differs: prefill engine %s has %s, this decode engine has %s — start both with the same --kv-cache-dtype", ErrIncompatible, pe, remote.KVDType, local.KVDType)
	}
	ints := []struct {
		what string
		p, d int
		fix  string
	}{
		{"block size", remote.BlockSize, local.BlockSize, "start both with the same --block-size"},
		{"number of layers", remote.Layers, local.Layers, "both engines must serve the same model"},
		{"number of KV heads", remote.KVHeads, local.KVHeads, "both engines must serve the same model"},
		{"head dim", remote.HeadDim, local.HeadDim, "both engines must serve the same model"},
		{"block bytes", remote.BlockBytes, local.BlockBytes, "the KV block layout differs: run the same tandem release on both"},
	}
	for _, f := range ints {
		if f.p != f.d {
			return fmt.Errorf("%w: %s differs: prefill engine %s has %d, this decode engine has %d — %s", ErrIncompatible, f.what, pe, f.p, f.d, f.fix)
		}
	}
	return nil
}
