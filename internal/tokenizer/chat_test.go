package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// withConfig writes a minimal fixture tokenizer plus the given
// tokenizer_config.json and loads it.
func withConfig(t *testing.T, cfg map[string]any) *Tokenizer {
	t.Helper()
	dir := t.TempDir()
	if _, err := WriteFixture(dir, FixtureOptions{VocabSize: 259}); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

const (
	smolLM2Template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

	llama3Template = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

	mistralTemplate = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'].strip() + eos_token }}{% endif %}{% if loop.last %}{{ '' }}{% endif %}{% endfor %}"
)

func TestApplyChatTemplate(t *testing.T) {
	conv := []Message{
		{Role: "user", Content: "  Hello!  "},
		{Role: "assistant", Content: "Hi. "},
		{Role: "user", Content: "How are you?"},
	}
	tests := []struct {
		name      string
		template  any // string or list of {name, template}
		msgs      []Message
		genPrompt bool
		want      string
		wantErr   string
	}{
		{
			name: "ChatML adds a default system turn and the generation prompt", template: smolLM2Template,
			msgs: conv[:1], genPrompt: true,
			want: "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n  Hello!  <|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name: "ChatML keeps a given system turn and omits the prompt when not asked", template: smolLM2Template,
			msgs: []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}},
			want: "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
		},
		{
			name: "Llama 3 puts bos_token first and trims contents", template: llama3Template,
			msgs: conv, genPrompt: true,
			want: "<|endoftext|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			name: "Mistral strips contents and ends assistant turns with eos_token", template: mistralTemplate,
			msgs: conv,
			want: "<|endoftext|>[INST] Hello! [/INST]Hi.<|im_end|>[INST] How are you? [/INST]",
		},
		{
			name: "raise_exception becomes an error", template: mistralTemplate,
			msgs:    []Message{{Role: "assistant", Content: "first"}},
			wantErr: "Conversation roles must alternate",
		},
		{
			name:     "a list of named templates uses the default one",
			template: []map[string]string{{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ messages[0].content }}"}},
			msgs:     conv[:1], want: "  Hello!  ",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := withConfig(t, map[string]any{
				"bos_token":     map[string]any{"content": "<|endoftext|>", "special": true},
				"eos_token":     "<|im_end|>",
				"chat_template": tc.template,
			})
			if !tok.HasChatTemplate() {
				t.Fatal("HasChatTemplate() = false")
			}
			got, err := tok.ApplyChatTemplate(tc.msgs, tc.genPrompt)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestApplyChatTemplateErrors(t *testing.T) {
	t.Run("no template gives ErrNoChatTemplate", func(t *testing.T) {
		tok := withConfig(t, map[string]any{"eos_token": "<|im_end|>"})
		if tok.HasChatTemplate() {
			t.Fatal("HasChatTemplate() = true")
		}
		if _, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, true); !errors.Is(err, ErrNoChatTemplate) {
			t.Fatalf("err = %v, want ErrNoChatTemplate", err)
		}
	})
	t.Run("a template that does not compile still loads and fails on use", func(t *testing.T) {
		tok := withConfig(t, map[string]any{"chat_template": "{% for m in messages %}"})
		if !tok.HasChatTemplate() {
			t.Fatal("HasChatTemplate() = false")
		}
		if _, err := tok.ApplyChatTemplate(nil, true); err == nil || !strings.Contains(err.Error(), "chat template") {
			t.Fatalf("err = %v, want a chat template compile error", err)
		}
	})
}
