package openai

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// newClient returns the official client pointed at a test server.
func newClient(baseURL string) oai.Client {
	return oai.NewClient(
		option.WithBaseURL(baseURL+"/v1"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second),
	)
}

// clientChecks runs the official client against baseURL for non-streaming
// and streaming completions and chat, and returns what each produced.
type clientResult struct {
	completion, completionStream, chat, chatStream string
	usage, streamUsage                             oai.CompletionUsage
	chatFinish, chatStreamFinish                   string
}

func runClient(t *testing.T, baseURL, model string, prompt []int64, maxTokens int64, chat bool) clientResult {
	t.Helper()
	ctx := context.Background()
	c := newClient(baseURL)
	var r clientResult

	comp, err := c.Completions.New(ctx, oai.CompletionNewParams{
		Model:       oai.CompletionNewParamsModel(model),
		Prompt:      oai.CompletionNewParamsPromptUnion{OfArrayOfTokens: prompt},
		MaxTokens:   oai.Int(maxTokens),
		Temperature: oai.Float(0),
	})
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if len(comp.Choices) != 1 {
		t.Fatalf("completion has %d choices", len(comp.Choices))
	}
	r.completion, r.usage = comp.Choices[0].Text, comp.Usage

	stream := c.Completions.NewStreaming(ctx, oai.CompletionNewParams{
		Model:         oai.CompletionNewParamsModel(model),
		Prompt:        oai.CompletionNewParamsPromptUnion{OfArrayOfTokens: prompt},
		MaxTokens:     oai.Int(maxTokens),
		Temperature:   oai.Float(0),
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)},
	})
	var sb strings.Builder
	for stream.Next() {
		ch := stream.Current()
		for _, choice := range ch.Choices {
			sb.WriteString(choice.Text)
		}
		if ch.Usage.TotalTokens > 0 {
			r.streamUsage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("completion stream: %v", err)
	}
	r.completionStream = sb.String()
	if !chat {
		return r
	}

	cc, err := c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{
		Model:               model,
		Messages:            []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("be brief"), oai.UserMessage("hello")},
		MaxCompletionTokens: oai.Int(maxTokens),
		Temperature:         oai.Float(0),
	})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	r.chat, r.chatFinish = cc.Choices[0].Message.Content, cc.Choices[0].FinishReason
	if cc.Choices[0].Message.Role != "assistant" {
		t.Errorf("chat role %q", cc.Choices[0].Message.Role)
	}

	cs := c.Chat.Completions.NewStreaming(ctx, oai.ChatCompletionNewParams{
		Model:               model,
		Messages:            []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("be brief"), oai.UserMessage("hello")},
		MaxCompletionTokens: oai.Int(maxTokens),
		Temperature:         oai.Float(0),
	})
	var acc oai.ChatCompletionAccumulator
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	if len(acc.Choices) != 1 {
		t.Fatalf("chat stream accumulated %d choices", len(acc.Choices))
	}
	r.chatStream, r.chatStreamFinish = acc.Choices[0].Message.Content, acc.Choices[0].FinishReason
	return r
}

func TestOfficialClientWithFakeEngine(t *testing.T) {
	b := newFakeBackend(echoScript("abcdef"))
	_, ts := newTestServer(t, b, nil)
	r := runClient(t, ts.URL, "m", []int64{1, 70}, 4, true)
	for name, got := range map[string]string{"completion": r.completion, "completion stream": r.completionStream, "chat": r.chat, "chat stream": r.chatStream} {
		if got != "abcd" {
			t.Errorf("%s: %q, want %q", name, got, "abcd")
		}
	}
	if r.usage.CompletionTokens != 4 || r.streamUsage.CompletionTokens != 4 || r.usage.PromptTokens != 2 {
		t.Errorf("usage %+v, stream usage %+v", r.usage, r.streamUsage)
	}
	if r.chatFinish != "length" || r.chatStreamFinish != "length" {
		t.Errorf("finish reasons %q and %q, want length", r.chatFinish, r.chatStreamFinish)
	}

	t.Run("errors reach the client as API errors", func(t *testing.T) {
		c := newClient(ts.URL)
		_, err := c.Completions.New(context.Background(), oai.CompletionNewParams{
			Model:  "nope",
			Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("a")},
		})
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type != TypeNotFound || apiErr.Param != "model" {
			t.Fatalf("got %v (%#v), want a 404 NotFoundError on model", err, apiErr)
		}
	})
}
