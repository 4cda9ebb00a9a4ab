package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/testenv"
)

// Binaries built by TestMain; empty when the tests cannot run.
var (
	esfdBin, esfctlBin string
	skipReason         string
	workDir            string // removed after the run
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Root: ownership, setuid bits, trusted.* xattrs, device nodes.
	if err := testenv.Check("root"); err != nil {
		skipReason = err.Error()
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "esf-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	workDir = dir
	defer os.RemoveAll(dir)
	esfdBin, esfctlBin = filepath.Join(dir, "esfd"), filepath.Join(dir, "esfctl")
	for bin, pkg := range map[string]string{esfdBin: "./cmd/esfd", esfctlBin: "./cmd/esfctl",
		// The static container init, found beside esfd: runc attempts need it.
		filepath.Join(dir, "esf-init"): "./executor/init"} {
		cmd := exec.Command(goTool(), "build", "-o", bin, pkg)
		cmd.Dir = ".." // the module root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	if stop, err := startSharedRemote(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: ESF_E2E_CAS_REMOTE: %v\n", err)
		return 1
	} else if stop != nil {
		defer stop()
	}
	return m.Run()
}

// goTool finds the go command: go test puts its own first on PATH.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

func requireRoot(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, "root") // skips, or fails in CI
		t.Fatal(skipReason)
	}
}

// syncBuffer holds the daemon's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemon is one running esfd.
type daemon struct {
	t      *testing.T
	state  string
	socket string
	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
	// stopAllFlags go to the teardown's esfd stop-all (a worker on etcd:
	// its --journal and --worker).
	stopAllFlags []string
}

// startDaemon runs esfd on a fresh state dir (or state, when given) and
// waits until it answers.
func startDaemon(t *testing.T, state ...string) *daemon {
	t.Helper()
	var dir string
	if len(state) > 0 {
		dir = state[0]
	}
	return startDaemonWith(t, dir)
}

// startDaemonWith is startDaemon with a state dir ("" for a fresh one) and
// extra esfd flags.
func startDaemonWith(t *testing.T, state string, flags ...string) *daemon {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	d := &daemon{
		t:      t,
		state:  filepath.Join(dir, "state"),
		socket: filepath.Join(dir, "esfd.sock"),
		logs:   &syncBuffer{},
		exited: make(chan struct{}),
	}
	if state != "" {
		d.state = state
	}
	d.cmd = exec.Command(esfdBin, append([]string{"--state", d.state, "--socket", d.socket, "--log-level", "debug"}, remoteFlags(d.state, flags)...)...)
	d.cmd.Stderr = d.logs
	d.cmd.Stdout = d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("esfd log:\n%s", d.logs.String())
		}
		// What a stopped daemon leaves on purpose (attempt mounts, the
		// projection server) must not outlive the test.
		d.teardown()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := d.ctl(nil, "status"); r.code == 0 {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("esfd exited during startup: %v\n%s", d.err, d.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("esfd not ready after 30s:\n%s", d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits; a daemon that does not stop is killed and
// the test fails.
func (d *daemon) stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		d.t.Error("esfd ignored SIGTERM for 30s")
	}
}

type result struct {
	code           int
	stdout, stderr string
}

// ctl runs esfctl against d (through ESF_SOCKET, as a user would set it).
func (d *daemon) ctl(stdin io.Reader, args ...string) result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, esfctlBin, args...)
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			d.t.Fatalf("esfctl %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return result{code, out.String(), errb.String()}
}

// mustCtl runs esfctl and fails the test unless it exits 0.
func (d *daemon) mustCtl(stdin io.Reader, args ...string) result {
	d.t.Helper()
	r := d.ctl(stdin, args...)
	if r.code != 0 {
		d.t.Fatalf("esfctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}
