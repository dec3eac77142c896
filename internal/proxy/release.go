package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/tandem-serve/tandem/internal/openai"
)

// Reasons for releasing a prefill's KV, the reason label of
// tandem:proxy_kv_releases_total: the decode leg never started.
const (
	releaseClientCanceled    = "client_canceled"    // the client left after the prefill leg
	releaseNoDecode          = "no_healthy_decode"  // no decode backend passed its last health check
	releaseDecodeUnreachable = "decode_unreachable" // connect or transport error on the decode leg
	releaseDecodeTimeout     = "decode_timeout"     // the decode sent no headers within Config.Timeout
	releaseDecodeRefused     = "decode_refused"     // the decode answered 4xx/5xx
)

// Results of a release, the result label of tandem:proxy_kv_releases_total.
const (
	releaseOK       = "released"  // 200: the prefill freed the blocks
	releaseNotFound = "not_found" // 404: nothing held (already released, expired, or a backend without the route)
	releaseFailed   = "error"     // transport error or another status
)

var (
	releaseReasons = []string{releaseClientCanceled, releaseNoDecode, releaseDecodeUnreachable, releaseDecodeTimeout, releaseDecodeRefused}
	releaseResults = []string{releaseOK, releaseNotFound, releaseFailed}
)

// heldKV is what a prefill answered: the backend that holds the blocks and
// the kv_transfer_params naming them, verbatim.
type heldKV struct {
	prefill *backend
	params  json.RawMessage
}

// releaseKV asks the prefill that holds held's blocks to free them now
// rather than at lease expiry, in the background (the client's answer does
// not wait for it; Serve waits for it before returning). nil held is a
// no-op. The params go back to the engine that issued them, with the backend
// key: a Tandem prefill checks their signature, so the release cannot free
// anyone else's blocks.
func (p *Proxy) releaseKV(held *heldKV, id, reason string) {
	if held == nil {
		return
	}
	p.bg.Go(func() {
		result, err := p.postRelease(held, id)
		p.metrics.kvReleases.WithLabelValues(reason, result).Inc()
		attrs := []any{"request_id", id, "backend", held.prefill.base, "reason", reason, "result", result}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		p.log.Debug("released prefill KV: the decode leg never started", attrs...)
	})
}

// postRelease calls the prefill's release route within ReleaseTimeout.
func (p *Proxy) postRelease(held *heldKV, id string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ReleaseTimeout)
	defer cancel()
	var body bytes.Buffer
	body.WriteString(`{"kv_transfer_params":`)
	body.Write(held.params)
	body.WriteByte('}')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, held.prefill.base+openai.KVReleasePath, &body)
	if err != nil {
		return releaseFailed, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
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
		return releaseFailed, fmt.Errorf("%s answered %s", held.prefill.base, resp.Status)
	}
}
