package rootfs_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/rootfs"
	"github.com/esf-dev/esf/internal/testenv"
)

// setup makes host/{outside/secret, root/...} and returns the root's path
// and the outside directory's. Inside the root, etc/secret holds "inside"
// so that an escape and a confined resolution read different bytes.
func setup(t *testing.T) (root, outside string) {
	t.Helper()
	host := t.TempDir()
	outside = filepath.Join(host, "outside")
	root = filepath.Join(host, "a", "b", "root")
	for _, d := range []string{outside, filepath.Join(root, "etc"), filepath.Join(root, outside)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret"), "SECRET")
	write(t, filepath.Join(root, "etc", "secret"), "inside")
	write(t, filepath.Join(root, outside, "secret"), "inside-mirror")
	for name, target := range map[string]string{
		"abs":      "/etc",                  // absolute: the root's /etc
		"rel":      "../../../../../../etc", // climbs past the top
		"hostdir":  outside,                 // a host path: its mirror inside
		"relhost":  "../../../" + "outside", // relative to the real outside
		"magic":    "/proc/self/root/etc",   // magic link
		"dangling": "/nonexistent",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func open(t *testing.T, dir string, o rootfs.Options) *rootfs.Root {
	t.Helper()
	r, err := rootfs.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestOpenStaysInside(t *testing.T) {
	root, outside := setup(t)
	r := open(t, root, rootfs.Options{})
	for _, tc := range []struct {
		path string
		want string // content, or "" with wantErr
		err  error
	}{
		{"/etc/secret", "inside", nil},
		{"etc/secret", "inside", nil},
		{"../../../outside/secret", "", unix.ENOENT},
		{"/../../etc/secret", "inside", nil},
		{"abs/secret", "inside", nil},
		{"rel/secret", "inside", nil},
		{outside + "/secret", "inside-mirror", nil},
		{"hostdir/secret", "inside-mirror", nil},
		{"relhost/secret", "", unix.ENOENT},
		{"magic/secret", "", unix.ENOENT},                          // the root has no /proc
		{"/proc/self/root" + outside + "/secret", "", unix.ENOENT}, // nor here
		{"dangling", "", unix.ENOENT},
	} {
		t.Run(tc.path, func(t *testing.T) {
			f, err := r.OpenFile(tc.path, unix.O_RDONLY, 0)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("OpenFile(%q) = %v, want %v", tc.path, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenFile(%q): %v", tc.path, err)
			}
			defer f.Close()
			b, _ := io.ReadAll(f)
			if string(b) != tc.want {
				t.Fatalf("OpenFile(%q) read %q, want %q", tc.path, b, tc.want)
			}
		})
	}
}

// TestMagicLinkRefused mounts nothing: the root is "/" itself, where
// /proc exists, so only RESOLVE_NO_MAGICLINKS stops /proc/self/root.
func TestMagicLinkRefused(t *testing.T) {
	r := open(t, "/", rootfs.Options{})
	if _, err := r.Stat("/proc/self/root/etc"); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("Stat(/proc/self/root/etc) = %v, want ELOOP", err)
	}
	if _, err := r.Stat("/proc/self/fd/0"); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("Stat(/proc/self/fd/0) = %v, want ELOOP", err)
	}
}

func TestNoXDev(t *testing.T) {
	testenv.Require(t, "root") // mounting a tmpfs
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	write(t, filepath.Join(mnt, "f"), "x")
	if _, err := open(t, root, rootfs.Options{}).Stat("mnt/f"); err != nil {
		t.Fatalf("without NoXDev: %v", err)
	}
	if _, err := open(t, root, rootfs.Options{NoXDev: true}).Stat("mnt/f"); !errors.Is(err, unix.EXDEV) {
		t.Fatalf("with NoXDev: %v, want EXDEV", err)
	}
}

func TestParent(t *testing.T) {
	root, _ := setup(t)
	r := open(t, root, rootfs.Options{})
	var rootSt unix.Stat_t
	if err := unix.Fstat(r.Fd(), &rootSt); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, base string
		dirIsRoot  bool
	}{
		{"/", ".", true},
		{"", ".", true},
		{"/x", "x", true},
		{"etc/secret", "secret", false},
		{"etc/", "etc", true},
		{"..", ".", true},
		{"../..", ".", true},
		{"etc/../..", ".", true},
		{"abs/secret", "secret", false},
	} {
		fd, base, err := r.Parent(tc.path)
		if err != nil {
			t.Errorf("Parent(%q): %v", tc.path, err)
			continue
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		unix.Close(fd)
		if base != tc.base || (st.Ino == rootSt.Ino && st.Dev == rootSt.Dev) != tc.dirIsRoot {
			t.Errorf("Parent(%q) = (ino %d, %q), want base %q, dir is root %v", tc.path, st.Ino, base, tc.base, tc.dirIsRoot)
		}
	}
	// The parent of a path through an escaping link is the link's
	// confined target, so an *at call on the base acts inside.
	fd, base, err := r.Parent("rel/new")
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Mkdirat(fd, base, 0o755)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "new")); err != nil {
		t.Fatalf("mkdir through rel/: %v", err)
	}
}

func TestOpenRegular(t *testing.T) {
	root, _ := setup(t)
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := open(t, root, rootfs.Options{})
	f, size, err := r.OpenRegular("abs/secret")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "inside" || size != 6 {
		t.Fatalf("read %q size %d", b, size)
	}
	// Opening the FIFO for reading would block; being refused proves the
	// type was checked first.
	for _, p := range []string{"fifo", "etc", "/"} {
		if _, _, err := r.OpenRegular(p); !errors.Is(err, rootfs.ErrNotRegular) || !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("OpenRegular(%q) = %v, want ErrNotRegular", p, err)
		}
	}
}

func TestMkdirAll(t *testing.T) {
	root, outside := setup(t)
	r := open(t, root, rootfs.Options{})
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	for _, p := range []string{"/a/b/c", "rel/made", "hostdir/made", "/a/b/c"} {
		fd, err := r.MkdirAll(p, 0o755)
		if err != nil {
			t.Fatalf("MkdirAll(%q): %v", p, err)
		}
		unix.Close(fd)
	}
	for _, p := range []string{"a", "a/b", "a/b/c", "etc/made", outside[1:] + "/made"} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, %v", p, fi, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(outside, "made")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("MkdirAll wrote outside the root: %v", err)
	}
	// relhost is dangling once confined (the root has no /outside): it
	// is not replaced by a directory, nor followed out.
	if _, err := r.MkdirAll("relhost/made", 0o755); !errors.Is(err, unix.ENOENT) {
		t.Errorf("MkdirAll through a dangling link = %v, want ENOENT", err)
	}
	if _, err := r.MkdirAll("etc/secret/x", 0o755); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("MkdirAll under a file = %v, want ENOTDIR", err)
	}
}

func TestRemoveAll(t *testing.T) {
	root, outside := setup(t)
	// A tree inside whose entries link to the outside directory: removal
	// must unlink the links, never enter them.
	tree := filepath.Join(root, "tree", "deep")
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(tree, "f"), "x")
	if err := os.Symlink(filepath.Join(root, "..", "..", "..", "outside"), filepath.Join(tree, "out")); err != nil {
		t.Fatal(err)
	}
	r := open(t, root, rootfs.Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		path string
		err  error
	}{
		{"/", unix.EINVAL},
		{"..", unix.EINVAL},
		{"missing", unix.ENOENT},
		{"hostdir", nil}, // a link to a dir: the link goes
		{"tree", nil},
		{"etc/secret", nil},
	} {
		if err := r.RemoveAll(ctx, tc.path); !errors.Is(err, tc.err) {
			t.Errorf("RemoveAll(%q) = %v, want %v", tc.path, err, tc.err)
		}
	}
	for _, p := range []string{"hostdir", "tree", "etc/secret"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "SECRET" {
		t.Fatalf("outside damaged: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, outside, "secret")); err != nil {
		t.Fatalf("mirror removed through hostdir link: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := os.MkdirAll(filepath.Join(root, "c", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveAll(cctx, "c"); !errors.Is(err, context.Canceled) {
		t.Errorf("RemoveAll with a cancelled ctx = %v", err)
	}
}

func TestFileMode(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want fs.FileMode
	}{
		{unix.S_IFREG | 0o644, 0o644},
		{unix.S_IFDIR | unix.S_ISVTX | 0o777, fs.ModeDir | fs.ModeSticky | 0o777},
		{unix.S_IFLNK | 0o777, fs.ModeSymlink | 0o777},
		{unix.S_IFCHR | 0o600, fs.ModeDevice | fs.ModeCharDevice | 0o600},
		{unix.S_IFREG | unix.S_ISUID | unix.S_ISGID | 0o755, fs.ModeSetuid | fs.ModeSetgid | 0o755},
	} {
		if got := rootfs.FileMode(tc.in); got != tc.want {
			t.Errorf("FileMode(%o) = %v, want %v", tc.in, got, tc.want)
		}
		if got, want := rootfs.UnixMode(tc.want), tc.in&^unix.S_IFMT; got != want {
			t.Errorf("UnixMode(%v) = %o, want %o", tc.want, got, want)
		}
	}
}
