package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// errBackendIdle cancels a decode leg whose backend missed its deadline:
// Config.FirstByteTimeout before the first byte, Config.StallTimeout after.
var errBackendIdle = errors.New("backend idle timeout")

// Why a decode attempt is retried on another decode, the reason label of
// tandem:proxy_leg_retries_total{role="decode"}.
const (
	decodeUnavailable = "decode_unavailable" // a draining engine's 503, before its first byte
	decodeUnreachable = "decode_unreachable" // no answer: connect or transport error, or the body cut before its first byte
	decodeTimeout     = "decode_timeout"     // no first byte within firstByteDeadline
)

// reasonDecodeRetry is the X-Tandem-Pd and fallback reason of a request
// whose remote decode leg failed after it was sent and was retried on
// another decode without kv_transfer_params: the first decode may have
// pulled the KV (a pull frees it on the prefill), so the params may be
// spent, and the retry computes the prompt itself.
const reasonDecodeRetry = "decode_retry"

// decodeLeg is what the decode leg sends and how its ending is labelled.
type decodeLeg struct {
	body    []byte
	pd      string  // the X-Tandem-Pd value
	success string  // the outcome when the answer is relayed whole
	held    *heldKV // the KV a prefill keeps for this leg; nil on fallback
	// local is what a retry sends once held's params may be spent: the
	// client's body without kv_transfer_params; nil when body is that
	// already.
	local []byte
	// prefer is the decode picked for the request, release its accounting
	// there (idempotent); the leg picks one itself when prefer is nil.
	prefer  *backend
	release func()
	turn    *convTurn // conversation mode's part in the request (convhistory.go)
	// stream says the client asked for a stream: the decode's first byte
	// is then its first token, else its whole answer (firstByteDeadline).
	stream bool

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
// conversation mode a 200 answer's kv_transfer_params are not relayed:
// leg.turn keeps them for the next turn, or releases them on the decode.
func (p *Proxy) runDecode(w http.ResponseWriter, r *http.Request, id string, preq *router.Request, leg decodeLeg) string {
	if r.Context().Err() != nil {
		// The client left while the prefill leg ran.
		p.releaseKV(leg.held, id, releaseClientCanceled)
		return outcomeClientCanceled
	}
	sent := time.Now()
	a, outcome := p.sendDecode(w, r, id, preq, &leg)
	if a == nil {
		return outcome
	}
	defer a.end()
	if a.n > 0 {
		p.metrics.stage[stageFirstByte].Observe(a.firstAt.Sub(sent).Seconds())
	}
	p.noteDecodeAnswer(a, preq, leg.held, id)
	outcome = p.relay(w, r, id, &leg, a)
	if a.n > 0 {
		p.metrics.observeStage(stageRelay, a.firstAt)
	}
	return outcome
}

// sendDecode sends the decode leg and returns the attempt whose answer is
// to be relayed. An attempt that fails before its first byte (no answer, no
// first byte in time, or a draining engine's 503) is retried on another
// decode, up to Config.DecodeRetries times: nothing reached the client yet.
// A remote leg's retry keeps its kv_transfer_params only when the failed
// decode cannot have read them (paramsIntact); otherwise it goes without them
// (leg.local, a local prefill on the retry's decode, said in X-Tandem-Pd)
// and the prefill's hold is released. When there is no answer to relay it
// writes the error itself and returns nil and the request's outcome.
func (p *Proxy) sendDecode(w http.ResponseWriter, r *http.Request, id string, preq *router.Request, leg *decodeLeg) (*decodeAttempt, string) {
	b, release := leg.prefer, leg.release
	if b == nil {
		b, release, _ = p.decode.pick(preq, tokens(preq))
	}
	if b == nil {
		p.releaseKV(leg.held, id, releaseNoDecode)
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see the proxy's /health")
		return nil, outcomeNoBackend
	}
	var tried []*backend
	firstByte := p.firstByteDeadline(leg, preq)
	for attempt := 0; ; attempt++ {
		var local int64 // a local prefill's tokens, counted on b until its first byte
		uncached := uncachedTokens(preq, b.base)
		endLocal := func() {}
		if leg.held == nil {
			local = int64(uncached)
			endLocal = p.legs.engine(b.base).begin(uncached)
		}
		b.inLocal.Add(local)
		a, err := p.tryDecode(r, id, b, release, leg.body, firstByte, attempt)
		b.inLocal.Add(-local)
		endLocal()
		if err != nil {
			a.end()
			p.releaseKV(leg.held, id, releaseDecodeUnreachable)
			p.writeInternalError(w, id, "building the decode leg", err)
			return nil, outcomeDecodeFailed
		}
		label := a.failure()
		if label == "" {
			p.observeDecodeAnswer(a, leg.held != nil, uncached)
			return a, ""
		}
		noteDecodeFailure(a, label)
		tried = append(tried, b)
		// With Config.Fallback off a remote leg is never turned local.
		spent := leg.held != nil && !a.paramsIntact(label)
		next, nextRelease := p.nextDecode(r, id, preq, a, label, attempt, tried, !spent || p.cfg.Fallback)
		switch {
		case next == nil && label == decodeUnavailable:
			return a, "" // the 503 is relayed
		case next == nil:
			return nil, p.decodeFailed(w, r, id, leg, a)
		}
		// The failed attempt stops counting on its backend now, not when
		// the answer of the next one ends.
		a.discard()
		if spent {
			p.recomputeOnRetry(leg, id)
		}
		b, release = next, nextRelease
	}
}

// nonStreamTokenTime is what a decode leg that does not stream is allowed
// per output token before its first byte: such an answer comes whole when
// the generation ends, so its first byte is its last token.
const nonStreamTokenTime = time.Second

// firstByteDeadline is how long a decode attempt may take to its first
// byte: Config.FirstByteTimeout for a stream (its first token); for an
// answer that comes whole, that plus nonStreamTokenTime per max_tokens
// (each token at one per second or faster), capped by Config.Timeout.
func (p *Proxy) firstByteDeadline(leg *decodeLeg, preq *router.Request) time.Duration {
	if leg.stream {
		return p.cfg.FirstByteTimeout
	}
	return min(p.cfg.Timeout, p.cfg.FirstByteTimeout+time.Duration(max(preq.MaxTokens, 1))*nonStreamTokenTime)
}

// streams reports whether obj asks for a streamed answer (stream: true, the
// field as the engines' encoding/json reads it).
func streams(obj *object) bool {
	return string(bytes.TrimSpace(obj.getFolded("stream"))) == "true"
}

// paramsIntact reports whether a failed attempt's decode cannot have read
// the leg's kv_transfer_params, so that a retry may send them again: it
// answered 503 (a draining engine refuses before reading any KV), or the
// leg never reached it (the connection was not made). Any other failure
// came after the leg was sent: the decode may have pulled the KV, which
// frees it on the prefill, and params sent twice would fail on the second
// decode (not_held) for a reason that is not that decode's.
func (a *decodeAttempt) paramsIntact(label string) bool {
	if label == decodeUnavailable {
		return true
	}
	var op *net.OpError
	return a.err != nil && errors.As(a.err, &op) && op.Op == "dial"
}

// recomputeOnRetry turns a remote leg whose params may be spent into one
// the retry's decode prefills itself, and releases the prefill's hold (a
// 404 when the failed decode did pull it).
func (p *Proxy) recomputeOnRetry(leg *decodeLeg, id string) {
	p.releaseKV(leg.held, id, releaseDecodeRetried)
	p.metrics.fallbacks.WithLabelValues(reasonDecodeRetry).Inc()
	p.log.Warn("decode leg failed after it was sent; the retry computes the prompt itself", "request_id", id, "prefill", leg.held.engine.base)
	leg.held = nil
	leg.body, leg.local = leg.local, nil
	leg.pd, leg.success = "fallback; reason="+reasonDecodeRetry, outcomeFallback
}

// nextDecode handles a failed attempt: it marks a's backend down (a draining
// engine refuses new requests with 503 before reading the KV, and gets no
// more until its health check passes again; a hung one fails its checks
// too) and picks another decode for the retry. It returns nil when the
// request is not retried: the client left, the retries are spent, retry
// is false, or no other decode is healthy.
func (p *Proxy) nextDecode(r *http.Request, id string, preq *router.Request, a *decodeAttempt, label string, attempt int, tried []*backend, retry bool) (*backend, func()) {
	if r.Context().Err() != nil {
		return nil, nil
	}
	switch label {
	case decodeUnavailable:
		markDown(a.b, fmt.Errorf("decode answered %s", a.resp.Status), p.log)
	case decodeTimeout:
		markDown(a.b, fmt.Errorf("no first byte within %v", a.firstByte), p.log)
	}
	if attempt >= p.cfg.DecodeRetries || !retry {
		return nil, nil
	}
	if label == decodeUnreachable {
		markDown(a.b, a.failErr(), p.log)
	}
	next, release, _ := p.decode.pick(preq, tokens(preq), tried...)
	if next == nil {
		return nil, nil
	}
	p.metrics.legRetries.WithLabelValues(roleDecode, label).Inc()
	if label == decodeUnavailable {
		p.log.Info("decode answered 503 before its first byte; retrying on another decode engine", "request_id", id, "backend", a.b.base, "next", next.base)
	} else {
		p.log.Info("decode leg failed before its first byte; retrying on another decode engine", "request_id", id, "backend", a.b.base, "next", next.base, "reason", label, "err", a.failErr())
	}
	return next, release
}

// decodeFailed answers a request whose decode leg got no answer, and
// releases the KV the prefill holds for it: the decode may have queued the
// request, but cancelling it aborts it there; releasing as well costs a 404
// at worst.
func (p *Proxy) decodeFailed(w http.ResponseWriter, r *http.Request, id string, leg *decodeLeg, a *decodeAttempt) string {
	idle := a.idle()
	a.end()
	w.Header().Set(HeaderPD, leg.pd)
	switch {
	case r.Context().Err() != nil:
		p.releaseKV(leg.held, id, releaseClientCanceled)
		return outcomeClientCanceled
	case idle:
		p.releaseKV(leg.held, id, releaseDecodeTimeout)
		writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("decode backend %s sent no first byte within %v (the proxy's --first-byte-timeout, plus 1s per max_tokens for an answer that does not stream)", a.b.base, a.firstByte))
	default:
		p.releaseKV(leg.held, id, releaseDecodeUnreachable)
		markDown(a.b, a.failErr(), p.log)
		writeError(w, http.StatusBadGateway, fmt.Sprintf("decode backend %s failed before its first byte: %v", a.b.base, a.failErr()))
	}
	return outcomeDecodeFailed
}

// noteDecodeAnswer accounts for the status of the decode's answer: a 200
// feeds the prefix record and resets the circuit breaker, a 5xx counts
// against it, unless the leg carried kv_transfer_params (held): such a 5xx
// may be the transfer's failure (params spent, expired or refused, a
// prefill gone or unreachable), a fault of the request or of the prefill,
// not of the decode, which is not ejected for it; its transport failures,
// missed deadlines, failed health checks and 5xx to legs without params
// still count. An error status is a final answer: the decode will not read
// the KV (a Tandem decode also tells the prefill itself when it refuses a
// request early; the second release then finds nothing).
func (p *Proxy) noteDecodeAnswer(a *decodeAttempt, preq *router.Request, held *heldKV, id string) {
	switch s := a.resp.StatusCode; {
	case s == http.StatusOK:
		if p.observePrefix {
			p.prefix.Observe(a.b.base, preq.BlockHashes)
		}
		legOK(a.b)
	case s >= 500 && held != nil:
		p.log.Info("decode answered a leg with kv_transfer_params with an error; not counted against its health", "request_id", id, "backend", a.b.base, "status", a.resp.Status)
	case s >= 500:
		legFailed(a.b, "decode answered "+a.resp.Status, p.log)
	}
	if a.resp.StatusCode >= 400 {
		p.releaseKV(held, id, releaseDecodeRefused)
	}
}

// decodeAttempt is one try of the decode leg on one backend. Its context,
// cancel and watchdog are its own, so that nothing an attempt leaves behind
// can cancel the next one; and it holds the backend's in-flight accounting
// (which the load-aware pickers read) only until it ends.
type decodeAttempt struct {
	b        *backend
	release  func() // the accounting of the request on b
	ctx      context.Context
	cancel   context.CancelCauseFunc
	watchdog *time.Timer
	// firstByte is the first-byte deadline, from start.
	firstByte time.Duration
	start     time.Time      // when the leg was sent
	resp      *http.Response // the answer's headers; nil when err is set
	err       error          // why there is no answer
	// The answer's first read, made under the first-byte deadline: buf
	// (from relayBuffers) holds n bytes, rerr is the read's error (io.EOF
	// for an answer that ended); firstAt is when it returned.
	buf     *[]byte
	n       int
	rerr    error
	firstAt time.Time
	span    trace.Span // the attempt's span, ended by end
}

// tryDecode sends body to b and waits for the answer's headers and its
// first body byte (or end) within firstByte. The error is one of building
// the request, when nothing was sent; a failed send is the attempt's err, a
// failed first read its rerr.
func (p *Proxy) tryDecode(r *http.Request, id string, b *backend, release func(), body []byte, firstByte time.Duration, attempt int) (*decodeAttempt, error) {
	r, span := startLeg(r, tracing.SpanProxyDecodeLeg, b, attempt)
	ctx, cancel := context.WithCancelCause(r.Context())
	a := &decodeAttempt{b: b, release: release, ctx: ctx, cancel: cancel, firstByte: firstByte, span: span}
	// One watchdog bounds the wait for the first byte and then each gap
	// between body chunks; it is disarmed while writing to the client,
	// which has its own write deadline.
	afterFunc := p.afterFunc
	if afterFunc == nil {
		afterFunc = time.AfterFunc
	}
	a.watchdog = afterFunc(firstByte, func() { cancel(errBackendIdle) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return a, err
	}
	p.setLegHeaders(req.Header, r.Header, id)
	tracing.Inject(ctx, req.Header)
	a.start = time.Now()
	a.resp, a.err = p.roundTrip(req)
	if a.err == nil {
		a.buf = relayBuffers.Get().(*[]byte)
		for a.n == 0 && a.rerr == nil {
			a.n, a.rerr = a.resp.Body.Read(*a.buf)
		}
		a.firstAt = time.Now()
	}
	a.watchdog.Stop()
	noteDecodeFirstByte(a)
	return a, nil
}

// failure is why the attempt is no answer to relay: decodeUnavailable for
// a 503, decodeTimeout for no first byte in time, decodeUnreachable for
// no answer or a body cut before its first byte, "" for an answer.
func (a *decodeAttempt) failure() string {
	switch {
	case a.err != nil || a.n == 0 && a.rerr != io.EOF:
		if a.idle() {
			return decodeTimeout
		}
		return decodeUnreachable
	case a.resp.StatusCode == http.StatusServiceUnavailable:
		return decodeUnavailable
	}
	return ""
}

// failErr is why a failed attempt has no answer.
func (a *decodeAttempt) failErr() error {
	if a.err != nil {
		return a.err
	}
	return fmt.Errorf("reading the answer's first byte: %w", a.rerr)
}

// idle reports whether the watchdog cut the attempt short.
func (a *decodeAttempt) idle() bool {
	return errors.Is(context.Cause(a.ctx), errBackendIdle)
}

// discard ends an attempt whose answer is not relayed, reading a little of
// the answer first so that its connection can be reused.
func (a *decodeAttempt) discard() {
	if a.resp != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(a.resp.Body, 64<<10))
	}
	a.end()
}

// end closes the attempt: its answer, its watchdog and context, and its
// accounting on the backend. Calling it again does nothing more.
func (a *decodeAttempt) end() {
	a.watchdog.Stop()
	if a.resp != nil {
		a.resp.Body.Close()
	}
	if a.buf != nil {
		relayBuffers.Put(a.buf)
		a.buf = nil
	}
	a.cancel(nil)
	if a.release != nil {
		a.release()
	}
	a.span.End()
}
