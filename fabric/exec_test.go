package fabric

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
)

// testUserNS is the host id range runc attempts of fabric tests run in.
var testUserNS = runc.IDRange{Start: 1 << 30, Count: 65536}

// openRunc opens a fabric with a real runc executor and a busybox group.
func openRunc(t *testing.T) (*Fabric, CreateGroupResult) {
	t.Helper()
	return openRuncWith(t, nil)
}

// openRuncWith is openRunc with mod applied to the fabric's options.
func openRuncWith(t *testing.T, mod func(*Options)) (*Fabric, CreateGroupResult) {
	t.Helper()
	requireMounts(t)
	testenv.Require(t, runctest.Needs...)
	dir := t.TempDir()
	initBin, err := runctest.BuildInit(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// As esfd runs them: in a user namespace of their own range.
	idmap, err := delta.NewIDMap(testUserNS.Start, testUserNS.Count)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idmap.Close() })
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc-state"), Init: initBin, UserNS: testUserNS})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{StateDir: filepath.Join(dir, "state"), Executor: ex, IDMap: idmap}
	if mod != nil {
		mod(&opts)
	}
	f, err := Open(context.Background(), testOptions(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A pool's idle containers go before the fabric's mounts, as in
		// esfd.
		if err := ex.ClosePool(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		if left, _ := ex.List(context.Background(), ""); len(left) != 0 {
			t.Errorf("containers left: %+v", left)
		}
	})
	rootfs := t.TempDir()
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	imp, err := f.Import(context.Background(), ImportSource{Path: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(context.Background(), CreateGroupRequest{RootID: imp.Root.String(), Source: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	return f, g
}

func run(t *testing.T, f *Fabric, attempt string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := f.Exec(context.Background(), ExecRequest{AttemptID: attempt, Args: args}, ExecStreams{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return out.String(), errb.String(), res.ExitCode
}

// TestFR09_MinimalImageRunsWithoutHelpers: a busybox-static rootfs with
// nothing of esf inside runs exec, suspend and reactivation; what the
// container wrote is in the sealed child and a new container sees it.
func TestFR09_MinimalImageRunsWithoutHelpers(t *testing.T) {
	f, g := openRunc(t)
	ctx := context.Background()
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc, Pids: 64, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := run(t, f, a.AttemptID, "sh", "-c", "echo hi > /data; echo out; echo err >&2; exit 3")
	if out != "out\n" || errs != "err\n" || code != 3 {
		t.Fatalf("exec: stdout %q stderr %q code %d", out, errs, code)
	}
	if out, _, _ := run(t, f, a.AttemptID, "cat", "/proc/self/status"); !bytes.Contains([]byte(out), []byte("NoNewPrivs:\t1")) {
		t.Errorf("container process lacks no_new_privs:\n%s", out)
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	exp := filepath.Join(t.TempDir(), "exp")
	if _, _, err := f.ExportDir(ctx, sealed.Node.NodeID, exp); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(exp, "data")); err != nil || string(b) != "hi\n" {
		t.Fatalf("sealed child: data = %q, %v", b, err)
	}
	// The executor's mountpoints are not content: the image had none.
	for _, p := range []string{".esf", "proc", "dev", "sys"} {
		if _, err := os.Lstat(filepath.Join(exp, p)); !os.IsNotExist(err) {
			t.Errorf("sealed child holds the executor's %s (%v)", p, err)
		}
	}
	b, err := f.Activate(ctx, ActivateRequest{NodeID: sealed.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, code := run(t, f, b.AttemptID, "cat", "/data"); out != "hi\n" || code != 0 {
		t.Fatalf("new container on the child: %q, %d", out, code)
	}
	// Exec on a released attempt is refused; a timeout is deadline_exceeded.
	if _, err := f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"true"}}, ExecStreams{}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("exec on a released attempt: %v", err)
	}
	if _, err := f.Exec(ctx, ExecRequest{AttemptID: b.AttemptID, Args: []string{"sleep", "10"}, TimeoutMillis: 200}, ExecStreams{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exec past its timeout: %v", err)
	}
	// keep-running: a checkpoint of the live container, which goes on.
	run(t, f, b.AttemptID, "sh", "-c", "echo two > /second")
	cp, err := f.Suspend(ctx, SuspendRequest{AttemptID: b.AttemptID, KeepRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, f, b.AttemptID, "cat", "/second"); out != "two\n" || cp.Attempt.State != journal.AttemptActive {
		t.Fatalf("after a keep-running seal: %q, attempt %s", out, cp.Attempt.State)
	}
}

// TestSuspendOfRuncAttemptWithBusyRoot: the root of a sealed runc attempt
// that something on the host still holds after its container stopped (as
// the kernel briefly does under concurrent activations) does not turn the
// committed seal into an error: the suspend succeeds, the attempt is
// released and its root detached, not left mounted.
func TestSuspendOfRuncAttemptWithBusyRoot(t *testing.T) {
	f, g := openRunc(t)
	ctx := context.Background()
	defer func(d time.Duration) { unmountRetry = d }(unmountRetry)
	unmountRetry = 50 * time.Millisecond
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, code := run(t, f, a.AttemptID, "sh", "-c", "echo kept > /data"); code != 0 {
		t.Fatalf("exec: %d", code)
	}
	busy, err := os.Open(filepath.Join(a.Root, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatalf("suspend of a runc attempt whose root is busy after the container stopped: %v", err)
	}
	if res.Node.Status != journal.NodeSealed || res.Attempt.State != journal.AttemptReleased {
		t.Fatalf("suspend: node %s, attempt %s; want sealed and released", res.Node.Status, res.Attempt.State)
	}
	if delta.Mounted(a.Root) || f.mounter.UpperInUse(filepath.Join(f.attemptDir(a.AttemptID), "delta")) {
		t.Fatalf("root %s still mounted after the release", a.Root)
	}
	exp := filepath.Join(t.TempDir(), "exp")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, exp); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(exp, "data")); err != nil || string(b) != "kept\n" {
		t.Fatalf("sealed node: data = %q, %v", b, err)
	}
}
