package e2e

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// busyboxTree is a root whose /bin holds a static busybox and the applets
// the test runs.
func busyboxTree(t *testing.T, d *daemon) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("exec needs a static busybox for the container's root")
	}
	dir := smallTree(t, d, map[string]string{"etc/hostname": "box\n"})
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(bb)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, "bin", "busybox"), os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	for _, applet := range []string{"sh", "echo", "sleep", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestExecVerb: esfctl exec copies the command's output, exits with its
// status, 128+N when a signal killed it, and 8 when --timeout did.
func TestExecVerb(t *testing.T) {
	requireFUSE(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("exec needs runc")
	}
	d := startDaemon(t)
	g := createGroup(t, d, busyboxTree(t, d))
	kid := fork(t, d, g.Node.NodeID, 1)[0]
	a := activate(t, d, kid, "--executor", "runc")

	r := d.ctl(nil, "exec", a.AttemptID, "--env", "X=42", "--", "/bin/sh", "-c", "echo out $X; cat /etc/hostname; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out 42\nbox\n" || r.stderr != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = d.ctl(nil, "exec", a.AttemptID, "--", "/bin/sh", "-c", "kill -9 $$")
	if r.code != 137 {
		t.Fatalf("exec killed by SIGKILL: exit %d, stderr %q", r.code, r.stderr)
	}
	r = d.ctl(nil, "-o", "json", "exec", a.AttemptID, "--timeout", "300ms", "--", "/bin/sleep", "30")
	if r.code != 8 {
		t.Fatalf("exec past its timeout: exit %d, stderr %q", r.code, r.stderr)
	}
	jsonErr(t, r, "deadline_exceeded")
	// What the command wrote is in the attempt's tree.
	d.mustCtl(nil, "exec", a.AttemptID, "--", "/bin/sh", "-c", "echo made > /made.txt")
	if got := readFile(t, filepath.Join(a.Root, "made.txt")); strings.TrimSpace(got) != "made" {
		t.Fatalf("file written by exec: %q", got)
	}
	// An interrupted esfctl kills its command: the marker the command
	// would write after its sleep never appears.
	cmd := exec.Command(esfctlBin, "exec", a.AttemptID, "--", "/bin/sh", "-c", "sleep 2; echo late > /late.txt")
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 8 {
		t.Fatalf("interrupted exec: %v, want exit 8", err)
	}
	time.Sleep(3 * time.Second)
	if _, err := os.Stat(filepath.Join(a.Root, "late.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the interrupted command ran on: %v", err)
	}
	// Release stops the container; stop-all at teardown does not wait
	// for a live container's mounts (see the report).
	d.mustCtl(nil, "release", a.AttemptID)
}
