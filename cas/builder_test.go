package cas_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

func fileEntry(content string) cas.Entry {
	return cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: int64(len(content)), ID: cas.Sum([]byte(content))}
}

func dirEntry(mode, uid uint32) cas.Entry {
	return cas.Entry{Type: cas.TypeDir, Attr: cas.Attr{Mode: mode, UID: uid}}
}

// op is one staged change; ops replay on any builder.
type op func(ctx context.Context, b *cas.Builder) error

func put(p string, e cas.Entry) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Put(ctx, p, e, "") }
}

func putLinked(p string, e cas.Entry, key string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Put(ctx, p, e, key) }
}

func link(newPath, oldPath string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Link(ctx, newPath, oldPath) }
}

func del(p string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Delete(ctx, p) }
}

func clearDir(p string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Clear(ctx, p) }
}

// build applies ops to a builder on base and writes it.
func build(t *testing.T, st cas.Store, base cas.ID, ops ...op) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, base)
	for i, o := range ops {
		if err := o(ctx, b); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	return root
}

// flatten lists every path of root with what the tree says about it.
func flatten(t *testing.T, g cas.Getter, root cas.ID) []string {
	t.Helper()
	var out []string
	var walk func(id cas.ID, prefix string)
	walk = func(id cas.ID, prefix string) {
		tr, err := cas.ReadTree(context.Background(), g, id)
		if err != nil {
			t.Fatalf("read tree %s: %v", prefix, err)
		}
		out = append(out, fmt.Sprintf("%s/ dir mode=%o uid=%d", prefix, tr.Mode, tr.UID))
		for _, e := range tr.Entries {
			p := prefix + "/" + e.Name
			if e.Type == cas.TypeDir {
				walk(e.ID, p)
				continue
			}
			s := fmt.Sprintf("%s %s %s", p, e.Type, e.ID.Short())
			if e.LinkGroup != "" {
				s += fmt.Sprintf(" group=%s nlink=%d", e.LinkGroup, e.Nlink)
			}
			out = append(out, s)
		}
	}
	walk(root, "")
	return out
}

// sameTree fails unless got and want name the same tree, showing both.
func sameTree(t *testing.T, g cas.Getter, got, want cas.ID) {
	t.Helper()
	if got == want {
		return
	}
	t.Fatalf("root %s differs from expected %s\ngot:\n  %s\nwant:\n  %s", got.Short(), want.Short(),
		strings.Join(flatten(t, g, got), "\n  "), strings.Join(flatten(t, g, want), "\n  "))
}

// baseOps builds the base most tests start from.
var baseOps = []op{
	put("a/x", fileEntry("ax")),
	put("a/y", fileEntry("ay")),
	put("a/sub/z", fileEntry("az")),
	put("b", dirEntry(0o750, 7)),
	put("b/w", fileEntry("bw")),
	put("b/deep/er/f", fileEntry("bf")),
	put("top", fileEntry("top")),
}

func TestBuilderDeleteAndClearOfBaseDirs(t *testing.T) {
	cases := []struct {
		name    string
		changes []op
		want    []op // the final tree built from scratch
	}{
		{"DeleteSubdir", []op{del("a/sub")}, []op{
			put("a/x", fileEntry("ax")), put("a/y", fileEntry("ay")),
			put("b", dirEntry(0o750, 7)), put("b/w", fileEntry("bw")), put("b/deep/er/f", fileEntry("bf")),
			put("top", fileEntry("top")),
		}},
		{"DeleteTopDir", []op{del("b")}, []op{
			put("a/x", fileEntry("ax")), put("a/y", fileEntry("ay")), put("a/sub/z", fileEntry("az")),
			put("top", fileEntry("top")),
		}},
		{"ClearKeepsDirAttrs", []op{clearDir("b")}, []op{
			put("a/x", fileEntry("ax")), put("a/y", fileEntry("ay")), put("a/sub/z", fileEntry("az")),
			put("b", dirEntry(0o750, 7)),
			put("top", fileEntry("top")),
		}},
		{"ClearThenRefill", []op{clearDir("a"), put("a/new", fileEntry("new"))}, []op{
			put("a/new", fileEntry("new")),
			put("b", dirEntry(0o750, 7)), put("b/w", fileEntry("bw")), put("b/deep/er/f", fileEntry("bf")),
			put("top", fileEntry("top")),
		}},
		{"DeleteThenRecreateEmpty", []op{del("a"), put("a", dirEntry(0o700, 0))}, []op{
			put("a", dirEntry(0o700, 0)),
			put("b", dirEntry(0o750, 7)), put("b/w", fileEntry("bw")), put("b/deep/er/f", fileEntry("bf")),
			put("top", fileEntry("top")),
		}},
		{"ClearRoot", []op{clearDir("")}, []op{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := mem.New()
			base := build(t, st, cas.ZeroID, baseOps...)
			got := build(t, st, base, tc.changes...)
			sameTree(t, st, got, build(t, st, cas.ZeroID, tc.want...))
		})
	}
}

// Whiteouts name paths a lower layer may never have had: no-ops that must
// not write anything.
func TestBuilderNoOpDeletesWriteNothing(t *testing.T) {
	st := mem.New()
	base := build(t, st, cas.ZeroID, baseOps...)
	before := st.Stats()
	got := build(t, st, base, del("nope"), del("a/nope/deeper"), del("top/under-a-file"),
		clearDir("nope"), clearDir("top"), clearDir("a/sub/z"), clearDir("b/deep/er/f"))
	if got != base {
		t.Fatalf("no-op changes moved the root %s -> %s", base.Short(), got.Short())
	}
	if d := st.Stats(); d.Put != before.Put {
		t.Fatalf("no-op changes wrote %d objects", d.Put-before.Put)
	}
}

func TestBuilderDirAttrChangeOnBase(t *testing.T) {
	st := mem.New()
	base := build(t, st, cas.ZeroID, baseOps...)
	got := build(t, st, base, put("a", dirEntry(0o700, 1000)), put("", dirEntry(0o711, 0)))
	want := build(t, st, cas.ZeroID, append(slices.Clone(baseOps), put("a", dirEntry(0o700, 1000)), put("", dirEntry(0o711, 0)))...)
	sameTree(t, st, got, want)

	// Lookup sees the staged attributes and the children are kept.
	ctx := context.Background()
	b := cas.NewBuilder(st, base)
	if err := b.Put(ctx, "a/sub", dirEntry(0o555, 3), ""); err != nil {
		t.Fatal(err)
	}
	e, _, ok, err := b.Lookup(ctx, "a/sub")
	if err != nil || !ok || e.Type != cas.TypeDir || e.Mode != 0o555 || e.UID != 3 {
		t.Fatalf("lookup a/sub = %+v, %v, %v", e, ok, err)
	}
	if _, _, ok, _ := b.Lookup(ctx, "a/sub/z"); !ok {
		t.Fatalf("changing a/sub's attributes lost its child z")
	}
	// A directory replacing a file starts empty; a file replacing a
	// directory drops the subtree.
	got = build(t, st, base, put("top", dirEntry(0o755, 0)), put("a", fileEntry("now a file")))
	want = build(t, st, cas.ZeroID,
		put("a", fileEntry("now a file")),
		put("b", dirEntry(0o750, 7)), put("b/w", fileEntry("bw")), put("b/deep/er/f", fileEntry("bf")),
		put("top", dirEntry(0o755, 0)))
	sameTree(t, st, got, want)
}

func TestBuilderHardLinksAcrossDirectories(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	root := build(t, st, cas.ZeroID,
		putLinked("y/g", fileEntry("shared"), "ino:1"),
		putLinked("x/f", fileEntry("shared"), "ino:1"),
		putLinked("z/deep/h", fileEntry("shared"), "ino:1"),
		putLinked("single", fileEntry("one"), "ino:2"),
		put("p/q", fileEntry("q")),
		link("r/s", "p/q"), // Link gives an unkeyed entry a group
	)
	want := []string{
		"/ dir mode=755 uid=0",
		"/p/ dir mode=755 uid=0",
		"/p/q file " + cas.Sum([]byte("q")).Short() + " group=p/q nlink=2",
		"/r/ dir mode=755 uid=0",
		"/r/s file " + cas.Sum([]byte("q")).Short() + " group=p/q nlink=2",
		"/single file " + cas.Sum([]byte("one")).Short(),
		"/x/ dir mode=755 uid=0",
		"/x/f file " + cas.Sum([]byte("shared")).Short() + " group=x/f nlink=3",
		"/y/ dir mode=755 uid=0",
		"/y/g file " + cas.Sum([]byte("shared")).Short() + " group=x/f nlink=3",
		"/z/ dir mode=755 uid=0",
		"/z/deep/ dir mode=755 uid=0",
		"/z/deep/h file " + cas.Sum([]byte("shared")).Short() + " group=x/f nlink=3",
	}
	if got := flatten(t, st, root); !slices.Equal(got, want) {
		t.Fatalf("tree:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// Linking to a base entry that already has a group joins it.
	b := cas.NewBuilder(st, root)
	if err := b.Link(ctx, "a-first", "z/deep/h"); err != nil {
		t.Fatal(err)
	}
	if err := b.Link(ctx, "p/dir", "x"); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Fatalf("link to a directory: err = %v", err)
	}
	if err := b.Link(ctx, "p/nothing", "no/such"); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Fatalf("link to a missing path: err = %v", err)
	}
	root2, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := cas.ReadTree(ctx, st, root2)
	e, _ := tr.Lookup("a-first")
	if e.LinkGroup != "a-first" || e.Nlink != 4 {
		t.Fatalf("a-first: group %q nlink %d, want a-first/4", e.LinkGroup, e.Nlink)
	}
	for _, p := range []string{"/x/f", "/y/g", "/z/deep/h"} {
		if !slices.ContainsFunc(flatten(t, st, root2), func(s string) bool {
			return strings.HasPrefix(s, p+" ") && strings.HasSuffix(s, "group=a-first nlink=4")
		}) {
			t.Fatalf("%s was not renamed into group a-first/4:\n  %s", p, strings.Join(flatten(t, st, root2), "\n  "))
		}
	}
}

// linkedBase has one group of three members in three directories; its first
// member is a/f.
var linkedBase = []op{
	putLinked("a/f", fileEntry("L"), "ino"),
	putLinked("b/g", fileEntry("L"), "ino"),
	putLinked("c/h", fileEntry("L"), "ino"),
	put("a/other", fileEntry("o")),
}

func TestBuilderLinkGroupRenamedWhenFirstMemberGoes(t *testing.T) {
	// The same group with its first member one level deeper, in a
	// directory that a Clear of a/ does not load.
	deepBase := []op{
		putLinked("a/d/f", fileEntry("L"), "ino"),
		putLinked("b/g", fileEntry("L"), "ino"),
		putLinked("c/h", fileEntry("L"), "ino"),
		put("a/other", fileEntry("o")),
	}
	cases := []struct {
		name    string
		base    []op // linkedBase if nil
		changes []op
		want    []op
	}{
		{name: "DeleteFirstFile", changes: []op{del("a/f")}, want: []op{
			put("a/other", fileEntry("o")),
			putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
		}},
		{name: "ReplaceFirstFile", changes: []op{put("a/f", fileEntry("new"))}, want: []op{
			put("a/f", fileEntry("new")), put("a/other", fileEntry("o")),
			putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
		}},
		{name: "DeleteDownToOne", changes: []op{del("a/f"), del("c/h")}, want: []op{
			put("a/other", fileEntry("o")), put("b/g", fileEntry("L")), put("c", dirEntry(0o755, 0)),
		}},
		{name: "NewFirstMember", changes: []op{link("0first", "c/h")}, want: []op{
			putLinked("0first", fileEntry("L"), "k"),
			putLinked("a/f", fileEntry("L"), "k"), putLinked("b/g", fileEntry("L"), "k"),
			putLinked("c/h", fileEntry("L"), "k"), put("a/other", fileEntry("o")),
		}},
		{name: "DeleteUnloadedDirHoldingFirst",
			changes: []op{del("a")}, want: []op{
				putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
			}},
		{name: "ClearDirHoldingFirst", changes: []op{clearDir("a")}, want: []op{
			put("a", dirEntry(0o755, 0)),
			putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
		}},
		{name: "ClearDirHoldingFirstDeeper", base: deepBase,
			changes: []op{clearDir("a")}, want: []op{
				put("a", dirEntry(0o755, 0)),
				putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
			}},
		{name: "FileReplacesDirHoldingFirst",
			changes: []op{put("a", fileEntry("a"))}, want: []op{
				put("a", fileEntry("a")),
				putLinked("b/g", fileEntry("L"), "k"), putLinked("c/h", fileEntry("L"), "k"),
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := mem.New()
			baseOps := linkedBase
			if tc.base != nil {
				baseOps = tc.base
			}
			base := build(t, st, cas.ZeroID, baseOps...)
			got := build(t, st, base, tc.changes...)
			sameTree(t, st, got, build(t, st, cas.ZeroID, tc.want...))
		})
	}
}

func TestBuilderWriteIsIdempotent(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	b := cas.NewBuilder(st, cas.ZeroID)
	for _, o := range append(slices.Clone(baseOps), linkedBase...) {
		if err := o(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	first, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	before := st.Stats()
	second, err := b.Write(ctx, st)
	if err != nil || second != first {
		t.Fatalf("second write = %s, %v; want %s", second.Short(), err, first.Short())
	}
	if d := st.Stats(); d.Put != before.Put || d.Get != before.Get {
		t.Fatalf("second write with no changes did %d puts and %d gets", d.Put-before.Put, d.Get-before.Get)
	}
	// Staging what is already there rewrites nothing new.
	for _, o := range []op{put("a/x", fileEntry("ax")), put("b", dirEntry(0o750, 7))} {
		if err := o(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	third, err := b.Write(ctx, st)
	if err != nil || third != first {
		t.Fatalf("write after restaging identical entries = %s, %v; want %s", third.Short(), err, first.Short())
	}
	if d := st.Stats(); d.Created != before.Created {
		t.Fatalf("restaging identical entries created %d objects", d.Created-before.Created)
	}
	// A builder on that root with no changes returns it without a write.
	before = st.Stats()
	if got := build(t, st, first); got != first || st.Stats().Put != before.Put {
		t.Fatalf("empty builder on base wrote %d objects, root %s", st.Stats().Put-before.Put, got.Short())
	}
}

func TestBuilderLoadsOnlyTouchedTrees(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	base := build(t, st, cas.ZeroID, baseOps...)
	rt, err := cas.ReadTree(ctx, st, base)
	if err != nil {
		t.Fatal(err)
	}
	ea, _ := rt.Lookup("a")
	eb, _ := rt.Lookup("b")
	bt, err := cas.ReadTree(ctx, st, eb.ID)
	if err != nil {
		t.Fatal(err)
	}
	deep, _ := bt.Lookup("deep")
	st.ResetStats()

	b := cas.NewBuilder(st, base)
	if st.Stats().Get != 0 {
		t.Fatalf("NewBuilder read %d objects", st.Stats().Get)
	}
	if err := b.Put(ctx, "a/new", fileEntry("n"), ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "a/y"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(ctx, st); err != nil {
		t.Fatal(err)
	}
	if st.Gets(base) != 1 || st.Gets(ea.ID) != 1 {
		t.Fatalf("root read %d times, a read %d times; want once each", st.Gets(base), st.Gets(ea.ID))
	}
	for name, id := range map[string]cas.ID{"b": eb.ID, "b/deep": deep.ID} {
		if n := st.Gets(id); n != 0 {
			t.Fatalf("a change under a/ read tree %s %d times", name, n)
		}
	}
	if got := st.Stats().Get; got != 2 {
		t.Fatalf("change under a/ read %d objects, want 2 (root and a)", got)
	}
	// No blob is ever read: trees name blobs, the builder never opens them.
	if st.Gets(cas.Sum([]byte("ax"))) != 0 {
		t.Fatalf("builder read a blob")
	}
}

// B2: a key Link invents for an unkeyed target can be handed out twice.
func TestBuilderLinkKeysAreNotReused(t *testing.T) {
	st := mem.New()
	got := build(t, st, cas.ZeroID,
		put("top", fileEntry("old inode")),
		link("b/hard", "top"),
		put("top", fileEntry("new inode")), // a later tar member replaces top
		link("c", "top"),
	)
	want := build(t, st, cas.ZeroID,
		put("b/hard", fileEntry("old inode")),
		putLinked("top", fileEntry("new inode"), "n"),
		putLinked("c", fileEntry("new inode"), "n"),
	)
	sameTree(t, st, got, want)
}

// B3: Put validates the entry only after creating its parent directories.
func TestBuilderRejectedPutStagesNothing(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	base := build(t, st, cas.ZeroID, baseOps...)
	b := cas.NewBuilder(st, base)
	bad := cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}} // no content id
	if err := b.Put(ctx, "new/dir/f", bad, ""); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Fatalf("put of a file without id: err = %v", err)
	}
	if _, _, ok, _ := b.Lookup(ctx, "new"); ok {
		t.Fatalf("rejected put left directory new/ staged")
	}
	if root, err := b.Write(ctx, st); err != nil || root != base {
		t.Fatalf("write after a rejected put = %s, %v; want the base %s", root.Short(), err, base.Short())
	}
}

// B5: directory attributes are not validated when staged, so a bad mode
// surfaces only at Write, without its path, and poisons the builder.
func TestBuilderRejectsBadDirAttrAtPut(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	for _, p := range []string{"", "d"} {
		b := cas.NewBuilder(st, cas.ZeroID)
		// S_IFDIR|0755, as an importer that forgot to mask st_mode would pass.
		if err := b.Put(ctx, p, dirEntry(0o40755, 0), ""); !errors.Is(err, cas.ErrInvalidArgument) {
			t.Fatalf("put %q with mode 040755: err = %v, want ErrInvalidArgument", p, err)
		}
		if _, err := b.Write(ctx, st); err != nil {
			t.Fatalf("write after a rejected put of %q: %v", p, err)
		}
	}
}

// TestBuilderStreamsHugeTree: a directory whose tree is over the size the
// Builder holds in memory is streamed into the store, and its id is the
// id of the same tree encoded whole.
func TestBuilderStreamsHugeTree(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	const n = 120_000
	b := cas.NewBuilder(st, cas.ZeroID)
	want := &cas.Tree{Attr: cas.Attr{Mode: 0o755}}
	for i := range n {
		// Out of order, as an import's workers deliver them.
		j := (i * 7919) % n
		name := fmt.Sprintf("f%06d", j)
		if err := b.Put(ctx, name, fileEntry(name), ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Put(ctx, "f000500x/sub", fileEntry("sub"), ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	sub := &cas.Tree{Attr: cas.ImplicitDirAttr, Entries: []cas.Entry{fileEntry("sub")}}
	sub.Entries[0].Name = "sub"
	_, subID, err := cas.TreeID(sub)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("f%06d", i)
		e := fileEntry(name)
		e.Name = name
		want.Entries = append(want.Entries, e)
		if i == 500 {
			want.Entries = append(want.Entries, cas.Entry{Name: "f000500x", Type: cas.TypeDir, ID: subID})
		}
	}
	raw, id, err := cas.TreeID(want)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < 4<<20 {
		t.Fatalf("tree of %d bytes does not exercise streaming", len(raw))
	}
	if root != id {
		t.Fatalf("streamed root %s, want %s", root, id)
	}
	if _, err := cas.ReadTreeView(ctx, st, root); err != nil {
		t.Fatal(err)
	}
}
