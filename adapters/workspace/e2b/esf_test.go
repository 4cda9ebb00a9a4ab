package e2b_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/delta"
	e2bfront "github.com/esf-dev/esf/e2b"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

// TestESFFrontDoorConformance runs the shared workspace suite with this
// adapter against esf's own E2B front door (package e2b of the main
// module): a live conformance run through E2B's protocol, on a fabric
// with real runc containers in a user namespace over busybox and a static
// bash.
func TestESFFrontDoorConformance(t *testing.T) {
	testenv.Require(t, "fuse", "overlay", "cmd:bash-static")
	testenv.Require(t, runctest.Needs...)
	ctx := context.Background()
	dir := t.TempDir()
	initBin, err := runctest.BuildInit(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "esf-e2bconf"
	userns := runc.IDRange{Start: 1<<30 + 6*65536, Count: 65536}
	idmap, err := delta.NewIDMap(userns.Start, userns.Count)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idmap.Close() })
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc"), Init: initBin, Namespace: ns, UserNS: userns})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fabric.Open(ctx, fabric.Options{StateDir: filepath.Join(dir, "state"), Executor: ex, IDMap: idmap})
	if err != nil {
		t.Fatal(err)
	}
	const key = "e2b_0123456789abcdef0123456789abcdef"
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, err := api.LoadTokens(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	front := e2bfront.New(f, e2bfront.Options{Keys: toks, Logger: slog.New(slog.DiscardHandler), CPUCount: 1, MemoryMB: 1024,
		RootUID: userns.Start})
	hs := httptest.NewServer(front)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		front.Close()
		if err := f.StopAll(ctx); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		if left, _ := ex.List(ctx, ""); len(left) != 0 {
			t.Errorf("containers left: %+v", left)
		}
		runctest.RemoveCgroupParents(ns)
	})

	rootfs := t.TempDir()
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	bash, err := exec.LookPath("bash-static")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bash)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(rootfs, "bin", "bash"))
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "bash"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	imp, err := f.Import(ctx, fabric.ImportSource{Path: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(ctx, fabric.CreateGroupRequest{RootID: imp.Root.String()})
	if err != nil {
		t.Fatal(err)
	}

	p, err := e2b.New(e2b.Config{APIKey: key, APIURL: hs.URL, SandboxURL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Image: g.Group.GroupID, Timeout: 10 * time.Minute},
		LargeFile: 64 << 20,
		OpTimeout: 3 * time.Minute,
	})
}
