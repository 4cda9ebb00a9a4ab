package export

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

// asNobody runs the test named by t again in a child process as user
// nobody (65534) and fails t if it fails there; it reports whether t is
// that child, which then runs the test's body.
func asNobody(t *testing.T) bool {
	t.Helper()
	if os.Getenv("ESF_EXPORT_TEST_NOBODY") == t.Name() {
		return true
	}
	requireRoot(t)
	// The test binary, where nobody may run it.
	dir, err := os.MkdirTemp("", "esf-export-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "export.test")
	b, err := os.ReadFile(os.Args[0])
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "ESF_EXPORT_TEST_NOBODY="+t.Name(), "TMPDIR=/tmp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	return false
}

// An unprivileged export links a hard link's later members to its first
// even when the first's directory took a mode that denies its owner
// search (the owner has no CAP_DAC_OVERRIDE to pass it).
func TestToDirUnprivilegedLinkIntoClosedDir(t *testing.T) {
	if !asNobody(t) {
		return
	}
	s := mem.New()
	a := fileEntry(t, s, "a", "shared")
	a.LinkGroup, a.Nlink = "g", 2
	b := a
	b.Name = "e"
	inner := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o600}, Entries: []cas.Entry{a}})
	closed := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o000}, Entries: []cas.Entry{
		{Name: "s", Type: cas.TypeDir, ID: inner, Attr: cas.Attr{Mode: 0o600}},
	}})
	root := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{
		{Name: "d", Type: cas.TypeDir, ID: closed, Attr: cas.Attr{Mode: 0o000}}, b,
	}})
	dest := filepath.Join(t.TempDir(), "out")
	t.Cleanup(func() {
		os.Chmod(filepath.Join(dest, "d"), 0o700)
		os.Chmod(filepath.Join(dest, "d", "s"), 0o700)
	})
	if _, err := ToDir(context.Background(), s, root, dest, Options{}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "e")); err != nil || string(got) != "shared" {
		t.Fatalf("e = %q, %v", got, err)
	}
	// The way is closed again, as the tree says.
	if fi, err := os.Lstat(filepath.Join(dest, "d")); err != nil || fi.Mode().Perm() != 0 {
		t.Fatalf("d: %v %v, want mode 0", fi.Mode(), err)
	}
	os.Chmod(filepath.Join(dest, "d"), 0o700)
	if fi, err := os.Lstat(filepath.Join(dest, "d", "s")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("d/s: %v %v, want mode 0600", fi.Mode(), err)
	}
}
