package crashtest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/internal/testenv"
)

// needs is what the crash tests need (internal/testenv): root for
// overlayfs, the FUSE projection and SIGKILL of esfd.
var needs = []string{"root", "fuse", "overlay"}

// Set by TestMain: the esfd binary under test, or why the tests skip.
var (
	esfdBin    string
	skipReason string
	workDir    string // every case lives below it; removed after the run
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if err := testenv.Check(needs...); err != nil {
		skipReason = err.Error()
		return m.Run()
	}
	// Short: unix socket paths below it must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "esfcr")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	workDir = dir
	defer os.RemoveAll(dir)
	esfdBin = filepath.Join(dir, "esfd")
	cmd := exec.Command(goTool(), "build", "-o", esfdBin, "./cmd/esfd")
	cmd.Dir = ".." // the module root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "crashtest: go build ./cmd/esfd: %v\n%s", err, out)
		return 1
	}
	// One etcd cluster for the run's etcd-mode cases, each under its own
	// key prefix. No fsync: esfd is what the cases kill, never etcd, and a
	// killed process loses nothing of what it wrote to the page cache.
	if etcdMissing = testenv.Check("etcd"); etcdMissing == nil {
		c, err := etcdtest.StartCluster(etcdtest.Options{Members: 1, NoFsync: true, Dir: filepath.Join(dir, "etcd")})
		if err != nil {
			fmt.Fprintf(os.Stderr, "crashtest: start etcd: %v\n", err)
			return 1
		}
		defer c.Stop()
		etcdCluster = c
	}
	code := m.Run()
	// Every case cleans up after itself; this is the last line of defence
	// and a failure if it finds anything.
	if leaks := sweep(dir); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "crashtest: left behind after the run (now removed):\n  %s\n", strings.Join(leaks, "\n  "))
		if code == 0 {
			code = 1
		}
	}
	return code
}

// goTool finds the go command: go test puts its own first on PATH.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// requireEtcd skips (or, when CI requires etcd, fails) a test that needs
// the run's etcd cluster.
func requireEtcd(t testing.TB) {
	t.Helper()
	if etcdCluster == nil {
		testenv.Require(t, "etcd")
		t.Fatalf("no etcd cluster: %v", etcdMissing)
	}
}

func requireRoot(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, needs...) // skips, or fails in CI
		t.Fatal(skipReason)
	}
	if testing.Short() {
		t.Skip("-short: the crash matrix starts esfd some 400 times")
	}
}
