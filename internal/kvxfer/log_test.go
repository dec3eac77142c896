package kvxfer

import (
	"errors"
	"io"
	"log/slog"
	"os"
)

func discardLogger() *slog.Logger {
	if os.Getenv("KVXFER_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func isErr(err, target error) bool { return errors.Is(err, target) }
