package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/httpguard"
	"github.com/tandem-serve/tandem/internal/tracing"
)

// Backend is what the server needs from an engine. *engine.Engine satisfies
// it; tests may substitute their own.
type Backend interface {
	// Submit queues a request. ctx bounds the request's life: when it is
	// cancelled the engine aborts the request and frees its blocks.
	Submit(ctx context.Context, r *engine.Request) (*engine.Handle, error)
	// Abort ends a request early; it is a no-op for unknown or finished ids.
	Abort(id string)
	// Ready reports whether the engine accepts requests.
	Ready() bool
	// MaxModelLen is the context window in tokens.
	MaxModelLen() int
}

// Tokenizer is what the server needs from a tokenizer.
type Tokenizer interface {
	// Encode returns the ids of text, with the special tokens (BOS) when
	// addSpecial is set.
	Encode(text string, addSpecial bool) []int32
	// Decode returns the text of ids, without the special tokens when
	// skipSpecial is set.
	Decode(ids []int32, skipSpecial bool) string
	// TokenText is the text of one token as shown in logprobs.
	TokenText(id int32) string
	// VocabSize is the number of token ids; a request's ids must be below it.
	VocabSize() int
}

// ChatTemplate renders chat messages into a prompt, ending with the
// assistant turn's header when addGenerationPrompt is set.
type ChatTemplate func(msgs []Message, addGenerationPrompt bool) (string, error)

// Config configures a Server.
type Config struct {
	// Backend runs the requests. Required.
	Backend Backend
	// Tokenizer tokenizes prompts and names tokens in logprobs. Required.
	Tokenizer Tokenizer
	// ChatTemplate renders /v1/chat/completions messages; nil means the
	// model has none and chat requests get a 400. ChatTemplateFor makes one
	// from the model's tokenizer or a --chat-template.
	ChatTemplate ChatTemplate
	// RequestChatTemplate compiles the chat_template a chat or tokenize
	// request may carry. nil refuses such requests with a 400, as vLLM does
	// without --trust-request-chat-template: a template is code the server
	// runs, so a deployment opts in.
	RequestChatTemplate func(src string) (ChatTemplate, error)
	// ModelName is the served model name; requests must name it. Required.
	ModelName string
	// ModelRoot is the model's path, shown as "root" in /v1/models.
	ModelRoot string
	// Defaults are the model's generation_config.json sampling defaults.
	Defaults Defaults
	// Metrics serves /metrics; nil leaves the route out (404).
	Metrics http.Handler
	// Version is reported by /version.
	Version string
	// MaxBodyBytes caps a request body (default 16 MiB); larger bodies get 413.
	MaxBodyBytes int64
	// WriteTimeout bounds each write to a client (default 30 s), so a client
	// that stops reading releases its request.
	WriteTimeout time.Duration
	// Logger receives request errors (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock for "created" timestamps (default time.Now).
	Now func() time.Time
	// APIKey, when set, is required as "Authorization: Bearer <key>" on
	// every path but OpenPaths (vLLM's --api-key). Never logged.
	APIKey string
	// KVReleaser frees the KV a prefill holds for a remote decode on
	// POST /tandem/kv/release; nil answers that route with 404.
	KVReleaser KVReleaser
	// KVReleased, when set, is called with the reason (KVReleaseByRequest,
	// KVReleaseClientGone) of each release that freed KV: the engine
	// counts them in tandem:kv_releases_total.
	KVReleased func(reason string)
}

// DefaultMaxBodyBytes is the default request body limit.
const DefaultMaxBodyBytes = 16 << 20

// Server is the HTTP API of one engine. It is an http.Handler.
type Server struct {
	cfg      Config
	key      *APIKey
	routes   map[string]route
	guarded  http.Handler // serve behind package httpguard's checks
	draining atomic.Bool
	inFlight atomic.Int64 // generation requests being handled
}

type route struct {
	method  string
	handler http.HandlerFunc
}

// NewServer checks cfg and returns a server.
func NewServer(cfg Config) (*Server, error) {
	switch {
	case cfg.Backend == nil:
		return nil, errors.New("openai: Config.Backend is required")
	case cfg.Tokenizer == nil:
		return nil, errors.New("openai: Config.Tokenizer is required")
	case cfg.ModelName == "":
		return nil, errors.New("openai: Config.ModelName is required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, key: NewAPIKey(cfg.APIKey)}
	s.cfg.APIKey = "" // the digest in s.key is all the server keeps
	s.routes = map[string]route{
		"/v1/completions":      {http.MethodPost, s.handleCompletions},
		"/v1/chat/completions": {http.MethodPost, s.handleChat},
		"/v1/models":           {http.MethodGet, s.handleModels},
		"/tokenize":            {http.MethodPost, s.handleTokenize},
		"/detokenize":          {http.MethodPost, s.handleDetokenize},
		"/health":              {http.MethodGet, s.handleHealth},
		"/livez":               {http.MethodGet, s.handleLivez},
		"/version":             {http.MethodGet, s.handleVersion},
		KVReleasePath:          {http.MethodPost, s.handleKVRelease},
	}
	if cfg.Metrics != nil {
		s.routes["/metrics"] = route{http.MethodGet, cfg.Metrics.ServeHTTP}
	}
	var jsonPaths []string // every POST route takes a JSON body
	for path, rt := range s.routes {
		if rt.method == http.MethodPost {
			jsonPaths = append(jsonPaths, path)
		}
	}
	s.guarded = httpguard.Wrap(http.HandlerFunc(s.serve), httpguard.Options{JSONPaths: jsonPaths, Authorize: s.key.Check})
	return s, nil
}

// Drain makes /health (readiness) answer 503 and new generation requests
// fail with 503, while requests in flight run on and /livez stays 200.
// Call it first on shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

// InFlight returns how many completion and chat requests are being
// handled (their answers not yet fully written).
func (s *Server) InFlight() int { return int(s.inFlight.Load()) }

// ServeHTTP checks the request's framing, the API key, and a POST's
// content type and UTF-8 (package httpguard: a body that is not
// application/json is a 415), then routes it. Unknown paths get a JSON 404
// and known paths with the wrong method a JSON 405, so every error a client
// sees has the OpenAI shape.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.guarded.ServeHTTP(w, r)
}

// serve routes a request that passed httpguard's checks.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rt, ok := s.routes[r.URL.Path]
	if !ok {
		WriteError(w, NewError(http.StatusNotFound, "", "no route for %s %s", r.Method, r.URL.Path))
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		allow := rt.method
		if rt.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		w.Header().Set("Allow", allow)
		WriteError(w, NewError(http.StatusMethodNotAllowed, "", "method %s is not allowed on %s; use %s", r.Method, r.URL.Path, rt.method))
		return
	}
	if generationPaths[r.URL.Path] {
		s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		if tracing.On() {
			var tr *runTrace
			r, tr = startTrace(r)
			sw := &statusRecorder{ResponseWriter: w}
			w = sw
			defer func() { tr.end(s, r.URL.Path, sw.status) }()
		}
	}
	rt.handler(w, r)
}

// generationPaths are the routes InFlight counts.
var generationPaths = map[string]bool{"/v1/completions": true, "/v1/chat/completions": true}

// handleHealth is readiness: 200 while the engine takes requests, 503 from
// the moment it drains (vLLM's tools and Tandem's proxy probe /health).
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() || !s.cfg.Backend.Ready() {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleLivez is liveness: 200 as long as the process serves HTTP,
// draining or not, so that an orchestrator does not kill an engine that is
// finishing its requests or serving held KV.
func (s *Server) handleLivez(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, VersionResponse{Version: s.cfg.Version})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, ModelList{Object: "list", Data: []ModelCard{{
		ID:          s.cfg.ModelName,
		Object:      "model",
		Created:     s.cfg.Now().Unix(),
		OwnedBy:     "tandem",
		Root:        s.cfg.ModelRoot,
		MaxModelLen: s.cfg.Backend.MaxModelLen(),
	}}})
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req TokenizeRequest
	if err := s.decode(w, r, &req); err != nil {
		WriteError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		WriteError(w, err)
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		WriteError(w, BadRequest("messages", "send either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		ids = s.cfg.Tokenizer.Encode(*req.Prompt, boolOr(req.AddSpecialTokens, true))
	case req.Messages != nil:
		text, err := s.renderChat(req.Messages, boolOr(req.AddGenerationPrompt, true), req.ChatTemplate)
		if err != nil {
			WriteError(w, err)
			return
		}
		ids = s.cfg.Tokenizer.Encode(text, boolOr(req.AddSpecialTokens, false))
	default:
		WriteError(w, BadRequest("prompt", "send prompt or messages"))
		return
	}
	resp := TokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.Backend.MaxModelLen(), Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i] = s.cfg.Tokenizer.TokenText(id)
		}
	}
	s.writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req DetokenizeRequest
	if err := s.decode(w, r, &req); err != nil {
		WriteError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		WriteError(w, err)
		return
	}
	if err := s.checkTokenIDs(req.Tokens, "tokens"); err != nil {
		WriteError(w, err)
		return
	}
	s.writeJSON(w, http.StatusOK, DetokenizeResponse{Prompt: s.cfg.Tokenizer.Decode(req.Tokens, false)})
}

// checkModel returns a 404 NotFoundError (vLLM's answer) unless name is the
// served model or empty: a request that names no model is served by the one
// model, as vLLM serves its first --served-model-name.
func (s *Server) checkModel(name string) *Error {
	if name == s.cfg.ModelName || name == "" {
		return nil
	}
	return NewError(http.StatusNotFound, "model", "The model `%s` does not exist. This server serves %q.", name, s.cfg.ModelName)
}

func (s *Server) checkTokenIDs(ids []int32, param string) *Error {
	vocab := s.cfg.Tokenizer.VocabSize()
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			return BadRequest(param, "token id %d is outside the vocabulary [0, %d)", id, vocab)
		}
	}
	return nil
}

// renderChat applies the chat template to API messages: the request's own
// (reqTemplate, when set and the server accepts one) or the server's.
func (s *Server) renderChat(raw []ChatMessage, addGenerationPrompt bool, reqTemplate *string) (string, *Error) {
	tmpl := s.cfg.ChatTemplate
	if reqTemplate != nil {
		if s.cfg.RequestChatTemplate == nil {
			return "", BadRequest("chat_template", "this server does not run chat templates sent in requests (start it with --trust-request-chat-template, or give the template with --chat-template); send the request without chat_template")
		}
		t, err := s.cfg.RequestChatTemplate(*reqTemplate)
		if err != nil {
			return "", BadRequest("chat_template", "chat_template: %v", err)
		}
		tmpl = t
	}
	if tmpl == nil {
		return "", BadRequest("messages", "model %s has no chat template; use /v1/completions, or start the server with --chat-template", s.cfg.ModelName)
	}
	msgs, err := ParseMessages(raw)
	if err != nil {
		return "", err
	}
	text, terr := tmpl(msgs, addGenerationPrompt)
	if terr != nil {
		return "", BadRequest("messages", "rendering the chat template: %v", terr)
	}
	return text, nil
}

// bodyReadTimeout bounds reading one request body.
const bodyReadTimeout = 60 * time.Second

// decode reads and decodes r's body under a read deadline, which it lifts
// afterwards: a deadline left on the connection would, once passed, make the
// server cancel the request's context in the middle of a long generation.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) *Error {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(bodyReadTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.cfg.Logger.Debug("set read deadline", "err", err)
	}
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	return DecodeBody(r, s.cfg.MaxBodyBytes, v)
}

// writeJSON writes v with status under the per-write deadline. It returns
// the write's error (a client gone, a deadline passed).
func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		s.cfg.Logger.Error("encode response", "err", err)
		WriteError(w, NewError(http.StatusInternalServerError, "", "encoding the response failed"))
		return fmt.Errorf("encoding the response: %w", err)
	}
	rc := http.NewResponseController(w)
	if err := rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.cfg.Logger.Debug("set write deadline", "err", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
}

// requestID returns the client's X-Request-Id or a fresh random id, and
// echoes it in the response header. An id CheckRequestID refuses is a 400.
func requestID(w http.ResponseWriter, r *http.Request) (string, *Error) {
	id := r.Header.Get("X-Request-Id")
	if err := CheckRequestID(id); err != nil {
		return "", err
	}
	if id == "" {
		id = randomHex(16)
	}
	w.Header().Set("X-Request-Id", id)
	return id, nil
}

// internalID is the engine's id for prompt i of the request extID: the
// client's id, the prompt index when there are several, and a random suffix
// (see the package doc).
func internalID(extID string, i, n int) string {
	if n > 1 {
		return fmt.Sprintf("%s-%d-%s", extID, i, randomHex(4))
	}
	return extID + "-" + randomHex(4)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

func itoa(i int) string { return strconv.Itoa(i) }
