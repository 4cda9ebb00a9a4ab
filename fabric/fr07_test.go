package fabric

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/internal/walker/walkertest"
	"github.com/esf-dev/esf/wasi"
)

// TestFR07_SameRootOnBothBackends: a walker built for linux (static,
// bind-mounted by the test, never part of the image) and for wasip1 walks
// the same node under runc and under wazero; both outputs equal the tree
// in the CAS (the WASI one in the fields WASI can report).
func TestFR07_SameRootOnBothBackends(t *testing.T) {
	requireMounts(t)
	testenv.Require(t, runctest.Needs...)
	ctx := context.Background()
	dir := t.TempDir()
	initBin, err := runctest.BuildInit(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	linuxWalker := walkertest.Build(t, "linux")
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc"), Init: initBin})
	if err != nil {
		t.Fatal(err)
	}
	wrt, err := wasi.New(ctx, wasi.Options{CacheDir: filepath.Join(dir, "wasm-cache")})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(ctx, testOptions(t, Options{StateDir: filepath.Join(dir, "state"), Executor: ex, WASI: wrt,
		ContainerMounts: []executor.Mount{{Source: linuxWalker, Destination: "/.esf/walker", ReadOnly: true}}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		wrt.Close(context.Background())
	})

	// The fixture: a busybox image (so runc has a shell) plus nested dirs,
	// symlinks of every kind, special modes, a large and an empty file.
	src := t.TempDir()
	if err := runctest.Busybox(src); err != nil {
		t.Fatal(err)
	}
	for p, c := range map[string]string{
		"data/a/b/c/deep.txt": "deep", "data/empty": "", "data/large.bin": strings.Repeat("0123456789abcdef", 320_000),
		"data/suid": "#!/bin/sh\n", "data/x/y.txt": "y",
	} {
		write(t, filepath.Join(src, p), c)
	}
	os.Chmod(filepath.Join(src, "data/suid"), 0o4755)
	os.Chmod(filepath.Join(src, "data/x"), 0o750)
	os.Symlink("a/b/c/deep.txt", filepath.Join(src, "data/rel"))
	os.Symlink("/data/x/y.txt", filepath.Join(src, "data/abs"))
	os.Symlink("nowhere", filepath.Join(src, "data/dangling"))
	imp, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: imp.Root.String()})
	if err != nil {
		t.Fatal(err)
	}
	skip := append(walkertest.DefaultSkip, "/run")
	want, err := walkertest.FromTree(ctx, f.store, imp.Root, walkertest.Options{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}

	// runc: the linux walker, bind-mounted read-only.
	ra, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	walk := func(attempt string, req ExecRequest) []walkertest.Line {
		t.Helper()
		var out, errb bytes.Buffer
		req.AttemptID = attempt
		res, err := f.Exec(ctx, req, ExecStreams{Stdout: &out, Stderr: &errb})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("walker: code %d, %v: %s", res.ExitCode, err, errb.String())
		}
		lines, err := walkertest.Parse(out.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
	gotRunc := walk(ra.AttemptID, ExecRequest{Args: append([]string{"/.esf/walker"}, walkertest.Args("/", false, skip)...)})
	if d := walkertest.Diff(want, gotRunc); d != "" {
		t.Errorf("runc walk differs from the CAS tree:\n%s", d)
	}
	gotRuncPortable := walk(ra.AttemptID, ExecRequest{Args: append([]string{"/.esf/walker"}, walkertest.Args("/", true, skip)...)})

	// wazero: the wasip1 walker, from the CAS, preopened on the same kind
	// of root (an attempt of the same node).
	info, _, err := f.store.Put(ctx, bytes.NewReader(walkertest.Wasm(t)))
	if err != nil {
		t.Fatal(err)
	}
	wa, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorWASI})
	if err != nil {
		t.Fatal(err)
	}
	gotWasm := walk(wa.AttemptID, ExecRequest{Module: info.ID.String(), Args: append([]string{"walker"}, walkertest.Args("/", false, skip)...)})
	if d := walkertest.Diff(walkertest.Portable(want), gotWasm); d != "" {
		t.Errorf("wasi walk differs from the CAS tree:\n%s", d)
	}
	if d := walkertest.Diff(gotRuncPortable, gotWasm); d != "" {
		t.Errorf("wasi and runc walks differ:\n%s", d)
	}
	if len(gotWasm) < 10 {
		t.Fatalf("walk saw only %d paths", len(gotWasm))
	}
}
