package kvxfer

import (
	"errors"
	"io"
	"log/slog"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func isErr(err, target error) bool { return errors.Is(err, target) }
