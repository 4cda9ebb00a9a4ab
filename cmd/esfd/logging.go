package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/sirupsen/logrus"
)

// newLogger builds the daemon's only slog handler: JSON lines on stderr.
func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(level))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// routeContainerdLog sends what containerd's libraries log (through
// github.com/containerd/log, a logrus logger) to log as JSON lines, instead
// of logrus text on stderr between them. Its one routine complaint, that the
// scratch store of an OCI import has no fs-verity (true of most file
// systems, and meaningless here: esf verifies every object by its hash),
// goes to debug: otherwise every image import would warn.
func routeContainerdLog(log *slog.Logger) {
	l := logrus.StandardLogger()
	l.SetOutput(io.Discard)
	l.SetFormatter(discardFormatter{})
	// logrus drops entries below its own level before any hook sees them.
	l.SetLevel(logrus.InfoLevel)
	if log.Enabled(context.Background(), slog.LevelDebug) {
		l.SetLevel(logrus.DebugLevel)
	}
	l.AddHook(slogHook{log: log.With("component", "containerd")})
}

type slogHook struct{ log *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	level := slog.LevelDebug
	switch {
	case strings.Contains(e.Message, "fsverity"):
		// stays debug (see routeContainerdLog)
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	case e.Level == logrus.WarnLevel:
		level = slog.LevelWarn
	case e.Level == logrus.InfoLevel:
		level = slog.LevelInfo
	}
	attrs := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		attrs = append(attrs, k, v)
	}
	h.log.Log(context.Background(), level, e.Message, attrs...)
	return nil
}

type discardFormatter struct{}

func (discardFormatter) Format(*logrus.Entry) ([]byte, error) { return nil, nil }
