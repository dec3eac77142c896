// Package logid says how logs name request ids that grant access.
//
// A prefill engine holds a finished request's KV under its internal id
// (the client's id plus a random suffix) until a decode engine reads or
// releases it; a decode engine does the same for a conversation it holds.
// Without a cluster KV secret the side channel authenticates nobody, so
// anyone who can reach it and knows a held id can read or release that
// KV. Logs are read by more people than the engine's side channel should
// trust, so lines logged at info level and above name such ids by a tag:
// the first 8 hex digits of HMAC-SHA256 under a random key of this process.
// The tag is stable within one process, so it correlates that engine's
// lines about one request; it cannot be turned back into the id, even by
// someone who knows the id's prefix (a guess of the random suffix cannot be
// checked against the tag without the key). The raw id is added only when
// the logger is enabled at debug level.
package logid

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
)

// key is this process's tag key, never written anywhere.
var key = func() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}()

// Tag returns id's tag: 8 hex digits, the same for the same id within
// this process.
func Tag(id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:4])
}

// Attrs returns the log attributes naming id for a line of l: name+"_tag"
// with Tag(id), and name with the raw id when l logs at debug level.
func Attrs(l *slog.Logger, name, id string) []any {
	a := []any{name + "_tag", Tag(id)}
	if l != nil && l.Enabled(context.Background(), slog.LevelDebug) {
		a = append(a, name, id)
	}
	return a
}

// Redact replaces id in s (an error message about it, whose formatting
// quoted the id or not) with "<id TAG>", for the err attribute of a line
// that names id by Attrs. Ids shorter than 8 bytes are replaced only where
// quoted, so a short id does not mangle the words around it.
func Redact(s, id string) string {
	if id == "" {
		return s
	}
	tag := "<id " + Tag(id) + ">"
	s = strings.ReplaceAll(s, strconv.Quote(id), tag)
	if len(id) >= 8 {
		s = strings.ReplaceAll(s, id, tag)
	}
	return s
}
