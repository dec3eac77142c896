package tokenizer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ErrNoChatTemplate is returned by ApplyChatTemplate for a model that ships
// no chat template; such a model can only serve the completions API.
var ErrNoChatTemplate = errors.New("the model has no chat template (none in tokenizer_config.json or chat_template.jinja): use the completions API or pass a model with a chat template")

// Message is one turn of a chat conversation.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTemplate is a compiled Jinja chat template, or the reason it would not
// compile (reported when it is used, so that a model with an unusual
// template still serves the completions API).
type chatTemplate struct {
	tmpl *jinja.Template
	err  error
}

func newChatTemplate(src string) *chatTemplate {
	t, err := jinja.Compile(src)
	if err != nil {
		return &chatTemplate{err: fmt.Errorf("compile chat template: %w", err)}
	}
	return &chatTemplate{tmpl: t}
}

// HasChatTemplate reports whether the model ships a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ApplyChatTemplate renders msgs with the model's chat template, as
// transformers' apply_chat_template(tokenize=False) does. The template sees
// messages, add_generation_prompt, bos_token and eos_token, plus the
// raise_exception and strftime_now helpers. The result still contains the
// special tokens as text; Encode recognises them.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	if t.chat == nil {
		return "", ErrNoChatTemplate
	}
	if t.chat.err != nil {
		return "", t.chat.err
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	out, err := t.chat.tmpl.Render(map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bosToken,
		"eos_token":             t.eosToken,
	})
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// WithChatTemplate returns a copy of t that renders chats with src, a Jinja
// chat template, instead of the model's own (vLLM's --chat-template, and a
// request's chat_template). The copy shares everything else with t and sees
// the same bos_token and eos_token. A template that does not compile is an
// error here, where it is given, rather than on the first chat request.
func (t *Tokenizer) WithChatTemplate(src string) (*Tokenizer, error) {
	ct, err := compileChatTemplate(src)
	if err != nil {
		return nil, err
	}
	c := *t
	c.chat = ct
	return &c, nil
}

// CheckChatTemplate reports why src, a Jinja chat template, cannot be used:
// it is empty (every conversation would render as an empty prompt) or does
// not compile. It returns nil for a usable template.
func CheckChatTemplate(src string) error {
	_, err := compileChatTemplate(src)
	return err
}

func compileChatTemplate(src string) (*chatTemplate, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("the chat template is empty")
	}
	ct := newChatTemplate(src)
	return ct, ct.err
}
