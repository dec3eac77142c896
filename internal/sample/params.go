package sample

// Params are one request's sampling parameters, already validated by the API
// layer (see Validate). Zero values mean "off" except where noted.
type Params struct {
	// Temperature 0 means greedy.
	Temperature float32
	TopK        int     // 0 or -1: off
	TopP        float32 // 0 or 1: off
	MinP        float32 // 0: off
	// Seed makes sampling reproducible for this request whatever the batch.
	// Without it the engine draws one at random.
	Seed    uint64
	HasSeed bool

	RepetitionPenalty float32 // 0 or 1: off
	PresencePenalty   float32
	FrequencyPenalty  float32
	LogitBias         map[int32]float32

	MaxTokens    int
	MinTokens    int
	Stop         []string
	StopTokenIDs []int32
	IgnoreEOS    bool
	// IncludeStopStrInOutput keeps the matched stop string in the text.
	IncludeStopStrInOutput bool
	// KeepSpecialTokens puts generated special tokens into the text
	// (skip_special_tokens=false); by default they are left out.
	KeepSpecialTokens bool

	// Logprobs is the number of top alternatives to return per token; -1
	// means no logprobs at all, 0 means only the chosen token's logprob.
	Logprobs int
}
