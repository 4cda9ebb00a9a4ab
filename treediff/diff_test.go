package treediff_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/treediff"
)

// collect runs DiffWith and renders each change as "kind path [meta]".
func collect(t *testing.T, g cas.Getter, a, b cas.ID, opts treediff.Options) ([]string, []treediff.Change) {
	t.Helper()
	var lines []string
	var cs []treediff.Change
	err := treediff.DiffWith(context.Background(), g, a, b, opts, func(c treediff.Change) error {
		s := c.Kind.String() + " " + c.Path
		if c.Meta != 0 {
			s += " [" + c.Meta.String() + "]"
		}
		lines = append(lines, s)
		cs = append(cs, c)
		return nil
	})
	if err != nil {
		t.Fatalf("diff: %v", err)
	}
	return lines, cs
}

func TestDiffKinds(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			f := func(c string, mode uint32) cas.Entry { return fileE(t, st, c, mode) }
			withX := f("x", 0o644)
			withX.Xattrs = []cas.Xattr{{Name: "user.a", Value: []byte("1")}}
			owned := f("o", 0o644)
			owned.UID = 1000
			timed := f("m", 0o644)
			timed.MtimeNs = 5
			a := build(t, st, cas.ZeroID,
				put("same", f("same", 0o644)),
				put("content", f("v1", 0o644)),
				put("mode", f("m", 0o644)),
				put("both", f("v1", 0o644)),
				put("gone", f("bye", 0o644)),
				put("f2sym", f("f", 0o644)),
				put("f2dir", f("f", 0o644)),
				put("dir2f/x", f("x", 0o644)),
				put("olddir/deep/y", f("y", 0o644)),
				put("attrdir", dirE(0o755)),
				put("attrdir/z", f("z", 0o644)),
				put("sym", symE("t1")),
				put("xattr", f("x", 0o644)),
				put("owner", f("o", 0o644)),
				put("mtime", f("m", 0o644)),
				put("linked", f("l", 0o644)),
				put("sub/deep/file", f("d1", 0o644)),
				put("untouched/u", f("u", 0o644)),
			)
			b := build(t, st, a,
				put("", dirE(0o700)),
				put("content", f("v2", 0o644)),
				put("mode", f("m", 0o755)),
				put("both", f("v2", 0o600)),
				del("gone"),
				put("f2sym", symE("f")),
				put("f2dir", dirE(0o755)),
				put("f2dir/in", f("in", 0o644)),
				del("dir2f"),
				put("dir2f", f("now a file", 0o644)),
				del("olddir"),
				put("newdir/n1", f("n1", 0o644)),
				put("newdir/sub/n2", f("n2", 0o644)),
				put("attrdir", dirE(0o711)),
				put("sym", symE("t2")),
				put("xattr", withX),
				put("owner", owned),
				put("mtime", timed),
				link("linked2", "linked"),
				put("sub/deep/file", f("d2", 0o644)),
			)
			want := []string{
				"meta_changed  [mode]",
				"meta_changed attrdir [mode]",
				"modified both [mode]",
				"modified content",
				"type_changed dir2f",
				"type_changed f2dir",
				"type_changed f2sym",
				"deleted gone",
				"meta_changed linked [link]",
				"added linked2",
				"meta_changed mode [mode]",
				"meta_changed mtime [mtime]",
				"added newdir",
				"deleted olddir",
				"meta_changed owner [owner]",
				"modified sub/deep/file",
				"modified sym",
				"meta_changed xattr [xattrs]",
			}
			got, cs := collect(t, st, a, b, treediff.Options{})
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			for _, c := range cs {
				switch {
				case c.Path == "attrdir":
					if c.Old.Type != cas.TypeDir || c.Old.Mode != 0o755 || c.New.Mode != 0o711 || c.New.ID.IsZero() {
						t.Errorf("attrdir entries not enriched: %+v %+v", c.Old, c.New)
					}
				case c.Path == "newdir":
					if c.Old != nil || c.New.Type != cas.TypeDir || c.New.Mode != 0o755 {
						t.Errorf("newdir: %+v %+v", c.Old, c.New)
					}
				case c.Path == "f2dir":
					if c.Old.Type != cas.TypeFile || c.New.Type != cas.TypeDir || c.New.Mode != cas.ImplicitDirAttr.Mode {
						t.Errorf("f2dir: %+v %+v", c.Old, c.New)
					}
				case c.Path == "linked":
					if c.Old.LinkGroup != "" || c.New.LinkGroup != "linked" || c.New.Nlink != 2 {
						t.Errorf("linked: %+v %+v", c.Old, c.New)
					}
				}
			}

			// Expanded, every path below added and deleted directories
			// follows its directory.
			got, _ = collect(t, st, a, b, treediff.Options{Expand: true})
			joined := strings.Join(got, "\n")
			for _, seq := range [][]string{
				{"type_changed dir2f"}, // dir2f/x was under the old directory
				{"type_changed f2dir", "added f2dir/in"},
				{"added newdir", "added newdir/n1", "added newdir/sub", "added newdir/sub/n2"},
				{"deleted olddir", "deleted olddir/deep", "deleted olddir/deep/y"},
			} {
				if !strings.Contains(joined, strings.Join(seq, "\n")) {
					t.Errorf("expanded diff lacks the sequence %q:\n%s", seq, joined)
				}
			}
			if !strings.Contains(joined, "type_changed dir2f\ndeleted dir2f/x") {
				t.Errorf("expanded diff lacks dir2f/x after dir2f:\n%s", joined)
			}

			// The reverse diff has the same paths with added and deleted
			// swapped.
			rev, _ := collect(t, st, b, a, treediff.Options{})
			mirror := strings.NewReplacer("added ", "deleted ", "deleted ", "added ")
			if len(rev) != len(want) {
				t.Errorf("reverse diff:\n%s", strings.Join(rev, "\n"))
			} else {
				for i := range rev {
					if mirror.Replace(rev[i]) != want[i] {
						t.Errorf("reverse change %d: %q does not mirror %q", i, rev[i], want[i])
					}
				}
			}

			// No difference, nothing read.
			cg := &countingGetter{Getter: st}
			n := 0
			if err := treediff.Diff(context.Background(), cg, b, b, func(treediff.Change) error { n++; return nil }); err != nil || n != 0 || cg.n.Load() != 0 {
				t.Errorf("diff of a tree with itself: %d changes, %d reads, err %v", n, cg.n.Load(), err)
			}
		})
	}
}

func TestDiffFromAndToNothing(t *testing.T) {
	st := mem.New()
	a := build(t, st, cas.ZeroID, put("d/f", fileE(t, st, "f", 0o644)), put("g", symE("x")))
	got, cs := collect(t, st, cas.ZeroID, a, treediff.Options{Expand: true})
	want := "added \nadded d\nadded d/f\nadded g"
	if strings.Join(got, "\n") != want {
		t.Errorf("from nothing:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if cs[0].New.ID != a || cs[0].New.Type != cas.TypeDir {
		t.Errorf("root change: %+v", cs[0].New)
	}
	got, _ = collect(t, st, a, cas.ZeroID, treediff.Options{})
	if strings.Join(got, "\n") != "deleted " {
		t.Errorf("to nothing: %q", got)
	}
}

// deepTree builds fanout^levels directories holding files each and
// returns its root and the path of one file.
func deepTree(t testing.TB, st cas.Store, fanout, levels, files int) (cas.ID, string) {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, cas.ZeroID)
	content := fileE(t, st, "shared content\n", 0o644)
	var some string
	var walk func(prefix string, level int)
	walk = func(prefix string, level int) {
		if level == levels {
			for i := range files {
				p := fmt.Sprintf("%s/f%04d", prefix, i)
				e := content
				e.MtimeNs = int64(i) // distinct entries, shared blob
				if err := b.Put(ctx, p, e, ""); err != nil {
					t.Fatal(err)
				}
				some = p
			}
			return
		}
		for i := range fanout {
			walk(fmt.Sprintf("%sd%02d", strings.TrimPrefix(prefix+"/", "/"), i), level+1)
		}
	}
	walk("", 0)
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	return root, some
}

// TestDiffCostGrowsWithDifference changes one file of a 10k-file tree and
// counts the trees Diff reads: the two versions of each directory on the
// path, nothing else.
func TestDiffCostGrowsWithDifference(t *testing.T) {
	st := mem.New()
	a, p := deepTree(t, st, 10, 2, 100) // 100 directories of 100 files
	b := build(t, st, a, put(p, fileE(t, st, "changed", 0o644)))
	cg := &countingGetter{Getter: st}
	var got []string
	err := treediff.Diff(context.Background(), cg, a, b, func(c treediff.Change) error {
		got = append(got, c.Kind.String()+" "+c.Path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "modified "+p {
		t.Errorf("changes: %q", got)
	}
	depth := strings.Count(p, "/") + 1 // directories on the path, the root included
	if reads := cg.n.Load(); reads != int64(2*depth) {
		t.Errorf("read %d trees, want %d (two per directory on the path)", reads, 2*depth)
	}
}

// TestDiffLargeTree measures a one-file change in a 100k-file tree.
func TestDiffLargeTree(t *testing.T) {
	if testing.Short() {
		t.Skip("large tree")
	}
	st := mem.New()
	start := time.Now()
	a, p := deepTree(t, st, 20, 2, 250) // 400 directories of 250 files
	built := time.Since(start)
	b := build(t, st, a, put(p, fileE(t, st, "changed", 0o644)))
	cg := &countingGetter{Getter: st}
	start = time.Now()
	n := 0
	if err := treediff.Diff(context.Background(), cg, a, b, func(treediff.Change) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if n != 1 || cg.n.Load() != 6 {
		t.Errorf("%d changes, %d trees read; want 1 and 6", n, cg.n.Load())
	}
	t.Logf("100k files: built in %v; one-change diff read %d trees in %v", built, cg.n.Load(), took)
}

func TestDiffErrors(t *testing.T) {
	st := mem.New()
	a := build(t, st, cas.ZeroID, put("d/f", fileE(t, st, "1", 0o644)), put("e/g", fileE(t, st, "2", 0o644)))
	b := build(t, st, a, put("d/f", fileE(t, st, "3", 0o644)), put("e/g", fileE(t, st, "4", 0o644)))
	ctx := context.Background()

	stop := errors.New("stop")
	n := 0
	err := treediff.Diff(ctx, st, a, b, func(treediff.Change) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("callback error: %v after %d calls", err, n)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := treediff.Diff(cctx, st, a, b, func(treediff.Change) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	// A missing subtree is ErrNotFound.
	tb, err := cas.ReadTree(ctx, st, b)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := tb.Lookup("e")
	if err := st.Delete(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	err = treediff.Diff(ctx, st, a, b, func(treediff.Change) error { return nil })
	if !errors.Is(err, treediff.ErrNotFound) {
		t.Errorf("missing tree: %v", err)
	}
	// Corrupt is ErrCorrupt.
	td, _ := tb.Lookup("d")
	if err := st.Corrupt(td.ID); err != nil {
		t.Fatal(err)
	}
	err = treediff.Diff(ctx, st, a, b, func(treediff.Change) error { return nil })
	if !errors.Is(err, treediff.ErrCorrupt) {
		t.Errorf("corrupt tree: %v", err)
	}
}

// TestApplyRoundTrip replays an expanded diff on a Builder over the old
// tree and gets the new tree's id, hard links included.
func TestApplyRoundTrip(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			f := func(c string) cas.Entry { return fileE(t, st, c, 0o644) }
			a := build(t, st, cas.ZeroID,
				put("keep", f("k")), put("l1", f("shared")), link("l2", "l1"), link("z/l3", "l1"),
				put("x/y/z", f("deep")), put("t", f("file")), put("sym", symE("a")),
				put("g1", f("g")), link("g2", "g1"))
			cases := map[string][]op{
				"edits":           {put("keep", f("k2")), del("x"), put("t", dirE(0o750)), put("t/in", f("now dir")), put("", dirE(0o700))},
				"link added":      {link("m", "l1")},
				"first unlinked":  {del("l1")},
				"member replaced": {put("l2", f("own"))},
				"swap members":    {del("g2"), link("g3", "g1")},
				"new group":       {put("n1", f("n")), link("n2", "n1"), link("a0", "n1")},
				"to nothing":      {del("keep"), del("l1"), del("l2"), del("z"), del("x"), del("t"), del("sym"), del("g1"), del("g2")},
			}
			for name, ops := range cases {
				b := build(t, st, a, ops...)
				checkLinks(t, st, b)
				for _, pair := range [][2]cas.ID{{a, b}, {b, a}, {cas.ZeroID, b}} {
					from, to := pair[0], pair[1]
					bl := cas.NewBuilder(st, from)
					_, cs := collect(t, st, from, to, treediff.Options{Expand: true})
					for _, c := range cs {
						if err := treediff.Apply(context.Background(), bl, c); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
					}
					got, err := bl.Write(context.Background(), st)
					if err != nil {
						t.Fatal(err)
					}
					if got != to {
						t.Errorf("%s: applying the diff gave %s, want %s", name, got.Short(), to.Short())
					}
				}
			}
		})
	}
}
