package openai

import "encoding/json"

// SamplingFields are the request fields /v1/completions and
// /v1/chat/completions share: OpenAI's sampling parameters and vLLM's
// extensions. Pointer fields are nil when the request leaves them out (or
// sends null), so the model's generation_config.json can fill them in.
type SamplingFields struct {
	Model       string   `json:"model"`
	MaxTokens   *int     `json:"max_tokens"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	// N is the number of choices per prompt (default 1, at most MaxN).
	N *int `json:"n"`
	// BestOf is accepted only when it equals n: Tandem, like vLLM v1,
	// does not rank extra samples.
	BestOf           *int               `json:"best_of"`
	Stream           bool               `json:"stream"`
	StreamOptions    *StreamOptions     `json:"stream_options"`
	Stop             json.RawMessage    `json:"stop"`
	Seed             *int64             `json:"seed"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	User             string             `json:"user"`

	TopK                   *int            `json:"top_k"`
	MinP                   *float64        `json:"min_p"`
	RepetitionPenalty      *float64        `json:"repetition_penalty"`
	MinTokens              *int            `json:"min_tokens"`
	IgnoreEOS              bool            `json:"ignore_eos"`
	StopTokenIDs           []int32         `json:"stop_token_ids"`
	SkipSpecialTokens      *bool           `json:"skip_special_tokens"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`
	KVTransferParams       json.RawMessage `json:"kv_transfer_params"`
	// ReturnTokensAsTokenIDs (vLLM extension) names the tokens of logprobs
	// and top logprobs "token_id:N" instead of by their text.
	ReturnTokensAsTokenIDs *bool `json:"return_tokens_as_token_ids"`
}

// StreamOptions are a streaming request's options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// CompletionRequest is the body of POST /v1/completions. Prompt is a string,
// a list of token ids, a list of strings or a list of token-id lists.
type CompletionRequest struct {
	SamplingFields
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	// Echo prepends the prompt's text to each choice's text.
	Echo bool `json:"echo"`
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	SamplingFields
	Messages            []ChatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	Logprobs            bool          `json:"logprobs"`
	TopLogprobs         *int          `json:"top_logprobs"`
	// AddGenerationPrompt (vLLM extension, default true) ends the rendered
	// prompt with the assistant turn's header.
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// ChatTemplate (vLLM extension) renders this request's messages in
	// place of the server's template, when the server accepts one.
	ChatTemplate *string `json:"chat_template"`
}

// ChatMessage is one message of a chat request. Content is a string, null,
// or an array of {"type": "text", "text": ...} parts.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// Usage counts a response's tokens.
type Usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails breaks down a response's prompt tokens.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CompletionResponse is a non-streaming /v1/completions response.
type CompletionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage"`
	// KVTransferParams is set on a prefill engine's response to a request
	// with kv_transfer_params.do_remote_decode: the JSON object the KV
	// connector wrote (kvparams.Params), verbatim.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// CompletionChoice is one choice of a completion (or one chunk's delta).
type CompletionChoice struct {
	Index    int                 `json:"index"`
	Text     string              `json:"text"`
	Logprobs *CompletionLogprobs `json:"logprobs"`
	// FinishReason is "stop", "length" or null while streaming.
	FinishReason *string `json:"finish_reason"`
	// StopReason (vLLM) is the stop string or stop token id that ended the
	// choice, null otherwise.
	StopReason any `json:"stop_reason"`
}

// CompletionLogprobs is the legacy completions logprobs object.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ChatCompletionResponse is a non-streaming /v1/chat/completions response.
type ChatCompletionResponse struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Created          int64           `json:"created"`
	Model            string          `json:"model"`
	Choices          []ChatChoice    `json:"choices"`
	Usage            *Usage          `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int           `json:"index"`
	Message      ChatReply     `json:"message"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   any           `json:"stop_reason"`
}

// ChatReply is the assistant message of a chat choice.
type ChatReply struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// CompletionChunk is one event of a streaming completion. Usage is present
// (null, or the totals in the last chunk) only when
// stream_options.include_usage is set, as OpenAI does.
type CompletionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   json.RawMessage    `json:"usage,omitempty"`
	// KVTransferParams rides on the final chunk of choice 0 when the
	// engine returns some (a decode's conversation hold, vLLM's
	// bidirectional mode), as the non-streaming body carries them.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// ChatCompletionChunk is one event of a streaming chat completion. Usage is
// as in CompletionChunk.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   json.RawMessage   `json:"usage,omitempty"`
	// KVTransferParams: as in CompletionChunk.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// ChatChunkChoice is one choice's delta in a chat chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   any           `json:"stop_reason,omitempty"`
}

// ChatDelta is the change a chat chunk makes to its choice's message.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatLogprobs is a chat choice's logprobs object.
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatTokenLogprob is one sampled token's logprob and its top alternatives.
type ChatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []ChatTopLogprob `json:"top_logprobs"`
}

// ChatTopLogprob is one alternative token at a position.
type ChatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// ModelList is the response of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelCard `json:"data"`
}

// ModelCard describes one served model, in vLLM's shape.
type ModelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// TokenizeRequest is the body of POST /tokenize: either Prompt or Messages.
type TokenizeRequest struct {
	Model               string        `json:"model"`
	Prompt              *string       `json:"prompt"`
	Messages            []ChatMessage `json:"messages"`
	AddSpecialTokens    *bool         `json:"add_special_tokens"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
	ChatTemplate        *string       `json:"chat_template"`
	ReturnTokenStrs     bool          `json:"return_token_strs"`
}

// TokenizeResponse is the response of POST /tokenize.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// DetokenizeRequest is the body of POST /detokenize.
type DetokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

// DetokenizeResponse is the response of POST /detokenize.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// VersionResponse is the response of GET /version.
type VersionResponse struct {
	Version string `json:"version"`
}
