package tokenizer

import (
	"errors"
	"testing"
)

func TestWithChatTemplate(t *testing.T) {
	base := withConfig(t, map[string]any{"bos_token": "<|endoftext|>"})
	if base.HasChatTemplate() {
		t.Fatal("the fixture has a chat template")
	}
	msgs := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}}

	t.Run("a template for a model without one, seeing its bos_token", func(t *testing.T) {
		tt, err := base.WithChatTemplate("{{ bos_token }}{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
		if err != nil {
			t.Fatal(err)
		}
		got, err := tt.ApplyChatTemplate(msgs, true)
		if err != nil || got != "<|endoftext|>user:hi;assistant:yo;assistant:" {
			t.Errorf("rendered %q, %v", got, err)
		}
		if _, err := base.ApplyChatTemplate(msgs, true); !errors.Is(err, ErrNoChatTemplate) {
			t.Errorf("the original tokenizer changed: %v", err)
		}
		if a, b := tt.Encode("hi", true), base.Encode("hi", true); len(a) != len(b) {
			t.Errorf("the copy encodes %v, the original %v", a, b)
		}
	})
	t.Run("refuses a template that does not compile or is empty", func(t *testing.T) {
		for _, src := range []string{"{% for m in messages %}", "", " \n"} {
			if _, err := base.WithChatTemplate(src); err == nil {
				t.Errorf("template %q accepted", src)
			}
			if err := CheckChatTemplate(src); err == nil {
				t.Errorf("CheckChatTemplate(%q) = nil", src)
			}
		}
		if err := CheckChatTemplate("{{ messages[0]['content'] }}"); err != nil {
			t.Errorf("a good template: %v", err)
		}
	})
}
