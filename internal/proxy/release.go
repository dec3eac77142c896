package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Reasons for releasing held KV, the reason label of
// tandem:proxy_kv_releases_total: a prefill's, because the decode leg never
// started, or (conversation mode) a decode's conversation hold that no turn
// will use.
const (
	releaseClientCanceled    = "client_canceled"      // the client left during or after the prefill leg
	releaseNoDecode          = "no_healthy_decode"    // no decode backend passed its last health check
	releaseDecodeUnreachable = "decode_unreachable"   // connect or transport error on the decode leg
	releaseDecodeTimeout     = "decode_timeout"       // the decode sent no first byte within Config.FirstByteTimeout
	releaseDecodeRefused     = "decode_refused"       // the decode answered 4xx/5xx
	releaseDecodeRetried     = "decode_retried"       // the decode leg failed after it was sent; the retry computes the prompt itself
	releaseNoConversation    = "no_conversation"      // a decode held KV no turn can find: a request naming no conversation, not remembered by its history
	releaseConvEvicted       = "conversation_evicted" // the proxy forgot a conversation for room, or a newer turn replaced it
	releaseHistoryUnused     = "history_not_pulled"   // the prefill leg with the history failed and was retried without it
)

// Results of a release, the result label of tandem:proxy_kv_releases_total.
const (
	releaseOK       = "released"  // 200: the prefill freed the blocks
	releaseNotFound = "not_found" // 404: nothing held (already released, expired, or a backend without the route)
	releaseFailed   = "error"     // transport error or another status
)

var (
	releaseReasons     = []string{releaseClientCanceled, releaseNoDecode, releaseDecodeUnreachable, releaseDecodeTimeout, releaseDecodeRefused, releaseDecodeRetried}
	convReleaseReasons = []string{releaseNoConversation, releaseConvEvicted, releaseHistoryUnused, releaseProxyStopped}
	releaseResults     = []string{releaseOK, releaseNotFound, releaseFailed}
)

// heldKV is KV an engine holds for the proxy: the backend (a prefill, or in
// conversation mode a decode) and the kv_transfer_params naming the blocks,
// verbatim as it answered them.
type heldKV struct {
	engine *backend
	params json.RawMessage
}

// releaseKV asks the engine that holds held's blocks to free them now
// rather than at lease expiry, in the background (the client's answer does
// not wait for it; Serve waits for it before returning). nil held is a
// no-op. The params go back to the engine that issued them, with the backend
// key: a Tandem engine checks their signature, so the release cannot free
// anyone else's blocks.
func (p *Proxy) releaseKV(held *heldKV, id, reason string) {
	if held == nil {
		return
	}
	held.engine.holds.Add(1)
	p.bg.Go(func() {
		defer held.engine.holds.Add(-1)
		result, err := p.postRelease(held, id)
		p.metrics.kvReleases.WithLabelValues(reason, result).Inc()
		attrs := []any{"request_id", id, "backend", held.engine.base, "reason", reason, "result", result}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		p.log.Debug("released held KV", attrs...)
	})
}

// postRelease calls the engine's release route within ReleaseTimeout.
func (p *Proxy) postRelease(held *heldKV, id string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ReleaseTimeout)
	defer cancel()
	var body bytes.Buffer
	body.WriteString(`{"kv_transfer_params":`)
	body.Write(held.params)
	body.WriteByte('}')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, held.engine.base+kvReleasePath, &body)
	if err != nil {
		return releaseFailed, err
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	setAuth(req.Header, p.cfg.BackendAPIKey)
	resp, err := p.client.Do(req)
	if err != nil {
		return releaseFailed, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return releaseOK, nil
	case http.StatusNotFound:
		return releaseNotFound, nil
	default:
		return releaseFailed, fmt.Errorf("%s answered %s", held.engine.base, resp.Status)
	}
}

// kvReleasePath is the engines' release route, openai.KVReleasePath
// (checked by a test; the proxy does not import the engine's API package).
const kvReleasePath = "/tandem/kv/release"
