package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor/fake"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
	fakemounter "github.com/esf-dev/esf/mounter/fake"
)

func requireMounts(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root", "fuse", "overlay")
}

// openGraph opens a fabric whose teardown releases every attempt and stops
// the projection, so no mount outlives the test.
func openGraph(t *testing.T) *Fabric {
	t.Helper()
	return openGraphWith(t, Options{StateDir: t.TempDir()})
}

// openLogic is openGraph on the fake mounter and executor: the local
// store and pebble stay, but nothing is mounted, so it runs as any user.
// For tests of fabric's logic; the FR tests use the real components.
func openLogic(t testing.TB) *Fabric {
	t.Helper()
	return openGraphWith(t, logicOptions(Options{StateDir: t.TempDir()}))
}

// logicOptions gives o the fake mounter and executor where it has none.
func logicOptions(o Options) Options {
	if o.Mounter == nil {
		o.Mounter = fakemounter.New()
	}
	if o.Executor == nil {
		o.Executor = fake.New()
	}
	return o
}

func openGraphWith(t testing.TB, o Options) *Fabric {
	t.Helper()
	f, err := Open(context.Background(), testOptions(t, o))
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

// withKey gives ctx an idempotency key.
func withKey(key string) context.Context {
	return WithCallInfo(context.Background(), CallInfo{IdempotencyKey: key})
}

func newGroup(t testing.TB, f *Fabric, files map[string]string) CreateGroupResult {
	t.Helper()
	src := t.TempDir()
	for p, c := range files {
		full := filepath.Join(src, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.Import(context.Background(), ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(context.Background(), CreateGroupRequest{RootID: res.Root.String(), Source: src})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGraphBasics(t *testing.T) {
	f := openFakes(t, Options{})
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	if g.Group.Generation != 1 || g.Group.CanonicalNodeID != g.Node.NodeID || g.Node.Status != journal.NodeSealed {
		t.Fatalf("new group: %+v", g)
	}
	kids, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID, N: 3, LogicalState: []byte(`{"depth":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if len(kids.Nodes) != 3 || kids.Nodes[0].Status != journal.NodeDraft || kids.Nodes[0].RootID != g.Node.RootID {
		t.Fatalf("fork: %+v", kids)
	}
	// Forking a draft is a failed precondition; an unknown node is not found.
	if _, err := f.Fork(ctx, ForkRequest{NodeID: kids.Nodes[0].NodeID}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("fork of a draft: %v", err)
	}
	if _, err := f.Fork(ctx, ForkRequest{NodeID: "node_00000000000000000000000000"}); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("fork of unknown node: %v", err)
	}
	ins, err := f.Inspect(ctx, kids.Nodes[1].NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if ins.Node == nil || len(ins.Node.Ancestry) != 1 || ins.Node.Ancestry[0] != g.Node.NodeID {
		t.Fatalf("inspect: %+v", ins)
	}
	tree, err := f.Tree(ctx, g.Group.GroupID)
	if err != nil || len(tree.Nodes) != 4 {
		t.Fatalf("tree: %d nodes, %v", len(tree.Nodes), err)
	}
	// A replay of a key returns the first result; another request under
	// the same key is a conflict.
	r1, err := f.Fork(withKey("k1"), ForkRequest{NodeID: g.Node.NodeID, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := f.Fork(withKey("k1"), ForkRequest{NodeID: g.Node.NodeID, N: 2})
	if err != nil || fmt.Sprint(r1) != fmt.Sprint(r2) {
		t.Fatalf("replay differs: %v", err)
	}
	if _, err := f.Fork(withKey("k1"), ForkRequest{NodeID: g.Node.NodeID, N: 3}); !errors.Is(err, journal.ErrConflict) {
		t.Fatalf("reused key: %v", err)
	}
	// Prune a subtree; the canonical node cannot be pruned.
	if _, err := f.Prune(ctx, PruneRequest{NodeID: g.Node.NodeID}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("prune canonical: %v", err)
	}
	p, err := f.Prune(ctx, PruneRequest{NodeID: kids.Nodes[2].NodeID})
	if err != nil || len(p.Pruned) != 1 {
		t.Fatalf("prune: %+v %v", p, err)
	}
}

// TestForkLimit: a fork of MaxFork children, each with a 1 KiB logical
// state, is one call and replays byte for byte (its result, ~14 MB, is
// recorded in parts); one child more is invalid; a result over the
// journal's limit is refused whole, with nothing forked.
func TestForkLimit(t *testing.T) {
	f := openFakes(t, Options{})
	g := newGroup(t, f, map[string]string{"a": "1"})
	state := json.RawMessage(`"` + strings.Repeat("s", 1000) + `"`)
	req := ForkRequest{NodeID: g.Node.NodeID, N: MaxFork, LogicalState: state}
	r1, err := f.Fork(withKey("max"), req)
	if err != nil || len(r1.Nodes) != MaxFork {
		t.Fatalf("fork of MaxFork children with a 1 KiB state: %d nodes, %v", len(r1.Nodes), err)
	}
	r2, err := f.Fork(withKey("max"), req)
	if err != nil || !reflect.DeepEqual(r1, r2) {
		t.Fatalf("replay of the MaxFork fork differs: %v", err)
	}
	if _, err := f.Fork(context.Background(), ForkRequest{NodeID: g.Node.NodeID, N: MaxFork + 1}); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("fork of MaxFork+1: %v", err)
	}
	big := json.RawMessage(`"` + strings.Repeat("b", 4000) + `"`)
	if _, err := f.Fork(withKey("big"), ForkRequest{NodeID: g.Node.NodeID, N: MaxFork, LogicalState: big}); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("fork whose result is over the limit: %v", err)
	}
	tree, err := f.Tree(context.Background(), g.Group.GroupID)
	if err != nil || len(tree.Nodes) != 1+MaxFork {
		t.Fatalf("after the refused fork: %d nodes, %v; want %d", len(tree.Nodes), err, 1+MaxFork)
	}
}

// TestGeneratedKeysExpire: the result of a mutation whose idempotency key
// was made up (by the API or by the Fabric) replays until GeneratedKeyTTL
// has passed and ExpireIdempotencyKeys deletes it; then the key runs
// afresh. A caller's own key is kept for ever.
func TestGeneratedKeysExpire(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	f := openFakes(t, Options{Now: now})
	g := newGroup(t, f, map[string]string{"a": "1"}) // a key made by the Fabric
	req := ForkRequest{NodeID: g.Node.NodeID, N: 1}
	apiKey := WithCallInfo(context.Background(), CallInfo{IdempotencyKey: "api-made", KeyGenerated: true})
	first, err := f.Fork(apiKey, req)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := f.Fork(withKey("mine"), req)
	if err != nil {
		t.Fatal(err)
	}
	expire := func() int {
		t.Helper()
		n, err := f.ExpireIdempotencyKeys(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	clock.Add(int64(DefaultGeneratedKeyTTL - time.Second))
	if n := expire(); n != 0 {
		t.Fatalf("%d keys expired before the ttl", n)
	}
	if again, err := f.Fork(apiKey, req); err != nil || again.Nodes[0].NodeID != first.Nodes[0].NodeID {
		t.Fatalf("replay within the ttl forked again: %v", err)
	}
	clock.Add(int64(time.Second))
	if n := expire(); n != 2 {
		t.Fatalf("%d keys expired at the ttl, want 2 (create group, api-made)", n)
	}
	if again, err := f.Fork(apiKey, req); err != nil || again.Nodes[0].NodeID == first.Nodes[0].NodeID {
		t.Fatalf("an expired made-up key replayed: %v", err)
	}
	clock.Add(int64(100 * DefaultGeneratedKeyTTL))
	if n := expire(); n != 1 {
		t.Fatalf("%d keys expired, want the api-made one recorded again", n)
	}
	if again, err := f.Fork(withKey("mine"), req); err != nil || again.Nodes[0].NodeID != mine.Nodes[0].NodeID {
		t.Fatalf("a caller's key did not replay after 100 ttls: %v", err)
	}
}

// TestFR01_ForkCopiesNoPayload: forking 1000 children of a node writes no
// content objects, and activating one adds only an empty upper directory.
func TestFR01_ForkCopiesNoPayload(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"big": string(make([]byte, 1<<20)), "d/small": "x"})
	before, err := f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID, N: 1000})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := f.Status(ctx)
	if after.Objects != before.Objects || after.Bytes != before.Bytes {
		t.Fatalf("fork of 1000 wrote %d objects, %d bytes", after.Objects-before.Objects, after.Bytes-before.Bytes)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: kids.Nodes[999].NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.Root, "big")); err != nil || len(b) != 1<<20 {
		t.Fatalf("read through attempt root: %d bytes, %v", len(b), err)
	}
	ents, err := os.ReadDir(filepath.Join(a.Runtime.PrivateDelta, "upper"))
	if err != nil || len(ents) != 0 {
		t.Fatalf("upper dir after activate+read: %d entries, %v", len(ents), err)
	}
	final, _ := f.Status(ctx)
	if final.Objects != before.Objects {
		t.Fatalf("activate wrote %d objects", final.Objects-before.Objects)
	}
}

// TestFR02_SiblingAttemptsIsolated: writes, deletes and renames in one
// attempt are invisible in its sibling, before and after the first one's
// seal; a new attempt on the sealed child sees them.
func TestFR02_SiblingAttemptsIsolated(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"keep": "base", "gone": "base", "d/mv": "base"})
	one, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	two, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(one.Root, "keep"), []byte("one"), 0o644))
	must(os.WriteFile(filepath.Join(one.Root, "new"), []byte("one"), 0o644))
	must(os.Remove(filepath.Join(one.Root, "gone")))
	must(os.Rename(filepath.Join(one.Root, "d/mv"), filepath.Join(one.Root, "moved")))
	must(os.WriteFile(filepath.Join(two.Root, "keep"), []byte("two"), 0o644))

	checkTwo := func(when string) {
		t.Helper()
		if b, _ := os.ReadFile(filepath.Join(two.Root, "keep")); string(b) != "two" {
			t.Errorf("%s: sibling reads keep = %q", when, b)
		}
		for _, p := range []string{"new", "moved"} {
			if _, err := os.Lstat(filepath.Join(two.Root, p)); !os.IsNotExist(err) {
				t.Errorf("%s: sibling sees %s", when, p)
			}
		}
		for _, p := range []string{"gone", "d/mv"} {
			if _, err := os.Lstat(filepath.Join(two.Root, p)); err != nil {
				t.Errorf("%s: sibling lost %s: %v", when, p, err)
			}
		}
	}
	checkTwo("before seal")
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: one.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if sealed.Attempt.State != journal.AttemptReleased || sealed.Node.Status != journal.NodeSealed {
		t.Fatalf("after suspend: attempt %s node %s", sealed.Attempt.State, sealed.Node.Status)
	}
	checkTwo("after seal")
	three, err := f.Activate(ctx, ActivateRequest{NodeID: sealed.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(three.Root, "keep")); string(b) != "one" {
		t.Errorf("attempt on sealed child reads keep = %q", b)
	}
	for p, want := range map[string]bool{"new": true, "moved": true, "gone": false, "d/mv": false} {
		_, err := os.Lstat(filepath.Join(three.Root, p))
		if (err == nil) != want {
			t.Errorf("attempt on sealed child: %s exists = %v, want %v", p, err == nil, want)
		}
	}
}

// TestSealReproducesAttemptRoot: after every kind of change, the export of
// the sealed node equals the attempt root as seen just before the seal.
func TestSealReproducesAttemptRoot(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{
		"mod": "base", "del": "x", "chmod": "same", "dir/a": "1", "dir/b": "2",
		"rmrf/x/y": "deep", "rmrf/z": "z", "ren/src": "r", "linkme": "L", "xa": "x",
	})
	kid, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: kid.Nodes[0].NodeID})
	if err != nil {
		t.Fatal(err)
	}
	r := a.Root
	steps := []func() error{
		func() error { return os.WriteFile(filepath.Join(r, "mod"), []byte("changed"), 0o644) },
		func() error { return os.Remove(filepath.Join(r, "del")) },
		func() error { return os.Chmod(filepath.Join(r, "chmod"), 0o4711) },
		func() error { return os.WriteFile(filepath.Join(r, "dir/c"), []byte("3"), 0o600) },
		func() error { return os.RemoveAll(filepath.Join(r, "rmrf")) },
		func() error { return os.MkdirAll(filepath.Join(r, "rmrf/fresh"), 0o750) },
		func() error { return os.Rename(filepath.Join(r, "ren/src"), filepath.Join(r, "renamed")) },
		func() error { return os.MkdirAll(filepath.Join(r, "newdir/sub"), 0o755) },
		func() error { return os.Rename(filepath.Join(r, "newdir"), filepath.Join(r, "newdir2")) },
		func() error {
			// A directory of the lower layer does not rename (EXDEV, see
			// package delta); mv copies it instead.
			err := os.Rename(filepath.Join(r, "dir"), filepath.Join(r, "dir-renamed"))
			if !errors.Is(err, syscall.EXDEV) {
				return fmt.Errorf("rename of a lower directory: %v, want EXDEV", err)
			}
			return nil
		},
		func() error { return os.Symlink("/etc/passwd", filepath.Join(r, "sym")) },
		func() error { return os.Symlink("mod", filepath.Join(r, "sym2")) },
		func() error { return os.Remove(filepath.Join(r, "sym2")) },
		func() error { return os.Symlink("chmod", filepath.Join(r, "sym2")) },
		// Hard links between files of the upper layer. (A link to a copied-up
		// lower file is one inode in the upper dir, and seals as one link
		// group, but overlayfs with index=off shows the two names with
		// different inode numbers, so the view cannot be compared.)
		func() error { return os.WriteFile(filepath.Join(r, "fresh"), []byte("F"), 0o644) },
		func() error { return os.Link(filepath.Join(r, "fresh"), filepath.Join(r, "dir/hard")) },
		func() error { return unix.Lsetxattr(filepath.Join(r, "xa"), "user.k", []byte("v"), 0) },
		func() error { return syscall.Mkfifo(filepath.Join(r, "fifo"), 0o640) },
		func() error { return os.Chmod(filepath.Join(r, "dir"), 0o700) },
	}
	for i, s := range steps {
		if err := s(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID, KeepRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	if sealed.Attempt.State != journal.AttemptActive || sealed.Node.NodeID != kid.Nodes[0].NodeID {
		t.Fatalf("keep-running seal of a draft: attempt %s, node %s (draft %s)", sealed.Attempt.State, sealed.Node.NodeID, kid.Nodes[0].NodeID)
	}
	out := filepath.Join(t.TempDir(), "export")
	if _, _, err := f.ExportDir(ctx, sealed.Node.RootID, out); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, r, out)
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(out, "xa"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("xattr after seal: %q, %v", buf[:n], err)
	}
	// The attempt keeps running: a second seal is a child of the first.
	if err := os.WriteFile(filepath.Join(r, "later"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	second, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Node.Parents) != 1 || second.Node.Parents[0] != sealed.Node.NodeID {
		t.Fatalf("second seal parents %v, want [%s]", second.Node.Parents, sealed.Node.NodeID)
	}
	if second.Attempt.State != journal.AttemptReleased {
		t.Fatalf("attempt after final seal: %s", second.Attempt.State)
	}
	f.reaping.Wait() // deleted off the request path
	if _, err := os.Stat(f.attemptDir(a.AttemptID)); !os.IsNotExist(err) {
		t.Fatalf("delta left after release: %v", err)
	}
}

// TestFR04_ConcurrentPromotes: of 64 promotes from the same generation
// exactly one wins; the rest are stale.
func TestFR04_ConcurrentPromotes(t *testing.T) {
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, stale := 0, 0
	for range 64 {
		wg.Go(func() {
			_, err := f.Promote(ctx, PromoteRequest{GroupID: g.Group.GroupID, NodeID: g.Node.NodeID, ExpectedGeneration: 1})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, journal.ErrStaleGeneration):
				stale++
			default:
				t.Errorf("promote: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || stale != 63 {
		t.Fatalf("%d promotes won, %d stale; want 1 and 63", wins, stale)
	}
	ins, _ := f.Inspect(ctx, g.Group.GroupID)
	if ins.Group.Generation != 2 {
		t.Fatalf("generation %d, want 2", ins.Group.Generation)
	}
}

// TestFR05_BackpropExactlyOnce: 1000 replays of one evaluate-with-backprop
// key leave visits and value as after the first; a different request with
// that key is a conflict.
func TestFR05_BackpropExactlyOnce(t *testing.T) {
	f := openGraph(t)
	g := newGroup(t, f, map[string]string{"a": "1"})
	ctx := withKey("eval-1")
	req := EvaluateRequest{Target: g.Node.NodeID, Evaluator: "tests@1.0", Reward: 0.5, Verdict: "pass", Backprop: true}
	first, err := f.Evaluate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		again, err := f.Evaluate(ctx, req)
		if err != nil || again.EvaluationID != first.EvaluationID {
			t.Fatalf("replay: %v, %s", err, again.EvaluationID)
		}
	}
	ins, _ := f.Inspect(context.Background(), g.Node.NodeID)
	if ins.Node.Visits != 1 || ins.Node.Value != 0.5 || len(ins.Node.Evaluations) != 1 {
		t.Fatalf("after 1001 deliveries: visits %d value %v evaluations %d", ins.Node.Visits, ins.Node.Value, len(ins.Node.Evaluations))
	}
	req.Reward = 1
	if _, err := f.Evaluate(ctx, req); !errors.Is(err, journal.ErrConflict) {
		t.Fatalf("different request, same key: %v", err)
	}
}

func TestMountReadOnlyAndRW(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})
	ro, rw, busy := t.TempDir(), t.TempDir(), t.TempDir()
	if _, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: ro}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ro, "a")); err != nil || string(b) != "1" {
		t.Fatalf("read-only mount: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "b"), nil, 0o644); err == nil {
		t.Fatal("read-only mount is writable")
	}
	m, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: rw, RW: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rw, "b"), []byte("2"), 0o644); err != nil {
		t.Fatalf("rw mount: %v", err)
	}
	// A busy or non-empty directory is refused with a clear error.
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
	if _, err := f.Umount(ctx, UmountRequest{Dir: ro}); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("umount of nothing: %v", err)
	}
}

// TestFR08_LiveAttemptsStayBounded: 50 activations with a limit of 4 live
// attempts never exceed 4 (sampled throughout), start first-in first-out
// as capacity frees, and all complete.
func TestFR08_LiveAttemptsStayBounded(t *testing.T) {
	requireMounts(t)
	dir := t.TempDir()
	f, err := Open(context.Background(), testOptions(t, Options{StateDir: dir, MaxLiveAttempts: 4}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1"})

	// Sample the journal's truth and the kernel's mounts while it runs.
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	maxSeen := 0
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			live, _ := f.quota.counts()
			mounts := 0
			// A read of mountinfo is not one snapshot: it comes a page at
			// a time, so a root unmounted after its page was read and the
			// next one mounted before the last page would both be counted.
			// Holding mountsMu keeps the fabric's mounts still meanwhile.
			f.mountsMu.Lock()
			b, err := os.ReadFile("/proc/self/mountinfo")
			f.mountsMu.Unlock()
			if err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(dir, "attempts")+"/") {
						mounts++
					}
				}
			}
			maxSeen = max(maxSeen, live, mounts)
		}
	})

	var ids []string
	for i := range 50 {
		a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
		if err != nil {
			t.Fatal(err)
		}
		if want := journal.AttemptActive; i < 4 && a.State != want {
			t.Fatalf("attempt %d is %s, want %s", i, a.State, want)
		}
		if i >= 4 && a.State != journal.AttemptQueued {
			t.Fatalf("attempt %d is %s, want queued", i, a.State)
		}
		ids = append(ids, a.AttemptID)
	}
	if _, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, NoQueue: true}); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("activate --no-queue at capacity: %v", err)
	}
	// Drive them: each active attempt writes and seals, which frees its
	// slot for the next queued one.
	var started []string
	deadline := time.Now().Add(2 * time.Minute)
	for done := 0; done < len(ids); {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d attempts completed", done, len(ids))
		}
		progressed := false
		for _, id := range ids {
			a, err := f.attemptView(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if a.State != journal.AttemptActive || a.Runtime == nil || !delta.Mounted(a.Root) {
				continue
			}
			started = append(started, id)
			if err := os.WriteFile(filepath.Join(a.Root, "by"), []byte(id), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: id}); err != nil {
				t.Fatal(err)
			}
			done++
			progressed = true
		}
		if !progressed {
			time.Sleep(5 * time.Millisecond) // a queued start is mounting
		}
	}
	close(stop)
	sampler.Wait()
	if maxSeen > 4 {
		t.Fatalf("saw %d live attempts, limit 4", maxSeen)
	}
	// FIFO: attempts became active in the order they were requested.
	var order []string
	err = f.journal.View(ctx, func(r journal.Reader) error {
		return r.Events(0, func(ev journal.Event) error {
			if ev.Type == journal.EventLeaseAcquired {
				order = append(order, ev.AttemptID)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(order) != fmt.Sprint(ids) {
		t.Fatalf("start order differs from request order:\n got %v\nwant %v", order, ids)
	}
	if len(started) != 50 {
		t.Fatalf("%d attempts ran", len(started))
	}
}

// TestFreshResultIsTheReplay: for the operations in freshResults, mutate
// returns fn's value instead of decoding the recorded result; that value
// must be exactly what a replay of the same key decodes.
func TestFreshResultIsTheReplay(t *testing.T) {
	f := openFakes(t, Options{})
	g := newGroup(t, f, map[string]string{"a": "1"})
	root := g.Node.NodeID
	for i, req := range []ForkRequest{
		{NodeID: root},
		{NodeID: root, N: 3, LogicalState: json.RawMessage(` { "b" : "<&>" ,
			"a": [1, 2.50, 1e3] } `)},
		{NodeID: root, LogicalState: json.RawMessage(`null`)},
	} {
		ctx := withKey(fmt.Sprintf("fresh-fork-%d", i))
		fresh, err := f.Fork(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		replay, err := f.Fork(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fresh, replay) {
			t.Errorf("fork %d: fresh result\n%#v\nreplays as\n%#v", i, fresh, replay)
		}
	}
	for i, req := range []EvaluateRequest{
		{Target: root, Evaluator: "e@1", Reward: 0.1, Verdict: "<ok>"},
		{Target: root, Evaluator: "e@1", Reward: 1.0 / 3, Verdict: "ok", Evidence: []string{}, Backprop: true},
		{Target: root, Evaluator: "e@2", Reward: -7, Terminal: true, Backprop: true},
	} {
		ctx := withKey(fmt.Sprintf("fresh-evaluate-%d", i))
		fresh, err := f.Evaluate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		replay, err := f.Evaluate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fresh, replay) {
			t.Errorf("evaluate %d: fresh result\n%#v\nreplays as\n%#v", i, fresh, replay)
		}
	}
}
