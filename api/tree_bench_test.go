package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/fabric"
)

// BenchmarkTree10k is GET /v1/tree of a 10,000-node group (the web view's
// 10,000-node bound, issue 23) through the handler, without a socket.
// `go test ./api -run '^$' -bench Tree10k -cpuprofile cpu.out` shows where
// the time goes.
func BenchmarkTree10k(b *testing.B) {
	dir := b.TempDir()
	f, err := fabric.Open(context.Background(), fabric.Options{StateDir: filepath.Join(dir, "state"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.StopAll(context.Background()); f.Close() })
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("a\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g, err := f.CreateGroupFrom(ctx, fabric.ImportSource{Path: src}, fabric.CreateGroupRequest{Source: src})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.Fork(ctx, fabric.ForkRequest{NodeID: g.Node.NodeID, N: 9999}); err != nil {
		b.Fatal(err)
	}
	s := NewServer(f, ServerOptions{})
	var n int
	for b.Loop() {
		req := httptest.NewRequest(http.MethodGet, "/v1/tree/"+g.Group.GroupID, nil)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
		n = w.Body.Len()
	}
	b.ReportMetric(float64(n), "bytes/op")
}
