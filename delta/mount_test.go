package delta

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/internal/testenv"
)

func requireMounts(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root", "fuse", "overlay")
}

// projection serves an empty local store at a fresh mount until t ends; it
// returns the store and the mount point (roots/<root_id> shows a tree).
func projection(t *testing.T) (*local.Store, string) {
	t.Helper()
	requireMounts(t)
	dir := t.TempDir()
	st, err := local.Open(filepath.Join(dir, "cas"), nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fusefs.New(fusefs.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	srv, err := fusefs.Mount(mnt, f)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before any attempt on it, so it runs after they are gone.
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount projection: %v", err)
		}
	})
	return st, mnt
}

// projected stores a small tree in a local store and projects it; it
// returns the store and the projected root directory.
func projected(t *testing.T, files map[string]string) (*local.Store, cas.ID, string) {
	t.Helper()
	ctx := context.Background()
	st, mnt := projection(t)
	b := cas.NewBuilder(st, cas.ZeroID)
	for p, content := range files {
		info, _, err := st.Put(ctx, strings.NewReader(content))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, p, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: info.Size, ID: info.ID}, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	return st, root, filepath.Join(mnt, "roots", root.String())
}

func attempt(t *testing.T, lower string) Layout {
	t.Helper()
	dir := t.TempDir()
	l := Layout{Lower: lower, Dir: filepath.Join(dir, "delta"), Root: filepath.Join(dir, "root")}
	if err := Mount(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(l); err != nil {
			t.Errorf("remove delta: %v", err)
		}
	})
	return l
}

func TestSiblingDeltasAreIsolated(t *testing.T) {
	_, _, lower := projected(t, map[string]string{"a.txt": "base a", "d/b.txt": "base b", "gone.txt": "x"})
	one, two := attempt(t, lower), attempt(t, lower)
	if !Mounted(one.Root) || !Mounted(two.Root) {
		t.Fatal("roots not mounted")
	}
	entries, _ := os.ReadDir(one.Upper())
	if len(entries) != 0 {
		t.Fatalf("fresh upper dir holds %d entries, want none", len(entries))
	}
	// Reads of lower content go through the projection (passthrough).
	if b, err := os.ReadFile(filepath.Join(one.Root, "d/b.txt")); err != nil || string(b) != "base b" {
		t.Fatalf("read through overlay = %q, %v", b, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(one.Root, "a.txt"), []byte("one's a"), 0o644))
	must(os.WriteFile(filepath.Join(one.Root, "new.txt"), []byte("new"), 0o644))
	must(os.Remove(filepath.Join(one.Root, "gone.txt")))
	must(os.Rename(filepath.Join(one.Root, "d/b.txt"), filepath.Join(one.Root, "moved.txt")))

	if b, _ := os.ReadFile(filepath.Join(two.Root, "a.txt")); string(b) != "base a" {
		t.Errorf("sibling sees a.txt = %q", b)
	}
	for _, p := range []string{"new.txt", "moved.txt"} {
		if _, err := os.Stat(filepath.Join(two.Root, p)); !os.IsNotExist(err) {
			t.Errorf("sibling sees %s (err %v)", p, err)
		}
	}
	for _, p := range []string{"gone.txt", "d/b.txt"} {
		if _, err := os.Stat(filepath.Join(two.Root, p)); err != nil {
			t.Errorf("sibling lost %s: %v", p, err)
		}
	}
	// The lower projection itself is untouched and read-only.
	if b, _ := os.ReadFile(filepath.Join(lower, "a.txt")); string(b) != "base a" {
		t.Errorf("lower changed: %q", b)
	}
	if err := os.WriteFile(filepath.Join(lower, "a.txt"), nil, 0o644); err == nil {
		t.Error("lower projection is writable")
	}
}

// A volatile delta mounts again only once Reclaim has removed overlayfs's
// marker, and then shows everything written before the unmount.
func TestVolatileDeltaRemount(t *testing.T) {
	_, _, lower := projected(t, map[string]string{"a.txt": "base a"})
	l := attempt(t, lower)
	if err := os.WriteFile(filepath.Join(l.Root, "new.txt"), []byte("unsealed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(l.Root); err != nil {
		t.Fatal(err)
	}
	if err := Mount(l); err == nil {
		t.Fatal("a volatile delta mounted again without Reclaim; overlayfs should refuse")
	}
	if err := Reclaim(l); err != nil {
		t.Fatal(err)
	}
	if err := Mount(l); err != nil {
		t.Fatalf("mount after Reclaim: %v", err)
	}
	for p, want := range map[string]string{"new.txt": "unsealed", "a.txt": "base a"} {
		if b, err := os.ReadFile(filepath.Join(l.Root, p)); err != nil || string(b) != want {
			t.Errorf("%s after the remount: %q, %v; want %q", p, b, err, want)
		}
	}
	if id, err := BootID(); err != nil || len(id) < 32 {
		t.Errorf("BootID = %q, %v", id, err)
	}
}

// The writable root starts with the lower root's owner, mode, mtime and
// xattrs, whether Mount reads them or the caller hands them over.
func TestRootAttrs(t *testing.T) {
	_, _, lower := projected(t, map[string]string{"a.txt": "a"})
	want, err := ReadRootAttr(lower)
	if err != nil {
		t.Fatal(err)
	}
	if want.Mode&0o777 == 0 {
		t.Fatalf("lower root attrs %+v: no permission bits", want)
	}
	given := want
	given.Mode = 0o751
	given.Mtim = unix.Timespec{Sec: 1_000_000_000, Nsec: 5}
	given.Xattrs = []Xattr{{Name: "user.esf-test", Value: []byte("v")}}
	for _, tc := range []struct {
		name string
		attr *RootAttr
		want RootAttr
	}{{"read", nil, want}, {"given", &given, given}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := Layout{Lower: lower, Dir: filepath.Join(dir, "delta"), Root: filepath.Join(dir, "root"), LowerAttr: tc.attr}
			if err := Mount(l); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { Remove(l) })
			var st unix.Stat_t
			if err := unix.Stat(l.Root, &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o7777 != tc.want.Mode || st.Uid != tc.want.UID || st.Mtim != tc.want.Mtim {
				t.Errorf("root mode %o uid %d mtime %v; want %o %d %v", st.Mode&0o7777, st.Uid, st.Mtim, tc.want.Mode, tc.want.UID, tc.want.Mtim)
			}
			for _, x := range tc.want.Xattrs {
				buf := make([]byte, 64)
				n, err := unix.Lgetxattr(l.Root, x.Name, buf)
				if err != nil || string(buf[:n]) != string(x.Value) {
					t.Errorf("xattr %s: %q, %v", x.Name, buf[:n], err)
				}
			}
		})
	}
}
