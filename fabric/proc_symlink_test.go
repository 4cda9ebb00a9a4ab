package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// TestProcSymlinkIsAClearError: a tree whose /proc (or /sys, /dev) is a
// symlink cannot hold the runtime's mounts there; activating it with runc
// answers failed_precondition naming the path, not internal, and leaves no
// container or mount behind.
func TestProcSymlinkIsAClearError(t *testing.T) {
	f, _ := openRunc(t)
	ctx := context.Background()
	for _, dir := range []string{"proc", "sys", "dev"} {
		t.Run(dir, func(t *testing.T) {
			rootfs := t.TempDir()
			if err := runctest.Busybox(rootfs); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(filepath.Join(rootfs, dir))
			if err := os.Symlink("/etc", filepath.Join(rootfs, dir)); err != nil {
				t.Fatal(err)
			}
			imp, err := f.Import(ctx, ImportSource{Path: rootfs})
			if err != nil {
				t.Fatal(err)
			}
			g, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: imp.Root.String(), Source: "busybox with a symlink " + dir})
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/"+dir) {
				t.Fatalf("activate with /%s a symlink: %v (code %s), want failed_precondition naming /%s", dir, err, errdefs.CodeOf(err), dir)
			}
		})
	}
}
