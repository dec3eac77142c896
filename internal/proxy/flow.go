package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/always"
)

// HeaderPD is the response header that says which path a request took:
// "remote" (prefill on a prefill engine, KV pulled by decode),
// "fallback; reason=<reason>[; status=<code>]" (decode did the whole
// request), or "prefill-rejected" (the prefill's 4xx, relayed).
const HeaderPD = "X-Tandem-Pd"

// Reasons for a fallback, the reason label of tandem:proxy_fallbacks_total.
const (
	reasonNoPrefill    = "no_healthy_prefill"   // every prefill backend failed its health check
	reasonUnreachable  = "prefill_unreachable"  // connect or transport error
	reasonTimeout      = "prefill_timeout"      // no complete answer within Config.Timeout
	reasonServerError  = "prefill_5xx"          // the prefill answered 5xx
	reasonBadResponse  = "prefill_bad_response" // not a JSON object, too large, or an unexpected status
	reasonNoKVParams   = "prefill_no_kv_params" // answered without kv_transfer_params: it kept no KV for us
	reasonPrefillSat   = "prefill_saturated"    // every healthy prefill engine is saturated
	bodyReadTimeout    = time.Minute            // limit on receiving a client's request body
	relayBufferBytes   = 32 << 10
	maxPrefillRespSize = 64 << 20
)

var fallbackReasons = []string{reasonNoPrefill, reasonUnreachable, reasonTimeout, reasonServerError, reasonBadResponse, reasonNoKVParams, reasonPrefillSat}

// errBackendIdle cancels a decode leg whose backend went quiet for longer
// than Config.Timeout.
var errBackendIdle = errors.New("backend idle timeout")

// handleGenerate serves /v1/completions and /v1/chat/completions: the
// two-leg flow of vllm-pd.md §1.2–1.4.
func (p *Proxy) handleGenerate(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get("X-Request-Id")
	var outcome string
	if err := apierror.CheckRequestID(id); err != nil {
		// Refused before it reaches a log line, a header or a backend.
		writeAPIError(w, err)
		outcome = outcomeBadRequest
	} else {
		if id == "" {
			id = uuid.NewString()
		}
		w.Header().Set("X-Request-Id", id)
		outcome = p.generate(w, r, id)
	}
	p.metrics.requests.WithLabelValues(r.URL.Path, outcome).Inc()
	if outcome != outcomeStreamBroken && outcome != outcomeClientCanceled {
		// What is still buffered leaves now, under the write deadline (an
		// answer of known length is written in this one piece), and the
		// deadline is cleared for the connection's next request. Counted
		// first: a client holding its answer finds it in the metrics.
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Now().Add(p.cfg.Timeout))
		_ = rc.Flush()
		_ = rc.SetWriteDeadline(time.Time{})
	}
	if outcome == outcomeRemote || outcome == outcomeFallback || outcome == outcomeLocal {
		p.metrics.requestSeconds.Observe(time.Since(start).Seconds())
	}
	if outcome == outcomeStreamBroken {
		// The status line is out and the body is cut. Aborting the
		// connection (instead of ending the chunked body cleanly) is the one
		// way to tell the client the answer is incomplete; net/http
		// recovers this panic without logging it, as httputil.ReverseProxy
		// relies on.
		panic(http.ErrAbortHandler)
	}
}

// generate runs one request and returns its outcome label.
func (p *Proxy) generate(w http.ResponseWriter, r *http.Request, id string) string {
	arrived := time.Now() // for the Server-Timing entries
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "use POST "+r.URL.Path)
		return outcomeBadRequest
	}
	body, ok := p.readBody(w, r)
	if !ok {
		return outcomeBadRequest
	}
	obj, err := parseObject(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return outcomeBadRequest
	}
	var conv string
	if p.convs != nil {
		var aerr *apierror.Error
		if conv, aerr = conversationID(obj, r.Header); aerr != nil {
			writeAPIError(w, aerr)
			return outcomeBadRequest
		}
		obj, body = withoutConversationID(body, obj)
	}
	preq := p.routeRequest(r.URL.Path, id, body, obj)
	// Check decode first: prefilling for a request no decode can take would
	// only pin KV blocks on the prefill until their lease runs out.
	if !p.decode.anyHealthy() {
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
		return outcomeNoBackend
	}

	history := p.lookUpTurn(conv, preq)
	// The decode is picked first (its cache and load), then the decider
	// says whether its prompt is prefilled remotely.
	var d *backend
	var dRelease func()
	if pref := p.affinity(history); pref != nil {
		d, dRelease = pref, pref.acquire(tokens(preq))
	} else {
		var err error
		d, dRelease, err = p.admit(r.Context(), p.decode, preq)
		switch {
		case errors.Is(err, errSaturated):
			p.releaseHistory(history, id)
			p.writeSaturated(w, roleDecode)
			return outcomeSaturated
		case err != nil:
			p.releaseHistory(history, id)
			return outcomeClientCanceled
		case d == nil:
			p.releaseHistory(history, id)
			writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
			return outcomeNoBackend
		}
	}
	defer dRelease()
	decision := router.Decision{Remote: true, Reason: "conversation"}
	if history == nil {
		decision = p.decide(preq, d)
	}
	if !decision.Remote {
		p.metrics.pdDecisions.WithLabelValues("local", decision.Reason).Inc()
		leg := decodeLeg{conv: conv, prefer: d, body: fallbackBody(body, obj), pd: "local; reason=" + decision.Reason, success: outcomeLocal, arrived: arrived}
		return p.runDecode(w, r, id, preq, leg)
	}
	preq.Near = d.host
	prefillStart := time.Now()
	var res prefillResult
	if history == nil {
		res = p.prefillWithRetries(r, id, obj, preq, prefillKVParams)
	} else {
		p.metrics.historyPrefills.Inc()
		res = p.runPrefill(r, id, obj, preq, history.params, time.Now().Add(p.cfg.Timeout))
		if reason, retry := res.retryable(); retry {
			// Stale history (expired, the decode restarted, a client that
			// rewrote it) must cost a recompute, never the turn.
			p.metrics.prefillRetries.WithLabelValues(reason).Inc()
			p.log.Info("prefill leg with the conversation's history failed; retrying without it",
				"request_id", id, "reason", reason, "detail", res.detail, "history_decode", history.decode.base)
			res = p.prefillWithRetries(r, id, obj, preq, prefillKVParams)
			p.releaseKV(&heldKV{engine: history.decode, params: history.params}, id, releaseHistoryUnused)
		}
	}
	leg := decodeLeg{conv: conv, prefer: d, turn: p.historyTurnOf(conv, obj, preq), arrived: arrived, prefill: time.Since(prefillStart)}
	switch {
	case res.canceled:
		return outcomeClientCanceled
	case res.reject != nil:
		h := w.Header()
		copyResponseHeaders(h, res.reject.header)
		h.Set("X-Request-Id", id)
		h.Set(HeaderPD, "prefill-rejected")
		w.WriteHeader(res.reject.status)
		_, _ = w.Write(res.reject.body)
		return outcomePrefillReject
	case res.kv != nil:
		leg.held = &heldKV{engine: res.backend, params: res.kv}
		if p.betweenLegs != nil {
			p.betweenLegs(r.Context())
		}
		leg.body, leg.pd, leg.success = decodeBody(obj, res.kv), "remote", outcomeRemote
		p.metrics.pdDecisions.WithLabelValues("remote", decision.Reason).Inc()
		return p.runDecode(w, r, id, preq, leg)
	}

	p.metrics.pdDecisions.WithLabelValues("fallback", res.reason).Inc()
	pd := "fallback; reason=" + res.reason
	if res.status != 0 {
		pd += fmt.Sprintf("; status=%d", res.status)
	}
	if !p.cfg.Fallback {
		w.Header().Set(HeaderPD, strings.Replace(pd, "fallback", "failed", 1))
		status := http.StatusBadGateway
		switch res.reason {
		case reasonNoPrefill:
			status = http.StatusServiceUnavailable
		case reasonTimeout:
			status = http.StatusGatewayTimeout
		}
		writeError(w, status, fmt.Sprintf("prefill leg failed (%s: %s) and fallback to decode-only is off", res.reason, res.detail))
		return outcomePrefillFailed
	}
	p.metrics.fallbacks.WithLabelValues(res.reason).Inc()
	p.log.Warn("prefill leg failed; decode does the whole request", "request_id", id, "reason", res.reason, "detail", res.detail)
	// The client's own bytes, minus any kv_transfer_params: a plain request
	// that any engine, P/D-aware or not, serves with a full local prefill.
	leg.body, leg.pd, leg.success = fallbackBody(body, obj), pd, outcomeFallback
	return p.runDecode(w, r, id, preq, leg)
}

// lookUpConversation returns, and forgets, what the last turn of conv left
// (nil for none: no conversation mode, no id, or a miss).
func (p *Proxy) lookUpConversation(conv string) *conversation {
	if conv == "" {
		return nil
	}
	cv, ok := p.convs.take(conv, p.now())
	if !ok {
		p.metrics.convLookups.WithLabelValues(convMiss).Inc()
		return nil
	}
	p.metrics.convLookups.WithLabelValues(convHit).Inc()
	return &cv
}

// affinity is the decode backend a conversation's turn should go to: the
// one that answered its last turn, whose prefix cache holds the history,
// while it is healthy; nil lets the policy pick.
func (p *Proxy) affinity(history *conversation) *backend {
	if history == nil {
		return nil
	}
	if !history.decode.healthy.Load() {
		p.metrics.decodeAffinity.WithLabelValues(affinityUnhealthy).Inc()
		return nil
	}
	p.metrics.decodeAffinity.WithLabelValues(affinitySame).Inc()
	return history.decode
}

// forget counts a conversation the proxy drops before a turn used it, and
// releases the decode's hold unless it has ended anyway.
func (p *Proxy) forget(reason string, cv conversation) {
	p.metrics.convEvictions.WithLabelValues(reason).Inc()
	if reason != evictExpired {
		p.releaseKV(&heldKV{engine: cv.decode, params: cv.params}, "", releaseConvEvicted)
	}
}

// remember keeps the params a decode returned at the end of conv's turn.
func (p *Proxy) remember(conv string, params json.RawMessage, decode *backend) {
	now := p.now()
	exp := expiry(params, now, p.cfg.ConversationTTL)
	if !now.Before(exp) {
		// Already over (or the proxy's clock is far ahead of the decode's): no next turn
		// could use it.
		p.log.Debug("decode returned kv_transfer_params that have already expired; not kept", "backend", decode.base, "expired", exp)
		return
	}
	p.convs.put(conversation{id: conv, params: params, decode: decode, expires: exp}, now)
	p.metrics.convStored.Inc()
}

// readBody reads the client's body within MaxBodyBytes and bodyReadTimeout,
// answering 413 or 400 itself when it cannot.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
	// Clear the deadline at once: left in place it would fire during a long
	// stream and cancel the request's context.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		if _, tooBig := errors.AsType[*http.MaxBytesError](err); tooBig {
			writeError(w, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body exceeds %d bytes (the proxy's --max-body-bytes)", p.cfg.MaxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

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
// another engine may succeed. A timeout is not retried: it used the budget.
func retryOnOther(reason string) bool {
	switch reason {
	case reasonUnreachable, reasonServerError, reasonBadResponse, reasonNoKVParams:
		return true
	}
	return false
}

// decide runs the disaggregation decider for a request whose decode is d.
func (p *Proxy) decide(preq *router.Request, d *backend) router.Decision {
	if _, ok := p.decider.(always.Decider); ok {
		// It looks at nothing: skip the snapshot of the prefill pool.
		return p.decider.Decide(router.DecideInput{Req: preq})
	}
	in := router.DecideInput{Req: preq}
	now := time.Now()
	hits := 0
	if p.decode.prefix != nil && len(preq.BlockHashes) > 0 {
		hits = p.matchPrefix(preq)[d.base]
	}
	in.Decode = d.endpoint(now, p.decode.stale, hits)
	sat := p.saturation
	for _, b := range p.prefill.list() {
		if !b.healthy.Load() {
			continue
		}
		in.PrefillHealthy++
		e := b.endpoint(now, p.prefill.stale, 0)
		if !sat.Saturated(&e) {
			in.PrefillFree++
		}
	}
	return p.decider.Decide(in)
}

// releaseHistory releases a conversation's hold that this turn will not
// use.
func (p *Proxy) releaseHistory(history *conversation, id string) {
	if history != nil {
		p.releaseKV(&heldKV{engine: history.decode, params: history.params}, id, releaseHistoryUnused)
	}
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
	res := p.sendPrefill(r, id, obj, b, kv, deadline)
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
// must be complete by deadline.
func (p *Proxy) sendPrefill(r *http.Request, id string, obj *object, b *backend, kv json.RawMessage, deadline time.Time) prefillResult {
	budget := time.Until(deadline)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+r.URL.Path, bytes.NewReader(prefillBody(obj, kv)))
	if err != nil {
		return prefillResult{reason: reasonBadResponse, detail: err.Error()}
	}
	p.setLegHeaders(req.Header, r.Header, id)

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
			return prefillResult{reason: reasonTimeout, detail: fmt.Sprintf("%s gave no complete answer within the %v left of the prefill leg's %v", b.base, budget.Round(time.Millisecond), p.cfg.Timeout)}
		case resp == nil:
			markDown(b, err, p.log)
			return prefillResult{reason: reasonUnreachable, detail: err.Error()}
		default:
			return prefillResult{reason: reasonBadResponse, detail: "reading answer: " + err.Error()}
		}
	}
	p.metrics.prefillSeconds.Observe(time.Since(start).Seconds())

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

// roundTrip sends a leg to its engine as it is: a redirect is the engine's
// answer, relayed or refused like any other, never followed (a proxy
// forwards; http.Client would re-send the leg to wherever the 3xx points,
// and would copy the headers of every request for that).
func (p *Proxy) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.client.Transport.RoundTrip(req)
	if err != nil {
		// Worded as http.Client words it: the method and URL, then why.
		return nil, &url.Error{Op: req.Method[:1] + strings.ToLower(req.Method[1:]), URL: req.URL.String(), Err: err}
	}
	return resp, nil
}

// decodeLeg is what the decode leg sends and how its ending is labelled.
type decodeLeg struct {
	body    []byte
	pd      string  // the X-Tandem-Pd value
	success string  // the outcome when the answer is relayed whole
	held    *heldKV // the KV a prefill keeps for this leg; nil on fallback
	prefer  *backend
	conv    string       // conversation mode: the conversation to remember the decode's params for, if any
	turn    *historyTurn // conversation mode, no conv: the turn to remember by its history, if it can be

	// arrived is when the request reached the proxy, prefill the prefill
	// leg's time (retries included; 0 for none): for Server-Timing.
	arrived time.Time
	prefill time.Duration
}

// runDecode sends the decode leg (to leg.prefer if set, else to the policy's
// pick) and relays its answer as it arrives. It returns leg.success when the
// answer was relayed whole (whatever its status). leg.held is released on
// the prefill whenever the leg does not start: client gone, no decode
// reachable or answering, or a decode that refused the request. In
// conversation mode a 200 answer's kv_transfer_params are not relayed: they
// are kept for leg.conv's next turn, or released on the decode when the
// request names no conversation.
func (p *Proxy) runDecode(w http.ResponseWriter, r *http.Request, id string, preq *router.Request, leg decodeLeg) string {
	held, pd, success := leg.held, leg.pd, leg.success
	if r.Context().Err() != nil {
		// The client left while the prefill leg ran.
		p.releaseKV(held, id, releaseClientCanceled)
		return outcomeClientCanceled
	}
	b := leg.prefer
	if b == nil {
		var rel func()
		if b, rel, _ = p.decode.pick(preq, tokens(preq)); b != nil {
			defer rel()
		}
	}
	if b == nil {
		p.releaseKV(held, id, releaseNoDecode)
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
		return outcomeNoBackend
	}
	var (
		ctx      context.Context
		cancel   context.CancelCauseFunc
		watchdog *time.Timer
		resp     *http.Response
		start    time.Time
		tried    []*backend
	)
	for attempt := 0; ; attempt++ {
		ctx, cancel = context.WithCancelCause(r.Context())
		defer cancel(nil)
		// One watchdog bounds the wait for the headers and then each gap
		// between body chunks; it is disarmed while writing to the client,
		// which has its own write deadline.
		watchdog = time.AfterFunc(p.cfg.Timeout, func() { cancel(errBackendIdle) })
		defer watchdog.Stop()

		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+r.URL.Path, bytes.NewReader(leg.body))
		if err != nil {
			p.releaseKV(held, id, releaseDecodeUnreachable)
			writeError(w, http.StatusInternalServerError, err.Error())
			return outcomeDecodeFailed
		}
		p.setLegHeaders(req.Header, r.Header, id)

		start = time.Now()
		resp, err = p.roundTrip(req)
		watchdog.Stop()
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			// A draining engine (SIGTERM, a pod turned unready) refuses new
			// requests with 503 before reading the KV: another decode can
			// take this one, and this engine gets no more until its health
			// check passes again.
			unavailable := fmt.Errorf("decode answered %s", resp.Status)
			markDown(b, unavailable, p.log)
			if r.Context().Err() == nil && attempt < p.cfg.DecodeRetries {
				tried = append(tried, b)
				if nb, rel, _ := p.decode.pick(preq, tokens(preq), tried...); nb != nil {
					defer rel()
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
					resp.Body.Close()
					cancel(nil)
					p.metrics.legRetries.WithLabelValues(roleDecode, "decode_unavailable").Inc()
					p.log.Info("decode answered 503 before its first byte; retrying on another decode engine", "request_id", id, "backend", b.base, "next", nb.base)
					b = nb
					continue
				}
			}
		}
		if err == nil {
			break
		}
		idle := errors.Is(context.Cause(ctx), errBackendIdle)
		if r.Context().Err() == nil && !idle && attempt < p.cfg.DecodeRetries {
			// Nothing reached the client yet: another decode can serve the
			// request (a remote leg's KV can be pulled by any decode).
			markDown(b, err, p.log)
			tried = append(tried, b)
			if nb, rel, _ := p.decode.pick(preq, tokens(preq), tried...); nb != nil {
				defer rel()
				p.metrics.legRetries.WithLabelValues(roleDecode, "decode_unreachable").Inc()
				p.log.Info("decode leg failed before its first byte; retrying on another decode engine", "request_id", id, "backend", b.base, "next", nb.base, "err", err)
				b = nb
				continue
			}
		}
		// The decode may have queued the request, but cancelling it aborts
		// it there; releasing as well costs a 404 at worst.
		w.Header().Set(HeaderPD, pd)
		switch {
		case r.Context().Err() != nil:
			p.releaseKV(held, id, releaseClientCanceled)
			return outcomeClientCanceled
		case idle:
			p.releaseKV(held, id, releaseDecodeTimeout)
			writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("decode backend %s sent no answer within %v", b.base, p.cfg.Timeout))
		default:
			p.releaseKV(held, id, releaseDecodeUnreachable)
			markDown(b, err, p.log)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("decode backend %s unreachable: %v", b.base, err))
		}
		return outcomeDecodeFailed
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		if p.observePrefix {
			p.prefix.Observe(b.base, preq.BlockHashes)
		}
		legOK(b)
	case resp.StatusCode >= 500:
		legFailed(b, "decode answered "+resp.Status, p.log)
	}
	if resp.StatusCode >= 400 {
		// An error status is a final answer: the decode will not read the
		// KV (a Tandem decode also tells the prefill itself when it refuses a
		// request early; the second release then finds nothing).
		p.releaseKV(held, id, releaseDecodeRefused)
	}

	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	h.Set("X-Request-Id", id)
	h.Set(HeaderPD, pd)
	addTiming(h, &leg, start)

	var capture *kvCapture
	if p.convs != nil && resp.StatusCode == http.StatusOK {
		capture = p.newCapture(&leg, resp.Header.Get("Content-Type"))
		defer p.releaseUnkept(capture, b, id)
	}
	// A stream (SSE, or any answer of unknown length) is flushed chunk by
	// chunk as it arrives. An answer of known length is one piece the decode
	// sent when it was done: relayed with its length and without a flush per
	// read, it leaves in one write (handleGenerate's flush) instead of a
	// chunked body and its terminating chunk. A conversation's capture edits
	// the answer, so its length is not known in advance.
	whole := capture == nil && resp.ContentLength >= 0 && !isEventStream(resp.Header.Get("Content-Type"))
	if whole {
		h["Content-Length"] = []string{strconv.FormatInt(resp.ContentLength, 10)}
	}
	w.WriteHeader(resp.StatusCode)

	rc := http.NewResponseController(w)
	bufp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bufp)
	buf := *bufp
	first := true
	// tail keeps the last bytes relayed: a client may hang up as soon as it
	// has read an SSE stream's "data: [DONE]", before the decode's EOF
	// reaches the proxy; such a stream was delivered whole.
	var tail []byte
	delivered := func() bool { return bytes.HasSuffix(bytes.TrimRight(tail, "\r\n"), sseDone) }
	send := func(out []byte) error {
		if len(out) == 0 {
			return nil
		}
		_ = rc.SetWriteDeadline(time.Now().Add(p.cfg.Timeout))
		if _, err := w.Write(out); err != nil {
			return err
		}
		if !whole {
			if err := rc.Flush(); err != nil {
				return err
			}
		}
		tail = append(tail, out...)
		if len(tail) > 64 {
			tail = append(tail[:0], tail[len(tail)-64:]...)
		}
		return nil
	}
	// done ends a whole answer: what a capture still holds is relayed, and
	// the decode's params are remembered only when the client got it all
	// (and released at once when no turn can use them).
	done := func() string {
		if capture != nil {
			err := send(capture.finish())
			if capture.params != nil {
				p.keepTurn(&leg, capture, b, id, err == nil)
			}
			if err != nil {
				return outcomeClientCanceled
			}
		}
		// handleGenerate flushes what is buffered and clears the deadline.
		return success
	}
	for {
		watchdog.Reset(p.cfg.Timeout)
		n, rerr := resp.Body.Read(buf)
		watchdog.Stop()
		if n > 0 {
			if first {
				p.metrics.decodeTTFB.Observe(time.Since(start).Seconds())
				first = false
			}
			out := buf[:n]
			if capture != nil {
				out = capture.feed(out)
			}
			if err := send(out); err != nil {
				return outcomeClientCanceled
			}
		}
		if rerr == io.EOF {
			return done()
		}
		if rerr != nil {
			if r.Context().Err() != nil {
				if delivered() {
					return done()
				}
				return outcomeClientCanceled
			}
			cause := rerr
			if errors.Is(context.Cause(ctx), errBackendIdle) {
				cause = fmt.Errorf("no data for %v", p.cfg.Timeout)
			}
			p.log.Warn("decode answer cut off", "request_id", id, "backend", b.base, "err", cause)
			return outcomeStreamBroken
		}
	}
}

// hopHeader reports whether k (canonical) is a connection-level header a
// proxy must not forward (RFC 9110 §7.6.1), or one the proxy sets itself.
func hopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
		return true
	}
	return false
}

// copyHeaders copies src into dst except hop-by-hop headers, headers named
// in src's Connection header, and skip (canonical names).
func copyHeaders(dst, src http.Header, skip ...string) {
	conn := src["Connection"]
	n := 0
	for _, vs := range src {
		n += len(vs)
	}
	all := make([]string, 0, n) // one allocation for every copied value
	for k, vs := range src {
		if hopHeader(k) || slices.Contains(skip, k) || namedIn(conn, k) {
			continue
		}
		i := len(all)
		all = append(all, vs...)
		dst[k] = all[i:len(all):len(all)] // capped: an append to one copies
	}
}

// namedIn reports whether the Connection header values conn name k.
func namedIn(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), k) {
				return true
			}
		}
	}
	return false
}

// copyRequestHeaders forwards the client's end-to-end headers (tracing, ...)
// to a backend. Accept-Encoding is dropped because the proxy parses the
// prefill's answer and relays the decode's unencoded.
func copyRequestHeaders(dst, src http.Header) {
	copyHeaders(dst, src, "Accept-Encoding", "X-Request-Id")
}

// setBackendHeaders forwards the client's headers to a backend and sets
// Authorization to the backend key. The client's Authorization header holds
// the proxy's own key when it has one; it reaches the engines only when
// neither key is configured (the proxy is then transparent and the engines
// check whatever key the client sent).
func (p *Proxy) setBackendHeaders(dst, client http.Header) {
	copyRequestHeaders(dst, client)
	setAuth(dst, p.cfg.BackendAPIKey)
}

// setAuth sets "Authorization: Bearer key" on a backend call; an empty key
// leaves h alone.
func setAuth(h http.Header, key string) {
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

// copyResponseHeaders relays a backend's end-to-end headers to the client.
func copyResponseHeaders(dst, src http.Header) {
	copyHeaders(dst, src, "X-Request-Id", HeaderPD)
}

// setLegHeaders sets the headers of a prefill or decode leg.
func (p *Proxy) setLegHeaders(dst, client http.Header, id string) {
	p.setBackendHeaders(dst, client)
	dst.Set("Content-Type", "application/json")
	dst.Set("X-Request-Id", id)
}

// relayBuffers are the decode relay's read buffers, reused across requests.
var relayBuffers = sync.Pool{New: func() any { b := make([]byte, relayBufferBytes); return &b }}

// isEventStream reports whether a Content-Type is SSE's.
func isEventStream(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// sseDone is the last event of an OpenAI stream.
var sseDone = []byte("data: [DONE]")
