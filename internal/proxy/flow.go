package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/always"
	"go.opentelemetry.io/otel/trace"
)

// HeaderPD is the response header that says which path a request took:
// "remote" (prefill on a prefill engine, KV pulled by decode),
// "fallback; reason=<reason>[; status=<code>]" (decode did the whole
// request), or "prefill-rejected" (the prefill's 4xx, relayed).
const HeaderPD = "X-Tandem-Pd"

// bodyReadTimeout limits the receiving of a client's request body.
const bodyReadTimeout = time.Minute

// handleGenerate serves /v1/completions and /v1/chat/completions: the
// two-leg flow of docs/kv-transfer.md, "The HTTP protocol (vLLM's)".
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
		var span trace.Span
		r, span = traceRequest(r)
		outcome = p.generate(w, r, id)
		endRequest(span, w.Header(), id, outcome)
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
	turn, body, obj, aerr := p.newTurn(r.Header, body, obj)
	if aerr != nil {
		writeAPIError(w, aerr)
		return outcomeBadRequest
	}
	preq := p.routeRequest(r.URL.Path, id, body, obj)
	noteRequest(r, obj, preq)
	// Check decode first: prefilling for a request no decode can take would
	// only pin KV blocks on the prefill until their lease runs out.
	if !p.decode.anyHealthy() {
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
		return outcomeNoBackend
	}
	route, routeStart := startRoute(r), time.Now()
	d, release, outcome := p.pickDecode(w, r, id, preq, turn)
	if d == nil {
		p.endRoute(route, nil, router.Decision{}, outcome)
		return outcome
	}
	defer release()
	leg := decodeLeg{turn: turn, prefer: d, release: release, arrived: arrived, stream: streams(obj)}
	// The decode is picked first (its cache and load), then the decider
	// says whether its prompt is prefilled remotely.
	decision, ok := turn.decision()
	switch {
	case isBatchPrompt(r.URL.Path, obj):
		// kv_transfer_params name one prompt's KV: the engines refuse them
		// on a batch, so its decode prefills every prompt itself.
		turn.drop(id)
		decision = router.Decision{Reason: reasonBatchPrompt}
	case ok && p.colocated() && len(p.prefill.list()) == 0:
		// A history only a prefill leg could pull, and no prefill engine:
		// the history's decode prefills the turn itself.
		turn.drop(id)
		decision = router.Decision{Reason: reasonColocated}
	case !ok:
		decision = p.decide(preq, d)
	}
	p.endRoute(route, d, decision, "")
	p.observePlan(preq, d, arrived, decision)
	p.metrics.observeStage(stageRoute, routeStart)
	if !decision.Remote {
		p.metrics.pdDecisions.WithLabelValues("local", decision.Reason).Inc()
		leg.body, leg.pd, leg.success = fallbackBody(body, obj), "local; reason="+decision.Reason, outcomeLocal
		return p.runDecode(w, r, id, preq, leg)
	}
	preq.Near = d.host
	return p.remote(w, r, id, body, obj, preq, leg, decision)
}

// pickDecode picks the request's decode backend and counts the request on
// it: the one holding the history the turn continues while it is healthy,
// else the policy's pick, waiting in the admission queue while every decode
// is saturated. When none takes the request it answers the client itself
// and returns nil and the outcome.
func (p *Proxy) pickDecode(w http.ResponseWriter, r *http.Request, id string, preq *router.Request, turn *convTurn) (*backend, func(), string) {
	if pref := turn.lookUp(preq); pref != nil {
		return pref, pref.acquire(tokens(preq)), ""
	}
	d, release, err := p.admit(r.Context(), p.decode, preq)
	if err == nil && d != nil {
		return d, release, ""
	}
	turn.drop(id)
	switch {
	case errors.Is(err, errSaturated):
		p.writeSaturated(w, roleDecode)
		return nil, nil, outcomeSaturated
	case err != nil:
		return nil, nil, outcomeClientCanceled
	}
	writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
	return nil, nil, outcomeNoBackend
}

// remote runs the prefill leg, then the decode leg with the KV the prefill
// holds; a prefill's 4xx is relayed, and a failed prefill leg falls back to
// the decode alone.
func (p *Proxy) remote(w http.ResponseWriter, r *http.Request, id string, body []byte, obj *object, preq *router.Request, leg decodeLeg, decision router.Decision) string {
	prefillStart := time.Now()
	res := leg.turn.prefill(r, id, obj, preq)
	leg.prefill = time.Since(prefillStart)
	p.metrics.observeStage(stagePrefill, prefillStart)
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
		res.backend.holds.Add(1)
		defer res.backend.holds.Add(-1)
		if p.betweenLegs != nil {
			p.betweenLegs(r.Context())
		}
		leg.body, leg.pd, leg.success = decodeBody(obj, res.kv), "remote", outcomeRemote
		leg.local = fallbackBody(body, obj)
		p.metrics.pdDecisions.WithLabelValues("remote", decision.Reason).Inc()
		return p.runDecode(w, r, id, preq, leg)
	}
	return p.fallback(w, r, id, fallbackBody(body, obj), preq, leg, res)
}

// fallback runs the decode leg alone after a failed prefill leg, with the
// client's own bytes minus any kv_transfer_params (body): a plain request
// that any engine, P/D-aware or not, serves with a full local prefill. With
// Config.Fallback off the request fails instead.
func (p *Proxy) fallback(w http.ResponseWriter, r *http.Request, id string, body []byte, preq *router.Request, leg decodeLeg, res prefillResult) string {
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
	r, span := startFallback(r, res.reason)
	defer span.End()
	leg.body, leg.pd, leg.success = body, pd, outcomeFallback
	return p.runDecode(w, r, id, preq, leg)
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

// decide runs the disaggregation decider for a request whose decode is d.
func (p *Proxy) decide(preq *router.Request, d *backend) router.Decision {
	if p.colocated() && len(p.prefill.list()) == 0 {
		// The colocated split: no prefill engine to weigh.
		return router.Decision{Reason: reasonColocated}
	}
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
			in.Prefill = append(in.Prefill, e)
		}
	}
	return p.decider.Decide(in)
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
