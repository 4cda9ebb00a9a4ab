package fabric

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestBoundary_SealKeepsSandboxOwnership: a runc attempt's root is an
// unprivileged host user, yet the sealed tree records ownership as the
// sandbox saw it: root's files as uid 0, its user's as theirs. On the host,
// the live root shows the container's files as owned by the range, so a
// setuid file the sandbox makes is not setuid root there.
func TestBoundary_SealKeepsSandboxOwnership(t *testing.T) {
	f, g := openRunc(t)
	ctx := context.Background()
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if out, errs, code := run(t, f, a.AttemptID, "sh", "-ec",
		"id -u; echo r > /rootfile; mkdir /home; echo u > /home/userfile; chown -R 1000:1000 /home; "+
			"cp /bin/busybox /suid; chmod 4755 /suid; chmod 1777 /tmp; touch /tmp/t"); out != "0\n" || code != 0 {
		t.Fatalf("as the sandbox's root: %q, exit %d: %s", out, code, errs)
	}
	owner := func(p string) (uint32, uint32) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	live, err := f.attemptView(ctx, a.AttemptID)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := owner(filepath.Join(live.Root, "suid")); u != testUserNS.Start {
		t.Fatalf("on the host, the sandbox's setuid file is owned by %d, want %d (not root)", u, testUserNS.Start)
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	exp := filepath.Join(t.TempDir(), "exp")
	if _, _, err := f.ExportDir(ctx, sealed.Node.NodeID, exp); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"rootfile": 0, "suid": 0, "tmp": 0, "tmp/t": 0, "home": 1000, "home/userfile": 1000} {
		if u, g := owner(filepath.Join(exp, p)); u != want || g != want {
			t.Errorf("sealed %s is owned by %d:%d, want %d:%d as the sandbox saw it", p, u, g, want, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(exp, "rootfile")); err != nil || string(b) != "r\n" {
		t.Errorf("sealed rootfile = %q, %v", b, err)
	}
	// A new container on the child sees its files as its own again.
	b, err := f.Activate(ctx, ActivateRequest{NodeID: sealed.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, code := run(t, f, b.AttemptID, "sh", "-c", "stat -c '%u:%g' /rootfile /home/userfile && echo again >> /rootfile"); out != "0:0\n1000:1000\n" || code != 0 {
		t.Fatalf("owners inside the next container: %q, exit %d", out, code)
	}
}
