package logid

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
)

func TestTagIsShortStableAndNotTheID(t *testing.T) {
	const id = "cmpl-5f0c2b7e-1a2b3c4d"
	tag := Tag(id)
	if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(tag) {
		t.Fatalf("Tag(%q) = %q, want 8 hex digits", id, tag)
	}
	if Tag(id) != tag {
		t.Error("Tag is not stable within the process")
	}
	if Tag(id+"x") == tag {
		t.Error("two ids share a tag")
	}
	if strings.Contains(id, tag) {
		t.Errorf("the tag %q is part of the id", tag)
	}
}

// TestAttrsLogTheRawIDOnlyAtDebug: at info level a line names the id by
// its tag alone; at debug level it carries the raw id too.
func TestAttrsLogTheRawIDOnlyAtDebug(t *testing.T) {
	const id = "req-0123456789-abcdef01"
	for _, tc := range []struct {
		level slog.Level
		raw   bool
	}{{slog.LevelInfo, false}, {slog.LevelWarn, false}, {slog.LevelDebug, true}} {
		var buf bytes.Buffer
		l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
		l.Warn("request finished", Attrs(l, "id", id)...)
		out := buf.String()
		if !strings.Contains(out, "id_tag="+Tag(id)) {
			t.Errorf("level %v: %q lacks id_tag=%s", tc.level, out, Tag(id))
		}
		if got := strings.Contains(out, id); got != tc.raw {
			t.Errorf("level %v: raw id logged = %v, want %v: %q", tc.level, got, tc.raw, out)
		}
	}
	if a := Attrs(nil, "id", id); len(a) != 2 {
		t.Errorf("Attrs(nil logger) = %v, want only the tag", a)
	}
}

func TestRedact(t *testing.T) {
	const id = "chat-1234-deadbeef"
	tag := "<id " + Tag(id) + ">"
	for _, tc := range []struct{ id, in, want string }{
		{id, `kv pull of request "chat-1234-deadbeef": lease expired`, `kv pull of request ` + tag + `: lease expired`},
		{id, "block 3 of request chat-1234-deadbeef went from generation 1 to 2", "block 3 of request " + tag + " went from generation 1 to 2"},
		{"r", `request "r" in prefill`, `request <id ` + Tag("r") + `> in prefill`},
		{"", "nothing to do", "nothing to do"},
	} {
		if got := Redact(tc.in, tc.id); got != tc.want {
			t.Errorf("Redact(%q, %q) = %q, want %q", tc.in, tc.id, got, tc.want)
		}
	}
}
