// Package apierror is the OpenAI/vLLM error shape ({"error": {"message",
// "type", "param", "code"}}), the API-key check and the X-Request-Id check,
// shared by the engine's HTTP API (package openai, which re-exports them) and
// the router (package proxy). It imports only the standard library, so the
// router does not link the inference engine.
package apierror
