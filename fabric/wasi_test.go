package fabric

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/wasi"
	"github.com/esf-dev/esf/wasi/wasitest"
)

// TestWASIWritesAreSealed: a module run in a wasi attempt (read from the
// attempt's root) writes into the attempt's delta; suspend seals it into
// the child. A module past its timeout is deadline_exceeded.
func TestWASIWritesAreSealed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wrt, err := wasi.New(ctx, wasi.Options{CacheDir: filepath.Join(dir, "cache")})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(ctx, logicOptions(Options{StateDir: filepath.Join(dir, "state"), WASI: wrt}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.StopAll(context.Background())
		f.Close()
		wrt.Close(context.Background())
	})
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "guest.wasm"), wasitest.Guest(t), 0o755); err != nil {
		t.Fatal(err)
	}
	imp, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: imp.Root.String()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorWASI})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	res, err := f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"/guest.wasm", "write", "/made-by-wasm", "hello from wasm"}},
		ExecStreams{Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("module: code %d, %v: %s", res.ExitCode, err, errb.String())
	}
	if _, err := f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"/guest.wasm", "spin"}, TimeoutMillis: 300},
		ExecStreams{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spinning module past its timeout: %v", err)
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	exp := filepath.Join(t.TempDir(), "exp")
	if _, _, err := f.ExportDir(ctx, sealed.Node.NodeID, exp); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(exp, "made-by-wasm")); err != nil || string(b) != "hello from wasm" {
		t.Fatalf("sealed child: %q, %v", b, err)
	}
	if sealed.Attempt.State != journal.AttemptReleased {
		t.Fatalf("attempt after suspend: %s", sealed.Attempt.State)
	}
}
