package fusefs

import (
	"encoding/json"
	"errors"
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

// The test binary doubles as an access probe: with probeEnv set it checks,
// under the uid and gids it was started with, what it may do with each
// path named on its command line, and prints the answers as JSON. The
// kernel decides every answer (mode bits, ACLs, read-only mounts), so two
// trees that should behave alike must get the same answers.
const probeEnv = "ESF_FUSEFS_TEST_PROBE"

// Access is what the probe saw for one path: the errno (0 when allowed)
// of access(2) for R_OK, W_OK and X_OK, and of actually opening and
// reading it (a file) or listing it (a directory).
type Access struct {
	R, W, X, Read syscall.Errno
}

func (a Access) String() string {
	s := func(e syscall.Errno) string {
		if e == 0 {
			return "ok"
		}
		return unix.ErrnoName(e)
	}
	return fmt.Sprintf("r=%s w=%s x=%s read=%s", s(a.R), s(a.W), s(a.X), s(a.Read))
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if err != nil {
		return syscall.EIO
	}
	return 0
}

// probeMain is the probe's body.
func probeMain(paths []string) {
	out := map[string]Access{}
	for _, p := range paths {
		var a Access
		a.R = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.R_OK, 0))
		a.W = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.W_OK, 0))
		a.X = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, 0))
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			a.Read = errnoOf(err)
		} else {
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				a.Read = errnoOf(readOne(p))
			case unix.S_IFDIR:
				_, err := os.ReadDir(p)
				a.Read = errnoOf(err)
			}
		}
		out[p] = a
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func readOne(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Read(fd, make([]byte, 1))
	return err
}

// probeAs runs the probe as uid and gid (with groups as supplementary
// groups) over paths.
func probeAs(t testing.TB, uid, gid uint32, groups []uint32, paths []string) map[string]Access {
	t.Helper()
	exe, err := probeBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{"-test.run=^$", "--"}, paths...)...)
	cmd.Env = append(os.Environ(), probeEnv+"=1")
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

// probeBinary is a copy of the test binary that any user may run: go
// test builds it in a directory only its owner can enter. The copy goes
// when the test binary ends (removeProbeBinary).
var probeBinary = sync.OnceValues(func() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "esf-probe-")
	if err != nil {
		return "", err
	}
	probeDir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "probe")
	return p, os.WriteFile(p, b, 0o755)
})

var probeDir string

func removeProbeBinary() {
	if probeDir != "" {
		os.RemoveAll(probeDir)
	}
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

// probeArgs returns the paths after "--" when the binary runs as a probe.
func probeArgs() ([]string, bool) {
	if os.Getenv(probeEnv) == "" {
		return nil, false
	}
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:], true
		}
	}
	return nil, true
}
