package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// commitCounter counts the journal's durable commits and can fail the
// next one (before it commits).
type commitCounter struct {
	mu       sync.Mutex
	commits  int
	failNext bool
}

var errInjected = errors.New("injected commit failure")

func (c *commitCounter) hook(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch name {
	case journal.FailpointUpdateBeforeCommit:
		if c.failNext {
			c.failNext = false
			return errInjected
		}
	case journal.FailpointUpdateAfterCommit:
		c.commits++
	}
	return failpoint.Inject(name)
}

// count returns the commits since the last call.
func (c *commitCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.commits
	c.commits = 0
	return n
}

func (c *commitCounter) failNextCommit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failNext = true
}

// openCounted is openGraph with a commit counter on the journal.
func openCounted(t *testing.T) (*Fabric, *commitCounter) {
	t.Helper()
	requireMounts(t)
	return openCountedWith(t, Options{StateDir: t.TempDir()})
}

// openCountedLogic is openCounted on the fake mounter and executor.
func openCountedLogic(t *testing.T) (*Fabric, *commitCounter) {
	t.Helper()
	return openCountedWith(t, logicOptions(Options{StateDir: t.TempDir()}))
}

func openCountedWith(t *testing.T, opts Options) (*Fabric, *commitCounter) {
	t.Helper()
	c := &commitCounter{}
	opts.Journal.Failpoint = c.hook
	f, err := Open(context.Background(), testOptions(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	return f, c
}

// attemptStates lists the states an attempt's state events moved it to,
// in log order.
func attemptStates(t *testing.T, f *Fabric, attemptID string) []string {
	t.Helper()
	var out []string
	err := f.journal.View(context.Background(), func(r journal.Reader) error {
		return r.Events(0, func(ev journal.Event) error {
			if ev.AttemptID != attemptID || ev.Type != journal.EventAttemptState {
				return nil
			}
			var d struct {
				To string `json:"to"`
			}
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return err
			}
			out = append(out, d.To)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAttemptLifecycleCommitsOnce: an activation, a seal with release and
// a seal that keeps running each cost one journal commit, and the event
// log still records every state the attempt went through.
func TestAttemptLifecycleCommitsOnce(t *testing.T) {
	f, c := openCountedLogic(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"dir/a.txt": "a"})
	c.count()

	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.count(); n != 1 {
		t.Errorf("activate committed %d times, want 1", n)
	}
	if !f.mounter.Mounted(a.Root) || a.Runtime == nil {
		t.Fatalf("activated attempt not mounted: %+v", a)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "dir", "b.txt"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}

	cp, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID, KeepRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.count(); n != 1 {
		t.Errorf("suspend --keep-running committed %d times, want 1", n)
	}
	if cp.Attempt.State != journal.AttemptActive || !f.mounter.Mounted(a.Root) {
		t.Fatalf("after a checkpoint the attempt is %s (mounted %v), want active and mounted", cp.Attempt.State, f.mounter.Mounted(a.Root))
	}

	if err := os.WriteFile(filepath.Join(a.Root, "c.txt"), []byte("c"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.count(); n != 1 {
		t.Errorf("suspend committed %d times, want 1", n)
	}
	if res.Attempt.State != journal.AttemptReleased || res.Attempt.Lease != nil || res.Node.Status != journal.NodeSealed {
		t.Fatalf("after suspend: attempt %s lease %v, node %s", res.Attempt.State, res.Attempt.Lease, res.Node.Status)
	}
	if f.mounter.Mounted(a.Root) {
		t.Error("released attempt still mounted")
	}
	states := attemptStates(t, f, a.AttemptID)
	if !slices.Equal(states, []string{"active", "quiescing", "active", "quiescing", "sealed", "released"}) {
		t.Errorf("attempt state events %v, want active, quiescing, active, quiescing, sealed, released", states)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"dir/a.txt": "a", "dir/b.txt": "b", "c.txt": "c"} {
		if b, err := os.ReadFile(filepath.Join(out, p)); err != nil || string(b) != want {
			t.Errorf("sealed %s: %q, %v", p, b, err)
		}
	}

	b, err := f.Activate(ctx, ActivateRequest{NodeID: res.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	c.count()
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: b.AttemptID}); err != nil {
		t.Fatal(err)
	}
	if n := c.count(); n != 1 {
		t.Errorf("release committed %d times, want 1", n)
	}
	f.reaping.Wait()
	for _, id := range []string{a.AttemptID, b.AttemptID} {
		if _, err := os.Stat(f.attemptDir(id)); !os.IsNotExist(err) {
			t.Errorf("delta of released attempt %s left: %v", id, err)
		}
	}
}

// TestSealOfBusyRootReleasesAfterCommit: a root that cannot be unmounted
// (a process inside it) is sealed anyway; the release fails, and a replay
// with the same key finishes it once the root is free.
func TestSealOfBusyRootReleasesAfterCommit(t *testing.T) {
	f, _ := openCounted(t)
	g := newGroup(t, f, map[string]string{"a": "1"})
	ctx := withKey("busy-seal")
	a, err := f.Activate(context.Background(), ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "b"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	busy, err := os.Open(a.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Fatalf("seal of a busy root: %v, want the release to fail (failed precondition)", err)
	}
	v, err := f.attemptView(context.Background(), a.AttemptID)
	if err != nil || v.State != journal.AttemptSealed || v.ResultNodeID == "" {
		t.Fatalf("after the failed release the attempt is %s (result %q), %v; want sealed", v.State, v.ResultNodeID, err)
	}
	busy.Close()
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempt.State != journal.AttemptReleased || res.Node.NodeID != v.ResultNodeID || delta.Mounted(a.Root) {
		t.Fatalf("replay: attempt %s node %s (want %s), mounted %v", res.Attempt.State, res.Node.NodeID, v.ResultNodeID, delta.Mounted(a.Root))
	}
}

// TestFailedSealCommitMountsAgain: a seal whose commit fails after it
// unmounted the root (to release in the same batch) mounts the volatile
// delta again, whole, and a retry seals it.
func TestFailedSealCommitMountsAgain(t *testing.T) {
	f, c := openCountedLogic(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "b"), []byte("unsealed"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.failNextCommit()
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); !errors.Is(err, errInjected) {
		t.Fatalf("suspend with a failing commit: %v", err)
	}
	v, err := f.attemptView(ctx, a.AttemptID)
	if err != nil || v.State != journal.AttemptActive || !f.mounter.Mounted(a.Root) {
		t.Fatalf("after the failed seal: %s, mounted %v, %v; want active and mounted", v.State, f.mounter.Mounted(a.Root), err)
	}
	if b, err := os.ReadFile(filepath.Join(a.Root, "b")); err != nil || string(b) != "unsealed" {
		t.Fatalf("delta after the remount: %q, %v", b, err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "b")); err != nil || string(b) != "unsealed" {
		t.Fatalf("sealed b: %q, %v", b, err)
	}
}

// TestRecoverMountsVolatileDeltaOfThisBoot: an active attempt whose mount
// went away is mounted again with its writes if the machine has not
// restarted since it was mounted, and failed if it has.
func TestRecoverMountsVolatileDeltaOfThisBoot(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	same, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []AttemptView{same, other} {
		if err := os.WriteFile(filepath.Join(a.Root, "w"), []byte(a.AttemptID), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := delta.Unmount(a.Root); err != nil {
			t.Fatal(err)
		}
	}
	// other was mounted, as far as its record says, in another boot.
	rt := *other.Runtime
	d := rtData{}
	if err := json.Unmarshal(rt.Data, &d); err != nil || d.BootID == "" {
		t.Fatalf("runtime data %s: boot id %q, %v", rt.Data, d.BootID, err)
	}
	d.BootID = "00000000-0000-0000-0000-000000000000"
	rt.Data = d.json()
	if err := f.journal.Update(ctx, func(tx journal.Tx) error { return journal.PutAttemptRuntime(tx, rt) }); err != nil {
		t.Fatal(err)
	}
	if err := f.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := f.attemptView(ctx, same.AttemptID)
	if err != nil || v.State != journal.AttemptActive || !delta.Mounted(same.Root) {
		t.Fatalf("attempt of this boot after Recover: %s, mounted %v, %v", v.State, delta.Mounted(same.Root), err)
	}
	if b, err := os.ReadFile(filepath.Join(same.Root, "w")); err != nil || string(b) != same.AttemptID {
		t.Fatalf("its delta: %q, %v", b, err)
	}
	v, err = f.attemptView(ctx, other.AttemptID)
	if err != nil || v.State != journal.AttemptFailed || !strings.Contains(v.Error, "delta lost") || delta.Mounted(other.Root) {
		t.Fatalf("attempt of another boot after Recover: %s (%q), mounted %v, %v; want failed, delta lost", v.State, v.Error, delta.Mounted(other.Root), err)
	}
}

// TestEarlyMountUndone: the root an activation mounts while its commit
// flushes is unmounted and deleted when the commit fails, and a replayed
// activation keeps only the first attempt's mount.
func TestEarlyMountUndone(t *testing.T) {
	f, c := openCountedLogic(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	c.failNextCommit()
	if _, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID}); !errors.Is(err, errInjected) {
		t.Fatalf("activate with a failing commit: %v", err)
	}
	key := withKey("replayed-activate")
	first, err := f.Activate(key, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.Activate(key, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil || again.AttemptID != first.AttemptID {
		t.Fatalf("replay: %s, %v; want %s", again.AttemptID, err, first.AttemptID)
	}
	f.reaping.Wait()
	ents, err := os.ReadDir(filepath.Join(f.stateDir, "attempts"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != first.AttemptID {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("attempt directories %v, want only %s", names, first.AttemptID)
	}
	if !f.mounter.Mounted(first.Root) {
		t.Fatal("the replayed attempt lost its mount")
	}
}

// TestReaperDeletesQueuedAndLateDeltas: deltas queued for deletion are gone
// once Close returns, and one deleted after Close is deleted in place (no
// send on the closed queue).
func TestReaperDeletesQueuedAndLateDeltas(t *testing.T) {
	f, err := Open(context.Background(), Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id string) string {
		t.Helper()
		dir := filepath.Join(f.attemptDir(id), "delta", "upper", "d")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		return f.attemptDir(id)
	}
	var queued []string
	for _, id := range []string{"att_q1", "att_q2", "att_q3"} {
		queued = append(queued, mk(id))
		f.deleteDelta(id)
	}
	late := mk("att_late")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range queued {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("queued delta %s left after Close: %v", dir, err)
		}
	}
	f.deleteDelta("att_late")
	if _, err := os.Stat(late); !os.IsNotExist(err) {
		t.Errorf("delta deleted after Close left: %v", err)
	}
}

// TestActivateDiskLimit: with DefaultDiskBytes a delta lives in the disk
// pool and takes writes up to its limit (the activation's, or the
// default), EDQUOT past it; a bad limit is invalid; StopAll unmounts the
// pool. Without a pool an explicit limit is unsupported.
func TestActivateDiskLimit(t *testing.T) {
	requireMounts(t)
	testenv.Require(t, "cmd:mkfs.btrfs", "cmd:btrfs")
	ctx := context.Background()
	plain, _ := openCounted(t)
	pg := newGroup(t, plain, map[string]string{"a": "1"})
	if _, err := plain.Activate(ctx, ActivateRequest{NodeID: pg.Node.NodeID, DiskBytes: 8 << 20}); !errors.Is(err, journal.ErrUnsupported) {
		t.Fatalf("--disk without a pool: %v, want unsupported", err)
	}

	f, err := Open(ctx, Options{StateDir: t.TempDir(), DefaultDiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(f.stateDir, "attempts")
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		if delta.Mounted(pool) {
			t.Errorf("disk pool %s still mounted after StopAll", pool)
		}
	})
	g := newGroup(t, f, map[string]string{"a": "1"})
	for _, bad := range []int64{-1, 1000} {
		if _, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, DiskBytes: bad}); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("disk limit %d: %v, want invalid argument", bad, err)
		}
	}
	const limit = 8 << 20
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, DiskBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	if !delta.Mounted(pool) {
		t.Fatalf("no disk pool at %s", pool)
	}
	big, err := os.Create(filepath.Join(a.Root, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	var wrote int64
	buf := make([]byte, 1<<20)
	for wrote < 4*limit {
		n, err := big.Write(buf)
		wrote += int64(n)
		if err == nil {
			err = big.Sync()
		}
		if err != nil {
			if !errors.Is(err, unix.EDQUOT) {
				t.Fatalf("write past the limit: %v, want EDQUOT", err)
			}
			break
		}
	}
	if wrote > limit {
		t.Fatalf("wrote %d bytes under a limit of %d", wrote, limit)
	}
	big.Close()
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: a.AttemptID}); err != nil {
		t.Fatal(err)
	}
}
