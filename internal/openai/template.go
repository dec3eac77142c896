package openai

import "github.com/tandem-serve/tandem/internal/tokenizer"

// ChatTemplateOf returns t's chat template as a ChatTemplate, or nil when the
// model ships none (chat requests then get a 400 pointing to completions).
func ChatTemplateOf(t *tokenizer.Tokenizer) ChatTemplate {
	if !t.HasChatTemplate() {
		return nil
	}
	return func(msgs []Message, addGenerationPrompt bool) (string, error) {
		tm := make([]tokenizer.Message, len(msgs))
		for i, m := range msgs {
			tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		return t.ApplyChatTemplate(tm, addGenerationPrompt)
	}
}
