package openai

// boundedEncoder is a Tokenizer that can refuse a text longer than a limit
// without encoding all of it (tokenizer.Tokenizer.EncodeBounded): ok is
// false when the text has more than max tokens; otherwise ids are
// Encode's.
type boundedEncoder interface {
	EncodeBounded(text string, addSpecial bool, max int) (ids []int32, ok bool)
}

// encodePrompt tokenizes a prompt (param names it in errors). A prompt
// beyond the model's context is refused before it is encoded in full when
// the tokenizer can tell (boundedEncoder): encoding allocates many times a
// text's size, and a prompt of megabytes would cost the engine hundreds
// of MB only to be refused. A prompt that fits is checked against the
// context by the caller, as always.
func (s *Server) encodePrompt(text string, addSpecial bool, param string) ([]int32, *Error) {
	b, ok := s.cfg.Tokenizer.(boundedEncoder)
	if !ok {
		return s.cfg.Tokenizer.Encode(text, addSpecial), nil
	}
	maxLen := s.cfg.Backend.MaxModelLen()
	ids, fits := b.EncodeBounded(text, addSpecial, maxLen)
	if !fits {
		return nil, BadRequest(param, "This model's maximum context length is %d tokens, but the prompt has more than %d tokens, which leaves no room for a completion. Shorten the prompt.", maxLen, maxLen)
	}
	return ids, nil
}
