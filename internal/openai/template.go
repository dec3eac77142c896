package openai

import (
	"fmt"
	"os"
	"strings"

	"github.com/tandem-serve/tandem/internal/tokenizer"
)

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

// ChatTemplateFor returns the chat template a server over t uses: src, a
// Jinja template that overrides the model's own (`--chat-template`), or the
// model's when src is empty.
func ChatTemplateFor(t *tokenizer.Tokenizer, src string) (ChatTemplate, error) {
	if src == "" {
		return ChatTemplateOf(t), nil
	}
	tt, err := t.WithChatTemplate(src)
	if err != nil {
		return nil, err
	}
	return ChatTemplateOf(tt), nil
}

// RequestChatTemplates returns a Config.RequestChatTemplate that compiles a
// request's chat_template for t (rendered with t's bos_token and eos_token).
func RequestChatTemplates(t *tokenizer.Tokenizer) func(src string) (ChatTemplate, error) {
	return func(src string) (ChatTemplate, error) { return ChatTemplateFor(t, src) }
}

// LoadChatTemplate resolves a --chat-template value as vLLM does: the
// contents of the file it names or, when no file of that name can be read,
// the value itself as the template (taken verbatim: vLLM also undoes
// backslash escapes in an inline template, Tandem does not). A value that
// names no file and holds none of "{", "}" or a newline looks like a
// mistyped path, and is an error rather than a template that would render
// that path as every prompt. The template must compile.
func LoadChatTemplate(value string) (string, error) {
	src := value
	b, err := os.ReadFile(value)
	switch {
	case err == nil:
		src = string(b)
	case !strings.ContainsAny(value, "{}\n"):
		return "", fmt.Errorf("%q looks like a file path, but reading it failed (%w); give a template file or the template text", value, err)
	}
	if err := tokenizer.CheckChatTemplate(src); err != nil {
		if src != value {
			return "", fmt.Errorf("%s: %w", value, err)
		}
		return "", err
	}
	return src, nil
}
