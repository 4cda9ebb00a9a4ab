package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	casmem "github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/fake"
	"github.com/esf-dev/esf/journal"
	journalmem "github.com/esf-dev/esf/journal/mem"
	fakemounter "github.com/esf-dev/esf/mounter/fake"
)

// openFakes opens a fabric on in-memory content (cas/mem) and state plane
// (journal/mem), the fake executor and the fake mounter (plain
// directories), for logic tests that prove no requirement of a real
// component: they run as any user, in milliseconds. opts.Now, if set, is
// the journal's clock too; other fields are kept.
func openFakes(t *testing.T, opts Options) *Fabric {
	t.Helper()
	opts.StateDir = t.TempDir()
	opts.CAS = casmem.New()
	opts.JournalStore = journalmem.New(journalmem.Options{Now: opts.Now})
	if opts.Executor == nil {
		opts.Executor = fake.New()
	}
	if opts.Mounter == nil {
		opts.Mounter = fakemounter.New()
	}
	f, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	return f
}

// TestOpenOnGivenStores: with Options.CAS and JournalStore the fabric
// keeps content and state where it is told, and makes no store of its own
// in the state dir.
func TestOpenOnGivenStores(t *testing.T) {
	f := openFakes(t, Options{})
	g := newGroup(t, f, map[string]string{"a": "1", "d/b": "2"})
	root, err := cas.ParseID(g.Node.RootID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.opts.CAS.Has(context.Background(), root); err != nil || !ok {
		t.Fatalf("the imported root is not in the given store: %v %v", ok, err)
	}
	for _, d := range []string{"cas", "journal"} {
		if _, err := os.Stat(filepath.Join(f.StateDir(), d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in the state dir with given stores: %v", d, err)
		}
	}
	// A given store and a remote (whose cache is the local store) do not
	// go together.
	o := Options{StateDir: t.TempDir(), CAS: casmem.New(), Remote: &s3.Store{}}
	if err := o.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("CAS and Remote: %v", err)
	}
}

// TestCorruptRuntimeRecord: an attempt runtime record whose data does not
// decode is corrupt wherever it is read, never zero values: a seal does
// not compare against the node's root instead of the recorded base, a
// collection does not run without the root under the mount, recovery
// reports the attempt and leaves it alone.
func TestCorruptRuntimeRecord(t *testing.T) {
	f := openFakes(t, Options{})
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	// An active attempt with a lease, as an activation commits it, whose
	// runtime record's data is JSON (the journal checks that much) of the
	// wrong shape.
	var aid string
	err := f.journal.Update(ctx, func(tx journal.Tx) error {
		var err error
		if aid, err = f.ids.New(journal.KindAttempt); err != nil {
			return err
		}
		a := journal.Attempt{AttemptID: aid, NodeID: g.Node.NodeID, GroupID: g.Group.GroupID, Executor: ExecutorNone, State: journal.AttemptQueued}
		if err := journal.CreateAttempt(tx, a); err != nil {
			return err
		}
		if a, err = journal.GetAttempt(tx, aid); err != nil { // with its timestamps
			return err
		}
		if err := startInTx(tx, CallInfo{}, f.ids, &a, DefaultLeaseTTL.Milliseconds()); err != nil {
			return err
		}
		l := f.layout(a, g.Node.RootID, "")
		return journal.PutAttemptRuntime(tx, journal.AttemptRuntime{AttemptID: aid, Worker: f.worker,
			PrivateDelta: l.Dir, Mount: l.Root, Data: json.RawMessage(`{"base_root_id":42}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: aid}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("suspend: %v, want corrupt", err)
	}
	if _, err := f.Collect(ctx, CollectRequest{}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("collect: %v, want corrupt", err)
	}
	if err := f.Recover(ctx); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), aid) {
		t.Errorf("recover: %v, want corrupt naming %s", err, aid)
	}
	if v, err := f.attemptView(ctx, aid); err != nil || v.State != journal.AttemptActive {
		t.Errorf("after recover: %+v %v, want it left active", v.Attempt, err)
	}
	// Releasing it is still possible: it needs nothing the record holds.
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: aid}); err != nil {
		t.Errorf("release: %v", err)
	}
}

// TestContainerAttemptOnFakeExecutor: fabric's container orchestration
// (start on activation, exec with its timeout, freeze for the seal, stop
// on release) over the fake executor and mounter: no runc, no mounts.
// What the command wrote in the root is in the sealed node.
func TestContainerAttemptOnFakeExecutor(t *testing.T) {
	f := openFakes(t, Options{})
	ex := f.exec.(*fake.Executor)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	kids, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: kids.Nodes[0].NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := ex.State(ctx, a.AttemptID); err != nil || info.Status != executor.StatusRunning || info.Rootfs != a.Root {
		t.Fatalf("container of the attempt: %+v %v (root %s)", info, err, a.Root)
	}
	// The fake runs host processes with their working directory in the
	// root: relative paths are the sandbox's.
	if out, errb, code := run(t, f, a.AttemptID, "sh", "-c", "cat a; echo made > made.txt"); out != "1" || code != 0 {
		t.Fatalf("exec: %q %q %d", out, errb, code)
	}
	_, err = f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"sleep", "1000"}, TimeoutMillis: 100}, ExecStreams{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec past its timeout: %v, want deadline exceeded", err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempt.State != journal.AttemptReleased {
		t.Fatalf("after the seal: %s, want released", res.Attempt.State)
	}
	if infos, _ := ex.List(ctx, ""); len(infos) != 0 || ex.Live() != 0 {
		t.Fatalf("after the release: containers %+v, %d execs", infos, ex.Live())
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.RootID, out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "made.txt")); err != nil || string(b) != "made\n" {
		t.Fatalf("the sealed node's made.txt: %q %v", b, err)
	}
}

// TestMountAndUmountDispatch: Mount's and Umount's own logic on the fake
// mounter (that a view is read-only is TestMountReadOnlyAndRW's, on real
// mounts): a view shows the node and holds its root against a collection,
// a busy or non-empty directory is refused, Umount releases the attempt
// whose root is the directory or removes the view, and nothing there is
// not_found.
func TestMountAndUmountDispatch(t *testing.T) {
	f := openFakes(t, Options{})
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	ro, rw, busy := t.TempDir(), t.TempDir(), t.TempDir()
	if _, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: ro}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ro, "a")); err != nil || string(b) != "1" {
		t.Fatalf("view: %q %v", b, err)
	}
	if roots, err := f.mountedRoots(); err != nil || len(roots) != 1 || roots[0].String() != g.Node.RootID {
		t.Fatalf("roots the views show: %v %v, want %s", roots, err, g.Node.RootID)
	}
	m, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: rw, RW: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: ro}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("mount on a busy dir: %v", err)
	}
	os.WriteFile(filepath.Join(busy, "x"), nil, 0o644)
	if _, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: busy}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("mount on a non-empty dir: %v", err)
	}
	u, err := f.Umount(ctx, UmountRequest{Dir: rw})
	if err != nil || u.Attempt == nil || u.Attempt.AttemptID != m.Attempt.AttemptID || u.Attempt.State != journal.AttemptReleased {
		t.Fatalf("umount rw: %+v %v", u, err)
	}
	if _, err := f.Umount(ctx, UmountRequest{Dir: ro}); err != nil {
		t.Fatal(err)
	}
	if roots, err := f.mountedRoots(); err != nil || len(roots) != 0 {
		t.Fatalf("roots the views show after umount: %v %v", roots, err)
	}
	if _, err := f.Umount(ctx, UmountRequest{Dir: ro}); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("umount of nothing: %v", err)
	}
}
