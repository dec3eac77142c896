package engine

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/logid"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestFinishLogNamesTheInternalIDByTagAtInfo: the internal id (what a KV
// hold is keyed by) appears in the "request finished" line only as a tag
// at info level, and raw only at debug level; the client's id is there
// for correlation.
func TestFinishLogNamesTheInternalIDByTagAtInfo(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		raw   bool
	}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
		t.Run(tc.level.String(), func(t *testing.T) {
			m, tok, _ := load(t)
			var out testutil.SyncBuffer
			e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 64, KVDir: t.TempDir(),
				Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: tc.level}))})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Shutdown(context.Background())
			h, err := e.Submit(context.Background(), &Request{ID: "client-id-42", Prompt: []int32{1, 50, 60}, Params: greedy(2)})
			if err != nil {
				t.Fatal(err)
			}
			collect(t, h)
			if err := e.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			var line string
			for l := range strings.SplitSeq(out.String(), "\n") {
				if strings.Contains(l, `msg="request finished"`) {
					line = l
				}
			}
			if line == "" {
				t.Fatalf("no \"request finished\" line in:\n%s", out.String())
			}
			if !strings.Contains(line, "request_id=client-id-42") || !strings.Contains(line, "id_tag="+logid.Tag(h.ID)) {
				t.Errorf("line lacks request_id=client-id-42 or id_tag=%s: %s", logid.Tag(h.ID), line)
			}
			if got := strings.Contains(line, h.ID); got != tc.raw {
				t.Errorf("internal id %q in the line = %v, want %v: %s", h.ID, got, tc.raw, line)
			}
		})
	}
}
