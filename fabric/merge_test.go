package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/treediff"
)

// branch forks base, applies edit in an attempt and seals it.
func branch(t *testing.T, f *Fabric, base string, edit func(root string)) journal.Node {
	t.Helper()
	ctx := context.Background()
	kid, err := f.Fork(ctx, ForkRequest{NodeID: base})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Activate(ctx, ActivateRequest{NodeID: kid.Nodes[0].NodeID})
	if err != nil {
		t.Fatal(err)
	}
	edit(a.Root)
	s, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	return s.Node
}

func write(t *testing.T, p, content string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMerge(t *testing.T) {
	f := openLogic(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"shared": "base", "a": "a", "b": "b", "c": "c"})
	left := branch(t, f, g.Node.NodeID, func(r string) {
		write(t, filepath.Join(r, "a"), "left")
		write(t, filepath.Join(r, "new-left"), "L")
		write(t, filepath.Join(r, "same"), "both")
		write(t, filepath.Join(r, "c"), "left c")
	})
	right := branch(t, f, g.Node.NodeID, func(r string) {
		write(t, filepath.Join(r, "b"), "right")
		write(t, filepath.Join(r, "dir/new-right"), "R")
		write(t, filepath.Join(r, "same"), "both")
		os.Remove(filepath.Join(r, "c"))
	})
	third := branch(t, f, g.Node.NodeID, func(r string) {
		write(t, filepath.Join(r, "a"), "third")
		write(t, filepath.Join(r, "shared"), "third")
	})

	// Disjoint and identical changes combine; the merge's export equals the
	// tree expected by hand.
	clean := branch(t, f, g.Node.NodeID, func(r string) { write(t, filepath.Join(r, "shared"), "clean") })
	m, err := f.Merge(ctx, MergeRequest{Nodes: []string{right.NodeID, clean.NodeID}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Base != g.Node.NodeID || !slices.Equal(m.Node.Parents, []string{right.NodeID, clean.NodeID}) || m.Node.Status != journal.NodeSealed {
		t.Fatalf("merge: base %s parents %v status %s", m.Base, m.Node.Parents, m.Node.Status)
	}
	out := filepath.Join(t.TempDir(), "merged")
	if _, _, err := f.ExportDir(ctx, m.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"shared": "clean", "a": "a", "b": "right", "dir/new-right": "R", "same": "both"} {
		if b, err := os.ReadFile(filepath.Join(out, p)); err != nil || string(b) != want {
			t.Errorf("merged %s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(out, "c")); !os.IsNotExist(err) {
		t.Errorf("merged c should be deleted: %v", err)
	}

	// Conflicts name every conflicting path and create no node.
	before, _ := f.Tree(ctx, g.Group.GroupID)
	_, err = f.Merge(ctx, MergeRequest{Nodes: []string{left.NodeID, right.NodeID, third.NodeID}})
	var ce *treediff.ConflictError
	if !errors.Is(err, journal.ErrConflict) || !errors.As(err, &ce) {
		t.Fatalf("conflicting merge: %v", err)
	}
	if !slices.Equal(ce.Paths, []string{"a", "c"}) {
		t.Fatalf("conflicting paths %v, want [a c]", ce.Paths)
	}
	after, _ := f.Tree(ctx, g.Group.GroupID)
	if len(after.Nodes) != len(before.Nodes) {
		t.Fatalf("a failed merge created %d nodes", len(after.Nodes)-len(before.Nodes))
	}
}

// TestFR04_MergeRejectsStaleGeneration: a merge with a stale expected
// generation is rejected and creates nothing; racing merges with promote
// advance canonical at most once.
func TestFR04_MergeRejectsStaleGeneration(t *testing.T) {
	requireMounts(t)
	f := openGraph(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"x": "0"})
	var heads []journal.Node
	for i := range 4 {
		heads = append(heads, branch(t, f, g.Node.NodeID, func(r string) {
			write(t, filepath.Join(r, "f"+string(rune('a'+i))), "v")
		}))
	}
	if _, err := f.Merge(ctx, MergeRequest{Nodes: []string{heads[0].NodeID, heads[1].NodeID}, Promote: true, ExpectedGeneration: 7}); !errors.Is(err, journal.ErrStaleGeneration) {
		t.Fatalf("stale merge: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, stale := 0, 0
	for i := range 8 {
		wg.Go(func() {
			pair := []string{heads[i%4].NodeID, heads[(i+1)%4].NodeID}
			_, err := f.Merge(ctx, MergeRequest{Nodes: pair, Promote: true, ExpectedGeneration: 1})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, journal.ErrStaleGeneration):
				stale++
			default:
				t.Errorf("merge: %v", err)
			}
		})
	}
	wg.Wait()
	ins, _ := f.Inspect(ctx, g.Group.GroupID)
	if wins != 1 || stale != 7 || ins.Group.Generation != 2 {
		t.Fatalf("%d merges promoted, %d stale, generation %d; want 1, 7, 2", wins, stale, ins.Group.Generation)
	}
}
