package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/tracing"
)

// Reasons for a fallback, the reason label of tandem:proxy_fallbacks_total.
const (
	reasonNoPrefill   = "no_healthy_prefill"   // every prefill backend failed its health check
	reasonUnreachable = "prefill_unreachable"  // connect or transport error
	reasonTimeout     = "prefill_timeout"      // no complete answer within Config.Timeout
	reasonServerError = "prefill_5xx"          // the prefill answered 5xx
	reasonBadResponse = "prefill_bad_response" // not a JSON object, too large, or an unexpected status
	reasonNoKVParams  = "prefill_no_kv_params" // answered without kv_transfer_params: it kept no KV for us
	reasonPrefillSat  = "prefill_saturated"    // every healthy prefill engine is saturated
)

var fallbackReasons = []string{reasonNoPrefill, reasonUnreachable, reasonTimeout, reasonServerError, reasonBadResponse, reasonNoKVParams, reasonPrefillSat}

// maxPrefillRespSize bounds a prefill's answer, which the proxy reads whole.
const maxPrefillRespSize = 64 << 20

// rejected is a prefill's 4xx answer, kept to relay verbatim.
type rejected struct {
	status int
	header http.Header
	body   []byte
}

// prefillResult is how the prefill leg ended: with kv held by backend (P/D
// path), reject (relay the 4xx), canceled (client gone), or else a fallback
// reason.
type prefillResult struct {
	kv       json.RawMessage
	backend  *backend
	reject   *rejected
	canceled bool
	reason   string
	detail   string
	status   int // P's HTTP status, for prefill_5xx
	tried    *backend
}

// prefillWithRetries runs the prefill leg and, when it failed on the engine
// (unreachable, 5xx, a bad answer), retries it on other prefill engines, up
// to Config.PrefillRetries times. The attempts share one budget,
// Config.Timeout from the first: each gets what the earlier ones left, so
// retries never stretch the prefill leg beyond it.
func (p *Proxy) prefillWithRetries(r *http.Request, id string, obj *object, preq *router.Request, kv json.RawMessage) prefillResult {
	deadline := time.Now().Add(p.cfg.Timeout)
	var tried []*backend
	res := p.runPrefill(r, id, obj, preq, kv, deadline)
	for attempt := 0; attempt < p.cfg.PrefillRetries && retryOnOther(res.reason) && r.Context().Err() == nil && time.Until(deadline) > 0; attempt++ {
		tried = append(tried, res.tried)
		p.metrics.legRetries.WithLabelValues(rolePrefill, res.reason).Inc()
		p.log.Info("prefill leg failed; retrying on another prefill engine", "request_id", id, "reason", res.reason, "detail", res.detail, "backend", res.tried.base)
		next := p.runPrefill(r, id, obj, preq, kv, deadline, tried...)
		if next.reason == reasonNoPrefill || next.reason == reasonPrefillSat {
			break // no other engine to try: the last failure says why
		}
		res = next
	}
	return res
}

// retryOnOther reports whether a prefill failure is the engine's, so that
// another engine may succeed. A timeout is the attempt's first-byte deadline
// (Config.FirstByteTimeout): retried while the leg's budget lasts.
func retryOnOther(reason string) bool {
	switch reason {
	case reasonUnreachable, reasonServerError, reasonBadResponse, reasonNoKVParams, reasonTimeout:
		return true
	}
	return false
}

// retryable reports whether a prefill leg sent with a conversation's history
// failed in a way a leg without it might not, and the failure's label: any
// failure but the client leaving or no prefill being healthy. A 4xx counts:
// an engine refuses params it cannot use (expired, from a restarted decode)
// with 400, and a 4xx that was the client's fault comes back on the retry.
func (res prefillResult) retryable() (string, bool) {
	switch {
	case res.canceled, res.kv != nil, res.reason == reasonNoPrefill:
		return "", false
	case res.reject != nil:
		return outcomePrefillReject, true
	}
	return res.reason, true
}

// runPrefill sends the prefill leg, with kv as its kv_transfer_params, and
// interprets its answer; the leg must be answered by deadline.
func (p *Proxy) runPrefill(r *http.Request, id string, obj *object, preq *router.Request, kv json.RawMessage, deadline time.Time, exclude ...*backend) prefillResult {
	b, release, sat := p.prefill.pick(preq, int64(preq.PromptTokens+1), exclude...)
	if b == nil {
		if sat {
			return prefillResult{reason: reasonPrefillSat, detail: "every healthy prefill backend is saturated"}
		}
		return prefillResult{reason: reasonNoPrefill, detail: "no prefill backend passed its last health check"}
	}
	defer release()
	computed := uncachedTokens(preq, b.base)
	defer p.legs.engine(b.base).begin(computed)()
	r, span := startLeg(r, tracing.SpanProxyPrefillLeg, b, len(exclude))
	res := p.sendPrefill(r, id, obj, b, kv, deadline, computed)
	endPrefillLeg(span, res)
	res.tried = b
	switch {
	case res.kv != nil:
		legOK(b)
	case retryOnOther(res.reason):
		legFailed(b, res.reason+": "+res.detail, p.log)
	}
	return res
}

// sendPrefill sends the prefill leg to b and interprets its answer, which
// must be complete by deadline and within Config.FirstByteTimeout (the
// prefill answers whole, so its first byte is its answer). A 2xx answer's
// timing feeds b's leg costs (computed is the proxy's estimate of the
// prompt tokens b computes, for an answer without usage).
//
// The leg outlives its client by Config.CanceledPrefillGrace: a prefill
// engine cannot stop a forward pass it has begun, and one that finishes
// holds the prompt's KV for the decode leg that will now never come. An
// answer within the grace gives the proxy the params to release that hold
// at once (runDecode does, seeing the client gone); past it, the leg is
// cancelled and the engine aborts what it has not finished.
func (p *Proxy) sendPrefill(r *http.Request, id string, obj *object, b *backend, kv json.RawMessage, deadline time.Time, computed int) prefillResult {
	budget := time.Until(deadline)
	if fb := time.Now().Add(p.cfg.FirstByteTimeout); fb.Before(deadline) {
		deadline = fb
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), deadline)
	defer cancel()
	stop := context.AfterFunc(r.Context(), func() {
		if p.cfg.CanceledPrefillGrace < 0 {
			cancel()
			return
		}
		t := time.NewTimer(p.cfg.CanceledPrefillGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	})
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+r.URL.Path, bytes.NewReader(prefillBody(obj, kv)))
	if err != nil {
		return prefillResult{reason: reasonBadResponse, detail: err.Error()}
	}
	p.setLegHeaders(req.Header, r.Header, id)
	tracing.Inject(req.Context(), req.Header)

	start := time.Now()
	resp, err := p.roundTrip(req)
	var data []byte
	if err == nil {
		data, err = io.ReadAll(io.LimitReader(resp.Body, maxPrefillRespSize+1))
		resp.Body.Close()
	}
	if err != nil {
		switch {
		case r.Context().Err() != nil:
			return prefillResult{canceled: true}
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return prefillResult{reason: reasonTimeout, detail: fmt.Sprintf("%s gave no complete answer within %v (the first-byte deadline, %v, or what was left of the prefill leg's %v)",
				b.base, min(budget, p.cfg.FirstByteTimeout).Round(time.Millisecond), p.cfg.FirstByteTimeout, p.cfg.Timeout)}
		case resp == nil:
			markDown(b, err, p.log)
			return prefillResult{reason: reasonUnreachable, detail: err.Error()}
		default:
			return prefillResult{reason: reasonBadResponse, detail: "reading answer: " + err.Error()}
		}
	}
	p.metrics.prefillSeconds.Observe(time.Since(start).Seconds())
	p.observePrefillAnswer(b, resp, data, computed)
	res := p.prefillAnswer(b, resp, data)
	if res.kv == nil && r.Context().Err() != nil {
		// Nothing held to release, and no one to answer.
		return prefillResult{canceled: true}
	}
	return res
}

// prefillAnswer interprets the prefill's complete answer: its status, then
// the kv_transfer_params of a 2xx.
func (p *Proxy) prefillAnswer(b *backend, resp *http.Response, data []byte) prefillResult {
	switch s := resp.StatusCode; {
	case s >= 400 && s < 500:
		return prefillResult{reject: &rejected{status: s, header: resp.Header, body: data}}
	case s == http.StatusServiceUnavailable:
		// A draining engine refuses new work with 503 (and fails /health):
		// skip it until a health check passes; the leg is retried on
		// another prefill engine.
		detail := fmt.Sprintf("%s answered %s", b.base, resp.Status)
		markDown(b, errors.New(detail), p.log)
		return prefillResult{reason: reasonServerError, status: s, detail: detail}
	case s >= 500:
		return prefillResult{reason: reasonServerError, status: s, detail: fmt.Sprintf("%s answered %s", b.base, resp.Status)}
	case s < 200 || s > 299:
		return prefillResult{reason: reasonBadResponse, status: s, detail: fmt.Sprintf("%s answered %s", b.base, resp.Status)}
	}
	if len(data) > maxPrefillRespSize {
		return prefillResult{reason: reasonBadResponse, detail: fmt.Sprintf("answer larger than %d bytes", maxPrefillRespSize)}
	}
	held, err := kvParamsFrom(data)
	if err != nil {
		return prefillResult{reason: reasonBadResponse, detail: err.Error()}
	}
	if held == nil {
		return prefillResult{reason: reasonNoKVParams, detail: fmt.Sprintf("%s kept no KV for a remote decode (is it started with --role prefill?)", b.base)}
	}
	return prefillResult{kv: held, backend: b}
}
