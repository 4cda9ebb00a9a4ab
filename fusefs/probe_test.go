package fusefs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Access is what internal/accessprobe saw for one path: the errno (0 when
// allowed) of access(2) for R_OK, W_OK and X_OK, and of actually opening
// and reading it (a file) or listing it (a directory); and the extended
// attributes it may list, with the errno of reading each.
type Access struct {
	R, W, X, Read syscall.Errno
	Xattrs        string
}

func (a Access) String() string {
	s := func(e syscall.Errno) string {
		if e == 0 {
			return "ok"
		}
		return unix.ErrnoName(e)
	}
	return fmt.Sprintf("r=%s w=%s x=%s read=%s xattrs=[%s]", s(a.R), s(a.W), s(a.X), s(a.Read), a.Xattrs)
}

// probeAs runs the access probe as uid and gid (with groups as
// supplementary groups) over paths.
func probeAs(t testing.TB, uid, gid uint32, groups []uint32, paths []string) map[string]Access {
	t.Helper()
	exe, err := probeBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, paths...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probe as %d:%d: %v: %s", uid, gid, err, stderr.String())
	}
	var res map[string]Access
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return res
}

// probeBinary builds internal/accessprobe once per test binary, in a
// directory any user may enter (go test's own are private to their
// owner); removeProbeBinary deletes it when the tests end.
var probeBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "esf-probe-")
	if err != nil {
		return "", err
	}
	probeDir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	exe := filepath.Join(dir, "accessprobe")
	cmd := exec.Command(goTool(), "build", "-o", exe, "github.com/esf-dev/esf/internal/accessprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the access probe: %v: %s", err, out)
	}
	return exe, nil
})

var probeDir string

func removeProbeBinary() {
	if probeDir != "" {
		os.RemoveAll(probeDir)
	}
}

// goTool finds the go command: go test puts its own first on PATH.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// sharedTempDir is t.TempDir that other users can reach: go test makes
// the test's temporary directory private to its owner.
func sharedTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
