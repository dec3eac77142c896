package main

import (
	"testing"
	"time"
)

func TestParseProxyConversationFlags(t *testing.T) {
	f, err := parseProxyFlags([]string{"--prefill", "a:1", "--decode", "b:2"})
	if err != nil {
		t.Fatal(err)
	}
	if f.cfg.Conversations {
		t.Error("conversation mode on by default")
	}
	f, err = parseProxyFlags([]string{"--prefill", "a:1", "--decode", "b:2", "--conversations", "--conversation-max-entries", "5", "--conversation-ttl", "90s",
		"--conversation-min-prefix-tokens", "16"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.cfg.Conversations || f.cfg.ConversationMaxEntries != 5 || f.cfg.ConversationTTL != 90*time.Second || f.cfg.ConversationMinPrefixTokens != 16 {
		t.Errorf("conversations %v, max entries %d, ttl %v, min prefix tokens %d", f.cfg.Conversations, f.cfg.ConversationMaxEntries, f.cfg.ConversationTTL, f.cfg.ConversationMinPrefixTokens)
	}
}
