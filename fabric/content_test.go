package fabric

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
)

// writeFixture builds a small tree with the kinds of entries an import must
// keep: nested dirs, an empty file, an executable, symlinks (relative,
// absolute, dangling), a hard link, a file spanning several buffers.
func writeFixture(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "a/b/c/deep.txt"), []byte("deep\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600))
	must(os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	must(os.WriteFile(filepath.Join(dir, "a/big.bin"), big, 0o644))
	must(os.Symlink("b/c/deep.txt", filepath.Join(dir, "a/rel")))
	must(os.Symlink("/etc/hostname", filepath.Join(dir, "abs")))
	must(os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(os.Link(filepath.Join(dir, "run.sh"), filepath.Join(dir, "a/run-link")))
	mt := time.Unix(1700000000, 123456789)
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return lutimes(p, mt)
	}))
}

func lutimes(p string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// compareTrees fails t unless b has the same names, types, modes, sizes,
// contents, link targets, mtimes and hard-link structure as a.
func compareTrees(t *testing.T, a, b string) {
	t.Helper()
	type node struct {
		mode   fs.FileMode
		size   int64
		mtime  int64
		target string
		data   string
		ino    uint64
	}
	scan := func(root string) map[string]node {
		out := map[string]node{}
		inos := map[uint64]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			n := node{mode: fi.Mode(), mtime: fi.ModTime().UnixNano()}
			switch {
			case fi.Mode().IsRegular():
				n.size = fi.Size()
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				n.data = string(cas.Sum(b).Short())
				st := fi.Sys().(*syscall.Stat_t)
				if first, ok := inos[st.Ino]; ok {
					n.target = "hardlink:" + first
				} else {
					inos[st.Ino] = rel
				}
			case fi.Mode()&fs.ModeSymlink != 0:
				n.target, _ = os.Readlink(p)
			}
			if rel == "." {
				n.mtime = 0 // the root's mtime is the export's business
			}
			out[rel] = n
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	na, nb := scan(a), scan(b)
	for p, x := range na {
		y, ok := nb[p]
		if !ok {
			t.Errorf("%s missing from %s", p, b)
			continue
		}
		if x != y {
			t.Errorf("%s: %+v, want %+v", p, y, x)
		}
	}
	for p := range nb {
		if _, ok := na[p]; !ok {
			t.Errorf("%s: extra in %s", p, b)
		}
	}
}

func TestImportExportRoundTrip(t *testing.T) {
	ctx := context.Background()
	f := openTest(t, t.TempDir())
	src := filepath.Join(t.TempDir(), "src")
	writeFixture(t, src)

	res, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	if res.NewObjects == 0 || res.Files == 0 {
		t.Fatalf("first import stored nothing: %+v", res)
	}
	again, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	if again.Root != res.Root || again.NewObjects != 0 {
		t.Fatalf("re-import: root %s new %d, want root %s and no new objects", again.Root, again.NewObjects, res.Root)
	}

	// A tar of the same directory names the same root.
	tarBytes, err := exec.Command("tar", "--xattrs", "-C", src, "-cf", "-", ".").Output()
	if err != nil {
		t.Fatalf("tar: %v", err)
	}
	fromTar, err := f.Import(ctx, ImportSource{Tar: bytes.NewReader(tarBytes)})
	if err != nil {
		t.Fatal(err)
	}
	if fromTar.Root != res.Root {
		t.Fatalf("tar of the directory: root %s, want %s", fromTar.Root, res.Root)
	}

	dest := filepath.Join(t.TempDir(), "out")
	root, st, err := f.ExportDir(ctx, res.Root.String(), dest)
	if err != nil {
		t.Fatal(err)
	}
	if root != res.Root || st.Files == 0 {
		t.Fatalf("export: root %s stats %+v", root, st)
	}
	compareTrees(t, src, dest)

	// The exported tar re-imports to the same root.
	var out bytes.Buffer
	if _, _, err := f.ExportTar(ctx, res.Root.String(), &out); err != nil {
		t.Fatal(err)
	}
	back, err := f.Import(ctx, ImportSource{Tar: &out})
	if err != nil {
		t.Fatal(err)
	}
	if back.Root != res.Root {
		t.Fatalf("exported tar re-imports to %s, want %s", back.Root, res.Root)
	}
}

func TestImportSourceErrors(t *testing.T) {
	ctx := context.Background()
	f := openTest(t, t.TempDir())
	tests := []struct {
		name string
		src  ImportSource
		want error
	}{
		{"nothing", ImportSource{}, errdefs.ErrInvalidArgument},
		{"both", ImportSource{Path: "/x", Tar: strings.NewReader("")}, errdefs.ErrInvalidArgument},
		{"relative", ImportSource{Path: "rel/dir"}, errdefs.ErrInvalidArgument},
		{"missing", ImportSource{Path: filepath.Join(t.TempDir(), "absent")}, errdefs.ErrNotFound},
	}
	for _, tt := range tests {
		if _, err := f.Import(ctx, tt.src); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, _, err := f.ExportDir(ctx, cas.Sum([]byte("x")).String(), "/tmp/x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("export of an unknown root: %v", err)
	}
	var w bytes.Buffer
	if _, _, err := f.ExportTar(ctx, "not-an-id", &w); !errors.Is(err, errdefs.ErrInvalidArgument) || w.Len() != 0 {
		t.Errorf("tar export of a malformed id: %v, %d bytes written", err, w.Len())
	}
}

// flipByte corrupts the stored object id in place.
func flipByte(t *testing.T, f *Fabric, id cas.ID) {
	t.Helper()
	p := f.local.Path(id)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	b := make([]byte, 1)
	if _, err := fh.ReadAt(b, 10); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := fh.WriteAt(b, 10); err != nil {
		t.Fatal(err)
	}
}

func TestFsckAndCorruptExport(t *testing.T) {
	ctx := context.Background()
	f := openTest(t, t.TempDir())
	src := filepath.Join(t.TempDir(), "src")
	writeFixture(t, src)
	res, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	clean, err := f.Fsck(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(clean.Bad) != 0 || clean.Checked == 0 {
		t.Fatalf("fsck of a clean store: %+v", clean)
	}

	big, err := os.ReadFile(filepath.Join(src, "a/big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	bad := cas.Sum(big)
	flipByte(t, f, bad)

	got, err := f.Fsck(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Bad) != 1 || got.Bad[0] != bad || got.Checked != clean.Checked {
		t.Fatalf("fsck: %+v, want exactly %s bad of %d", got, bad, clean.Checked)
	}

	dest := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Root.String(), dest); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("export of corrupt content: %v, want corrupt", err)
	}
	if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed export left its destination: %v", err)
	}
	// An existing empty directory is the caller's: it stays.
	empty := t.TempDir()
	if _, _, err := f.ExportDir(ctx, res.Root.String(), empty); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("export of corrupt content: %v, want corrupt", err)
	}
	if _, err := os.Stat(empty); err != nil {
		t.Fatalf("a failed export removed the caller's directory: %v", err)
	}
	if _, _, err := f.ExportTar(ctx, res.Root.String(), io.Discard); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("tar export of corrupt content: %v, want corrupt", err)
	}
}

// TestCorruptSmallExport: a small blob (read whole by the store's
// ReadSmall, not streamed) whose file was altered fails both exports with
// the stable corrupt error, and no tar member carries it.
func TestCorruptSmallExport(t *testing.T) {
	ctx := context.Background()
	f := openTest(t, t.TempDir())
	src := filepath.Join(t.TempDir(), "src")
	writeFixture(t, src)
	res, err := f.Import(ctx, ImportSource{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	script := []byte("#!/bin/sh\necho hi\n")
	flipByte(t, f, cas.Sum(script))
	if _, _, err := f.ExportDir(ctx, res.Root.String(), filepath.Join(t.TempDir(), "out")); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("export of a corrupt small file: %v, want corrupt", err)
	}
	var buf bytes.Buffer
	if _, _, err := f.ExportTar(ctx, res.Root.String(), &buf); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("tar export of a corrupt small file: %v, want corrupt", err)
	}
	bad := bytes.Clone(script)
	bad[10] ^= 0x40
	if bytes.Contains(buf.Bytes(), bad) || bytes.Contains(buf.Bytes(), script) {
		t.Fatal("the failed tar holds the script's content")
	}
}
