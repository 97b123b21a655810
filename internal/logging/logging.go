// Package logging makes the JSON logger the runwarden servers log with.
package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
)

// New returns a logger writing JSON lines to w at the named level
// (debug, info, warn or error).
func New(level string, w io.Writer) (logr.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return logr.Logger{}, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}
