// Package mountertest is the conformance suite of the mounter seam: what
// fabric relies on from any mounter.Mounter, run against the fake
// (mounter/fake, as any user, in milliseconds) and against the real one
// (FUSE, overlayfs, bind mounts; root). A Mounter that passes it can stand
// in for another in fabric's logic tests.
//
// The suite checks content, modes and which paths a seal keeps, adds or
// deletes; it never relies on what the fake documents it does not do
// (read-only views, busy roots, owners, xattrs).
package mountertest

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/esf-dev/esf/cas"
	casmem "github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/mounter"
)

// Run runs the suite as subtests of t; newMounter returns a fresh
// Mounter with nothing mounted. The suite unmounts all it mounts.
func Run(t *testing.T, newMounter func(t *testing.T) mounter.Mounter) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"MountShowsTheRoot", testMountShowsTheRoot},
		{"SealSeesChanges", testSealSeesChanges},
		{"UnmountKeepsTheDelta", testUnmountKeepsTheDelta},
		{"SiblingsAreIsolated", testSiblingsAreIsolated},
		{"Views", testViews},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &suite{m: newMounter(t), store: casmem.New(), dir: t.TempDir()}
			s.serve(t)
			tc.fn(t, s)
		})
	}
}

type suite struct {
	m     mounter.Mounter
	store *casmem.Store
	dir   string // everything of the subtest
	mnt   string // the projection
}

func (s *suite) serve(t *testing.T) {
	s.mnt = filepath.Join(s.dir, "mnt")
	if err := os.Mkdir(s.mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	srv, err := s.m.ServeProjection(s.mnt, fusefs.Options{Store: s.store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("stop the projection: %v", err)
		}
	})
}

// tree stores files (path to content; a path ending in "/" is an empty
// directory) as a root and returns its id.
func (s *suite) tree(t *testing.T, files map[string]string) cas.ID {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	writeFiles(t, src, files)
	res, err := ingest.Dir(context.Background(), s.store, src, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Root
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, c := range files {
		full := filepath.Join(dir, p)
		if p[len(p)-1] == '/' {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// layout is a fresh delta over root named name, with its root private.
func (s *suite) layout(t *testing.T, root cas.ID, name string) delta.Layout {
	t.Helper()
	lower := filepath.Join(s.mnt, "roots", root.String())
	a, err := s.m.RootAttr(lower)
	if err != nil {
		t.Fatal(err)
	}
	return delta.Layout{Lower: lower, Dir: filepath.Join(s.dir, name, "delta"), Root: filepath.Join(s.dir, name, "root"), LowerAttr: &a}
}

// mount mounts l and unmounts it when the subtest ends.
func (s *suite) mount(t *testing.T, l delta.Layout) {
	t.Helper()
	if err := s.m.Mount(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.m.Unmount(l.Root); err != nil {
			t.Errorf("unmount %s: %v", l.Root, err)
		}
	})
}

// files reads every file and directory below dir: path to content, a
// directory's path with a trailing "/".
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == ".":
		case d.IsDir():
			out[rel+"/"] = ""
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sealed seals l over base and exports the result.
func (s *suite) sealed(t *testing.T, base cas.ID, l delta.Layout) (cas.ID, map[string]string) {
	t.Helper()
	res, err := s.m.Seal(context.Background(), s.store, base, l, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := export.ToDir(context.Background(), s.store, res.Root, out, export.Options{}); err != nil {
		t.Fatal(err)
	}
	return res.Root, files(t, out)
}

func want(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

var base = map[string]string{"a": "1", "keep": "k", "d/b": "2", "d/e/f": "3", "empty/": ""}

func testMountShowsTheRoot(t *testing.T, s *suite) {
	root := s.tree(t, base)
	l := s.layout(t, root, "x")
	if s.m.Mounted(l.Root) || s.m.UpperInUse(l.Dir) {
		t.Fatal("mounted before Mount")
	}
	s.mount(t, l)
	if !s.m.Mounted(l.Root) || !s.m.UpperInUse(l.Dir) {
		t.Fatalf("after Mount: Mounted %v, UpperInUse %v", s.m.Mounted(l.Root), s.m.UpperInUse(l.Dir))
	}
	want(t, "the root", files(t, l.Root), map[string]string{"a": "1", "keep": "k", "d/": "", "d/b": "2", "d/e/": "", "d/e/f": "3", "empty/": ""})
	if fi, err := os.Stat(l.Root); err != nil || fi.Mode().Perm() != os.FileMode(l.LowerAttr.Mode&0o777) {
		t.Fatalf("the root's mode: %v %v, want %o", fi.Mode(), err, l.LowerAttr.Mode)
	}
	// An unchanged delta seals as its base.
	if id, _ := s.sealed(t, root, l); id != root {
		t.Fatalf("unchanged delta sealed as %s, want its base %s", id, root)
	}
}

func testSealSeesChanges(t *testing.T, s *suite) {
	root := s.tree(t, base)
	l := s.layout(t, root, "x")
	s.mount(t, l)
	r := l.Root
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(r, "a"), []byte("changed"), 0o644))
	must(os.Remove(filepath.Join(r, "d/b")))
	// A directory deleted and made again hides what the base had in it.
	must(os.RemoveAll(filepath.Join(r, "d/e")))
	must(os.Mkdir(filepath.Join(r, "d/e"), 0o755))
	must(os.WriteFile(filepath.Join(r, "d/e/g"), []byte("new"), 0o644))
	must(os.MkdirAll(filepath.Join(r, "n/m"), 0o755))
	must(os.WriteFile(filepath.Join(r, "n/m/z"), []byte("deep"), 0o644))
	must(os.Chmod(filepath.Join(r, "keep"), 0o600))
	must(os.Remove(filepath.Join(r, "empty")))
	_, got := s.sealed(t, root, l)
	want(t, "the sealed tree", got, map[string]string{"a": "changed", "keep": "k", "d/": "", "d/e/": "", "d/e/g": "new",
		"n/": "", "n/m/": "", "n/m/z": "deep"})
	id, _ := s.sealed(t, root, l)
	tr, err := cas.ReadTree(context.Background(), s.store, id)
	must(err)
	for _, e := range tr.Entries {
		if e.Name == "keep" && e.Mode&0o777 != 0o600 {
			t.Fatalf("keep's mode after chmod: %o, want 600", e.Mode)
		}
	}
}

func testUnmountKeepsTheDelta(t *testing.T, s *suite) {
	root := s.tree(t, base)
	l := s.layout(t, root, "x")
	if err := s.m.Mount(l); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Root, "w"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(l.Root, "a")); err != nil {
		t.Fatal(err)
	}
	idMounted, sealedMounted := s.sealed(t, root, l)
	if err := s.m.Unmount(l.Root); err != nil {
		t.Fatal(err)
	}
	if s.m.Mounted(l.Root) || s.m.UpperInUse(l.Dir) {
		t.Fatal("mounted after Unmount")
	}
	if ents, err := os.ReadDir(l.Root); err != nil || len(ents) != 0 {
		t.Fatalf("the mountpoint after Unmount: %v %v, want empty", ents, err)
	}
	if err := s.m.Unmount(l.Root); err != nil {
		t.Fatalf("unmount of nothing: %v", err)
	}
	// Sealed unmounted, the delta is the same tree.
	if id, _ := s.sealed(t, root, l); id != idMounted {
		t.Fatalf("sealed unmounted: %s, mounted: %s", id, idMounted)
	}
	if err := s.m.Reclaim(l); err != nil {
		t.Fatal(err)
	}
	s.mount(t, l)
	got := files(t, l.Root)
	if got["w"] != "kept" || got["keep"] != "k" {
		t.Fatalf("mounted again: %q", got)
	}
	if _, ok := got["a"]; ok {
		t.Fatalf("mounted again, the deleted a is back: %q", got)
	}
	// (Mounting again gives the root the lower root's attributes again:
	// only the content is compared.)
	_, again := s.sealed(t, root, l)
	want(t, "sealed after mounting again", again, sealedMounted)
}

func testSiblingsAreIsolated(t *testing.T, s *suite) {
	root := s.tree(t, base)
	x, y := s.layout(t, root, "x"), s.layout(t, root, "y")
	s.mount(t, x)
	s.mount(t, y)
	if err := os.WriteFile(filepath.Join(x.Root, "a"), []byte("x's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(y.Root, "keep")); err != nil {
		t.Fatal(err)
	}
	gx, gy := files(t, x.Root), files(t, y.Root)
	if gx["a"] != "x's" || gx["keep"] != "k" || gy["a"] != "1" {
		t.Fatalf("siblings see each other: x %q, y %q", gx, gy)
	}
	if _, ok := gy["keep"]; ok {
		t.Fatalf("y's deletion undone: %q", gy)
	}
	if b, err := os.ReadFile(filepath.Join(x.Lower, "a")); err != nil || string(b) != "1" {
		t.Fatalf("the projected root after a write: %q %v", b, err)
	}
}

func testViews(t *testing.T, s *suite) {
	root := s.tree(t, base)
	src := filepath.Join(s.mnt, "roots", root.String())
	if _, err := s.m.RootAttr(src); err != nil { // the projected root is there
		t.Fatal(err)
	}
	dir := filepath.Join(s.dir, "view")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if s.m.IsView(dir) {
		t.Fatal("a view before BindView")
	}
	if err := s.m.BindView(src, dir); err != nil {
		t.Fatal(err)
	}
	done := false
	t.Cleanup(func() {
		if !done {
			s.m.Unmount(dir)
		}
	})
	if !s.m.IsView(dir) || !s.m.Mounted(dir) {
		t.Fatal("BindView: not a view")
	}
	want(t, "the view", files(t, dir), map[string]string{"a": "1", "keep": "k", "d/": "", "d/b": "2", "d/e/": "", "d/e/f": "3", "empty/": ""})
	views, err := s.m.Views(s.mnt)
	if err != nil || !reflect.DeepEqual(views, []mounter.View{{Dir: dir, RootID: root}}) {
		t.Fatalf("Views: %+v %v, want %s of %s", views, err, dir, root)
	}
	if err := s.m.Unmount(dir); err != nil {
		t.Fatal(err)
	}
	done = true
	if s.m.IsView(dir) || s.m.Mounted(dir) {
		t.Fatal("a view after Unmount")
	}
	if views, err := s.m.Views(s.mnt); err != nil || len(views) != 0 {
		t.Fatalf("Views after Unmount: %+v %v", views, err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("the view's directory after Unmount: %v %v", ents, err)
	}
	// A Seal of nothing mounted must say so, not seal the base.
	if _, err := s.m.Seal(context.Background(), s.store, root, delta.Layout{Dir: filepath.Join(s.dir, "none"), Root: filepath.Join(s.dir, "none-root")}, ingest.Options{}); err == nil {
		t.Fatal("seal of a delta never mounted: no error")
	}
}
