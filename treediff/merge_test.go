package treediff_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/treediff"
)

func TestMerge(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			f := func(c string) cas.Entry { return fileE(t, st, c, 0o644) }
			fm := func(c string, mode uint32) cas.Entry { return fileE(t, st, c, mode) }
			base := build(t, st, cas.ZeroID,
				put("a/x", f("x")), put("a/y", f("y")), put("b/z", f("z")),
				put("c/deep/w", f("w")), put("c/v", f("v")), put("top", f("top")),
				put("l1", f("linked")), link("l2", "l1"))
			cases := []struct {
				name      string
				heads     [][]op
				want      []op // applied to base; nil with conflicts
				conflicts []string
			}{
				{
					name:  "disjoint changes combine",
					heads: [][]op{{put("a/x", f("x1"))}, {put("b/new", f("n")), del("top")}},
					want:  []op{put("a/x", f("x1")), put("b/new", f("n")), del("top")},
				},
				{
					name:  "same directory, different files",
					heads: [][]op{{put("a/x", f("x1"))}, {put("a/y", f("y1"))}, {put("a/q", f("q"))}},
					want:  []op{put("a/x", f("x1")), put("a/y", f("y1")), put("a/q", f("q"))},
				},
				{
					name:  "identical changes combine",
					heads: [][]op{{put("a/x", f("x1")), del("b")}, {put("a/x", f("x1")), del("b"), put("c/v", f("v1"))}},
					want:  []op{put("a/x", f("x1")), del("b"), put("c/v", f("v1"))},
				},
				{
					name:  "unchanged heads",
					heads: [][]op{{}, {put("a/x", f("x1"))}, {}},
					want:  []op{put("a/x", f("x1"))},
				},
				{
					name:      "content conflict",
					heads:     [][]op{{put("a/x", f("x1"))}, {put("a/x", f("x2"))}},
					conflicts: []string{"a/x"},
				},
				{
					name:      "modify against delete",
					heads:     [][]op{{put("top", f("t1"))}, {del("top")}},
					conflicts: []string{"top"},
				},
				{
					name:      "type conflict",
					heads:     [][]op{{put("top", symE("x"))}, {put("top", f("t1"))}},
					conflicts: []string{"top"},
				},
				{
					name:      "file added against directory added",
					heads:     [][]op{{put("new", f("n"))}, {put("new/in", f("i"))}},
					conflicts: []string{"new"},
				},
				{
					name:      "metadata conflict",
					heads:     [][]op{{put("top", fm("top", 0o755))}, {put("top", fm("top", 0o600))}},
					conflicts: []string{"top"},
				},
				{
					name:      "content against mode",
					heads:     [][]op{{put("top", f("t1"))}, {put("top", fm("top", 0o755))}},
					conflicts: []string{"top"},
				},
				{
					name:      "directory attributes",
					heads:     [][]op{{put("a", dirE(0o700))}, {put("a", dirE(0o711))}},
					conflicts: []string{"a"},
				},
				{
					name:      "directory attributes against delete",
					heads:     [][]op{{put("a", dirE(0o700))}, {del("a")}},
					conflicts: []string{"a"},
				},
				{
					name:  "directory attributes and content combine",
					heads: [][]op{{put("a", dirE(0o700))}, {put("a/x", f("x1"))}},
					want:  []op{put("a", dirE(0o700)), put("a/x", f("x1"))},
				},
				{
					name: "changes under a deleted directory",
					heads: [][]op{
						{del("c")},
						{put("c/deep/w", f("w1")), put("c/new", f("n")), put("c/newdir/q", f("q"))},
					},
					conflicts: []string{"c/deep/w", "c/new", "c/newdir"},
				},
				{
					name:      "changes under a directory replaced by a file",
					heads:     [][]op{{del("c"), put("c", f("file"))}, {put("c/v", f("v1"))}},
					conflicts: []string{"c/v"},
				},
				{
					name:  "deleting both the directory and a file in it",
					heads: [][]op{{del("c")}, {del("c/v")}},
					want:  []op{del("c")},
				},
				{
					name: "every conflict listed",
					heads: [][]op{
						{put("a/x", f("x1")), put("b/z", f("z1")), put("top", f("t1")), put("ok1", f("1"))},
						{put("a/x", f("x2")), del("b"), put("top", f("t2"))},
						{put("top", f("t3")), put("ok2", f("2"))},
					},
					conflicts: []string{"a/x", "b/z", "top"},
				},
				{
					name:  "links to one file from two heads",
					heads: [][]op{{link("l3", "l1")}, {link("m/l4", "l1")}},
					want:  []op{link("l3", "l1"), link("m/l4", "l1")},
				},
				{
					// A new member that sorts first renames the group on every
					// member, so the two heads disagree on l1 and l2's link
					// metadata: a (documented) conflict.
					name:      "links renaming the group",
					heads:     [][]op{{link("l3", "l1")}, {link("a/l4", "l1")}},
					conflicts: []string{"l1", "l2"},
				},
				{
					name:  "swapped members",
					heads: [][]op{{del("l2"), link("m1", "l1")}, {del("l2"), link("m2", "l1")}},
					want:  []op{del("l2"), link("m1", "l1"), link("m2", "l1")},
				},
				{
					name:      "link against rewrite",
					heads:     [][]op{{link("l3", "l1")}, {put("l1", f("own"))}},
					conflicts: []string{"l1", "l2"},
				},
			}
			ctx := context.Background()
			for _, tc := range cases {
				heads := make([]cas.ID, len(tc.heads))
				for i, ops := range tc.heads {
					heads[i] = build(t, st, base, ops...)
				}
				cs := &countingStore{Store: st}
				got, err := treediff.Merge(ctx, cs, base, heads)
				if tc.conflicts != nil {
					var ce *treediff.ConflictError
					if !errors.As(err, &ce) || !errors.Is(err, errdefs.ErrConflict) {
						t.Errorf("%s: err %v, want a conflict", tc.name, err)
						continue
					}
					if !slices.Equal(ce.Paths, tc.conflicts) {
						t.Errorf("%s: conflicts %q, want %q", tc.name, ce.Paths, tc.conflicts)
					}
					if errdefs.CodeOf(err) != errdefs.CodeConflict {
						t.Errorf("%s: code %s", tc.name, errdefs.CodeOf(err))
					}
					if n := cs.puts.Load(); n != 0 {
						t.Errorf("%s: a failed merge wrote %d objects", tc.name, n)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", tc.name, err)
					continue
				}
				want := build(t, st, base, tc.want...)
				if got != want {
					t.Errorf("%s: merged %s, want %s\n%s", tc.name, got.Short(), want.Short(), flatDiff(t, st, want, got))
				}
				checkLinks(t, st, got)
			}
		})
	}
}

func flatDiff(t *testing.T, g cas.Getter, want, got cas.ID) string {
	lines, _ := collect(t, g, want, got, treediff.Options{Expand: true})
	return strings.Join(lines, "\n")
}

func TestMergeNoBase(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	h1 := build(t, st, cas.ZeroID, put("a", fileE(t, st, "a", 0o644)), put("same", fileE(t, st, "s", 0o644)))
	h2 := build(t, st, cas.ZeroID, put("b", fileE(t, st, "b", 0o644)), put("same", fileE(t, st, "s", 0o644)))
	got, err := treediff.Merge(ctx, st, cas.ZeroID, []cas.ID{h1, h2})
	if err != nil {
		t.Fatal(err)
	}
	want := build(t, st, h1, put("b", fileE(t, st, "b", 0o644)))
	if got != want {
		t.Errorf("merged %s, want %s", got.Short(), want.Short())
	}
	// Two roots with different attributes conflict on the root itself.
	h3 := build(t, st, h2, put("", dirE(0o700)), put("a", fileE(t, st, "other", 0o644)))
	_, err = treediff.Merge(ctx, st, cas.ZeroID, []cas.ID{h1, h3})
	var ce *treediff.ConflictError
	if !errors.As(err, &ce) || !slices.Equal(ce.Paths, []string{"", "a"}) {
		t.Errorf("root conflict: %v", err)
	}
	if _, err := treediff.Merge(ctx, st, h1, nil); !errors.Is(err, treediff.ErrInvalidArgument) {
		t.Errorf("no heads: %v", err)
	}
	if _, err := treediff.Merge(ctx, st, h1, []cas.ID{cas.ZeroID}); !errors.Is(err, treediff.ErrInvalidArgument) {
		t.Errorf("zero head: %v", err)
	}
}

// TestMergeCost merges two heads that each changed one file of a 10k-file
// tree in different directories: the merge reads the three roots and the
// two versions of the shared directory, takes each changed subtree whole,
// and writes only the trees on the two paths above them.
func TestMergeCost(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	base, _ := deepTree(t, st, 10, 2, 100)
	h1 := build(t, st, base, put("d03/d04/f0001", fileE(t, st, "h1", 0o644)))
	h2 := build(t, st, base, put("d03/d07/f0002", fileE(t, st, "h2", 0o644)))
	h3 := build(t, st, base, put("d09/d00/f0003", fileE(t, st, "h3", 0o644)))
	cs := &countingStore{Store: st}
	got, err := treediff.Merge(ctx, cs, base, []cas.ID{h1, h2, h3})
	if err != nil {
		t.Fatal(err)
	}
	want := build(t, st, h1, put("d03/d07/f0002", fileE(t, st, "h2", 0o644)), put("d09/d00/f0003", fileE(t, st, "h3", 0o644)))
	if got != want {
		t.Fatalf("merged %s, want %s", got.Short(), want.Short())
	}
	// Merge: 4 roots, then d03 in base, h1 and h2 (h3 has base's).
	// Link check: each head's diff against base reads 2 trees per level.
	mergeReads, linkReads := int64(4+3), int64(3*2*3)
	if g := cs.gets.Load(); g != mergeReads+linkReads {
		t.Errorf("read %d trees, want %d", g, mergeReads+linkReads)
	}
	if p := cs.puts.Load(); p != 2 {
		t.Errorf("wrote %d trees, want 2 (the root and d03)", p)
	}
	t.Logf("3-head merge over 10k files: %d trees read (%d of them for the link-group check), %d written", cs.gets.Load(), linkReads, cs.puts.Load())

	// One head, or one changed head: nothing read, nothing written.
	cs = &countingStore{Store: st}
	if got, err := treediff.Merge(ctx, cs, base, []cas.ID{base, h2, base}); err != nil || got != h2 || cs.gets.Load() != 0 || cs.puts.Load() != 0 {
		t.Errorf("single change: %s %v, %d reads %d writes", got.Short(), err, cs.gets.Load(), cs.puts.Load())
	}
}

func TestMergeCancel(t *testing.T) {
	st := mem.New()
	base := build(t, st, cas.ZeroID, put("a/x", fileE(t, st, "x", 0o644)))
	h1 := build(t, st, base, put("a/y", fileE(t, st, "y", 0o644)))
	h2 := build(t, st, base, put("a/z", fileE(t, st, "z", 0o644)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := treediff.Merge(ctx, st, base, []cas.ID{h1, h2}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled merge: %v", err)
	}
}
