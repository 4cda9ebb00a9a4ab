package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

// TestGCReclaimsExactlyTheUnreachable: pruning a branch makes exactly the
// content only it referenced unreachable; GC deletes those bytes and
// nothing reachable (fsck clean, every live node exports).
func TestGCReclaimsExactlyTheUnreachable(t *testing.T) {
	f := openLogic(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"base": "shared"})
	keep := branch(t, f, g.Node.NodeID, func(r string) { write(t, filepath.Join(r, "kept"), "keep me") })
	junk := strings.Repeat("only the pruned branch has this ", 1000)
	gone := branch(t, f, g.Node.NodeID, func(r string) { write(t, filepath.Join(r, "junk"), junk) })

	dry, err := f.Collect(ctx, CollectRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Deleted != 0 {
		t.Fatalf("before prune, gc would delete %d objects", dry.Deleted)
	}
	if _, err := f.Prune(ctx, PruneRequest{NodeID: gone.NodeID}); err != nil {
		t.Fatal(err)
	}
	// Unreachable now: the pruned root's tree and the junk blob (the
	// shared blob and the base tree stay reachable).
	goneRoot, _ := cas.ParseID(gone.RootID)
	junkID := cas.Sum([]byte(junk))
	goneTree, _ := cas.ReadAll(ctx, f.store, goneRoot)
	want := int64(len(junk) + len(goneTree))
	before, _ := f.Status(ctx)
	rep, err := f.Collect(ctx, CollectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted != 2 || rep.BytesReclaimed != want {
		t.Fatalf("gc deleted %d objects, %d bytes; want 2, %d", rep.Deleted, rep.BytesReclaimed, want)
	}
	for _, id := range []cas.ID{goneRoot, junkID} {
		if ok, _ := f.store.Has(ctx, id); ok {
			t.Errorf("unreachable %s survived", id.Short())
		}
	}
	after, _ := f.Status(ctx)
	if before.Objects-after.Objects != 2 {
		t.Errorf("tally moved by %d, want 2", before.Objects-after.Objects)
	}
	fsck, err := f.Fsck(ctx)
	if err != nil || len(fsck.Bad) != 0 {
		t.Fatalf("fsck after gc: %+v, %v", fsck, err)
	}
	out := filepath.Join(t.TempDir(), "keep")
	if _, _, err := f.ExportDir(ctx, keep.NodeID, out); err != nil {
		t.Fatalf("export of a live node after gc: %v", err)
	}
}

// TestFR06_GCNeverLosesALeasedRoot: concurrent prune, gc and activate
// (with seals writing new content) never lose a leased root; every leased
// node's export verifies afterwards.
func TestFR06_GCNeverLosesALeasedRoot(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"a": "1", "d/b": "2"})
	var mu sync.Mutex
	var leased []AttemptView
	errc := make(chan error, 3)
	var wg sync.WaitGroup
	const rounds = 12
	wg.Go(func() { // activate + write + seal + activate the child (leased)
		for i := range rounds {
			kid, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID})
			if err != nil {
				errc <- err
				return
			}
			a, err := f.Activate(ctx, ActivateRequest{NodeID: kid.Nodes[0].NodeID})
			if err != nil {
				errc <- err
				return
			}
			os.WriteFile(filepath.Join(a.Root, "w"), []byte(fmt.Sprintf("round %d %s", i, strings.Repeat("x", i*100))), 0o644)
			s, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
			if err != nil {
				errc <- err
				return
			}
			b, err := f.Activate(ctx, ActivateRequest{NodeID: s.Node.NodeID})
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			leased = append(leased, b)
			mu.Unlock()
		}
	})
	wg.Go(func() { // prune what is not leased
		for range rounds {
			kid, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID})
			if err != nil {
				errc <- err
				return
			}
			if _, err := f.Prune(ctx, PruneRequest{NodeID: kid.Nodes[0].NodeID}); err != nil {
				errc <- err
				return
			}
		}
	})
	wg.Go(func() { // collect throughout
		for range rounds {
			if _, err := f.Collect(ctx, CollectRequest{}); err != nil && !strings.Contains(err.Error(), "busy") {
				errc <- err
				return
			}
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if _, err := f.Collect(ctx, CollectRequest{}); err != nil {
		t.Fatal(err)
	}
	for i, a := range leased {
		if a.State != journal.AttemptActive {
			t.Fatalf("leased attempt %d is %s", i, a.State)
		}
		out := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if _, _, err := f.ExportDir(ctx, a.NodeID, out); err != nil {
			t.Fatalf("leased node %s lost content: %v", a.NodeID, err)
		}
		if b, err := os.ReadFile(filepath.Join(a.Root, "w")); err != nil || !strings.HasPrefix(string(b), fmt.Sprintf("round %d ", i)) {
			t.Fatalf("leased root %d reads %q, %v", i, b, err)
		}
	}
	if fsck, err := f.Fsck(ctx); err != nil || len(fsck.Bad) != 0 {
		t.Fatalf("fsck: %+v %v", fsck, err)
	}
}

// TestCreateGroupChecksTheRootIsWhole: a root id from an import is not
// pinned until a group names it. CreateGroup of such a root refuses one a
// collection took (all of it, or part of it, as an interrupted sweep
// leaves it) instead of committing a node whose content is gone, and
// accepts it whole; a live node's root needs no check.
func TestCreateGroupChecksTheRootIsWhole(t *testing.T) {
	f := openTest(t, t.TempDir())
	ctx := context.Background()
	importDir := func(files map[string]string) cas.ID {
		t.Helper()
		dir := t.TempDir()
		for name, body := range files {
			write(t, filepath.Join(dir, name), body)
		}
		res, err := f.Import(ctx, ImportSource{Path: dir})
		if err != nil {
			t.Fatal(err)
		}
		return res.Root
	}

	// Collected whole: the import was garbage until a group named it.
	collected := importDir(map[string]string{"a": "collected whole"})
	if _, err := f.Collect(ctx, CollectRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: collected.String()}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("group on a collected root: %v, want not found", err)
	}

	// Collected in part: the root tree is there, a blob is not.
	partial := importDir(map[string]string{"a": "kept part", "b": "lost part"})
	if err := f.store.Delete(ctx, cas.Sum([]byte("lost part"))); err != nil {
		t.Fatal(err)
	}
	_, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: partial.String()})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("group on a root missing a blob: %v, want not found (incomplete)", err)
	}

	// Whole: accepted, and pinned from then on.
	whole := importDir(map[string]string{"a": "whole", "sub/b": "whole too"})
	g, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: whole.String()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Collect(ctx, CollectRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := verifyTrees(ctx, f.store, whole); err != nil {
		t.Fatalf("a group's root after gc: %v", err)
	}

	// From a live node: no walk needed, and fine.
	if _, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: g.Node.NodeID}); err != nil {
		t.Fatalf("group from a live node: %v", err)
	}
}
