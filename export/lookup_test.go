package export

import (
	"context"
	"errors"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

func TestLookup(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	ctx := context.Background()
	rootTree, err := cas.ReadTree(ctx, s, root)
	if err != nil {
		t.Fatal(err)
	}
	aEntry, _ := rootTree.Lookup("a")
	aTree, err := cas.ReadTree(ctx, s, aEntry.ID)
	if err != nil {
		t.Fatal(err)
	}
	bEntry, _ := aTree.Lookup("b")

	cases := []struct {
		path  string
		typ   cas.Type
		name  string
		id    cas.ID // checked when set
		class error
	}{
		{path: "", typ: cas.TypeDir, id: root},
		{path: "/", typ: cas.TypeDir, id: root},
		{path: ".", typ: cas.TypeDir, id: root},
		{path: "./", typ: cas.TypeDir, id: root},
		{path: "a", typ: cas.TypeDir, name: "a", id: aEntry.ID},
		{path: "/a/b/", typ: cas.TypeDir, name: "b", id: bEntry.ID},
		{path: "./a/b/deep.txt", typ: cas.TypeFile, name: "deep.txt", id: cas.Sum([]byte("deep\n"))},
		{path: "links/abs", typ: cas.TypeSymlink, name: "abs"},
		{path: "dev/null", typ: cas.TypeCharDev, name: "null"},
		{path: "hard2", typ: cas.TypeFile, name: "hard2", id: cas.Sum([]byte("linked content"))},
		{path: "missing", class: cas.ErrNotFound},
		{path: "a/missing", class: cas.ErrNotFound},
		{path: "a/empty/x", class: cas.ErrNotFound},
		{path: "links/abs/x", class: cas.ErrNotFound}, // symlinks are not followed
		{path: "links/rel/x", class: cas.ErrNotFound},
		{path: "../a", class: cas.ErrInvalidArgument},
		{path: "a/../a", class: cas.ErrInvalidArgument},
		{path: "a//b", class: cas.ErrInvalidArgument},
		{path: "a/./b", class: cas.ErrInvalidArgument},
		{path: "a\x00", class: cas.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			e, err := Lookup(ctx, s, root, c.path)
			if c.class != nil {
				if !errors.Is(err, c.class) {
					t.Fatalf("err = %v, want %v", err, c.class)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Type != c.typ || e.Name != c.name {
				t.Errorf("got %s %q, want %s %q", e.Type, e.Name, c.typ, c.name)
			}
			if !c.id.IsZero() && e.ID != c.id {
				t.Errorf("id %s, want %s", e.ID.Short(), c.id.Short())
			}
		})
	}
	// The entry of a directory exports as a tree in its own right.
	if _, err := Lookup(ctx, s, cas.Sum([]byte("no root")), "a"); !errors.Is(err, cas.ErrNotFound) {
		t.Errorf("missing root: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Lookup(cctx, s, root, "a/b"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// Exporting a subtree found by Lookup keeps hard links whose group is named
// by a path outside the subtree.
func TestSubtreeExportKeepsLinks(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "a/first", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "shared"},
		{path: "b/one", linkTo: "a/first"},
		{path: "b/two", linkTo: "a/first"},
	}
	root := buildSpecs(t, s, specs)
	e, err := Lookup(context.Background(), s, root, "b")
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir() + "/out"
	st, err := ToDir(context.Background(), s, e.ID, dest, Options{PreservePrivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 1 || st.Links != 1 {
		t.Errorf("stats %+v, want one file and one link", st)
	}
	one, two := lstat(t, dest+"/one"), lstat(t, dest+"/two")
	if one.Ino != two.Ino {
		t.Error("one and two are not linked")
	}
}
