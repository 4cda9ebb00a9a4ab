package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	clog "github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// TestContainerdLogRouted: containerd's logrus lines come out of the
// daemon's slog handler as JSON, and its fs-verity complaint only at debug.
func TestContainerdLogRouted(t *testing.T) {
	std := logrus.StandardLogger()
	t.Cleanup(func() {
		std.ReplaceHooks(make(logrus.LevelHooks))
		std.SetOutput(os.Stderr)
		std.SetFormatter(&logrus.TextFormatter{})
		std.SetLevel(logrus.InfoLevel)
	})
	var buf bytes.Buffer
	routeContainerdLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))

	clog.L.WithError(errors.New("operation not supported")).WithField("path", "/x").Warnf("failed check for fsverity support")
	clog.L.WithField("ref", "layer-1").Warn("something real")
	clog.L.Debug("chatter")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want exactly the real warning, got:\n%s", buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "something real" || rec["component"] != "containerd" || rec["ref"] != "layer-1" {
		t.Fatalf("routed line %v", rec)
	}
}
