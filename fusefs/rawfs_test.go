package fusefs

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/testenv"
)

// buildDirs writes a tree of dirs directories holding per files each and
// returns its root and every path in it, sorted.
func buildDirs(t *testing.T, st *countingStore, dirs, per int, long bool) (cas.ID, []string) {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, cas.ZeroID)
	blob := st.blob(t, "x")
	var paths []string
	pad := ""
	if long {
		pad = strings.Repeat("n", 150) // few entries per READDIR reply
	}
	for d := range dirs {
		dir := fmt.Sprintf("d%02d/sub", d)
		paths = append(paths, fmt.Sprintf("d%02d", d), dir)
		for i := range per {
			p := fmt.Sprintf("%s/f%05d%s", dir, i, pad)
			paths = append(paths, p)
			if err := b.Put(ctx, p, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: blob}, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(paths)
	return root, paths
}

// walk lists every directory under mnt and lstats every entry, as git
// status does, and returns the paths it saw, sorted.
func walk(t *testing.T, mnt string) []string {
	t.Helper()
	got, err := walkPaths(mnt)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// walkPaths is walk's work, for callers without a *testing.T
// (goroutines).
func walkPaths(mnt string) ([]string, error) {
	var got []string
	err := filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == mnt {
			return nil
		}
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		rel, _ := filepath.Rel(mnt, p)
		got = append(got, rel)
		return nil
	})
	slices.Sort(got)
	return got, err
}

func kernelHasNoOpendir(t *testing.T, f *FS) {
	t.Helper()
	if !f.handleless.Load() {
		t.Fatal("the kernel cannot open directories without the server (FUSE_NO_OPENDIR_SUPPORT, Linux 5.1)")
	}
}

// A warm walk costs the server no request: the kernel opens directories
// without OPENDIR (one ENOSYS per mount teaches it) and keeps listings,
// entries and attributes.
func TestWarmWalkSendsNoOpendir(t *testing.T) {
	st := newCountingStore()
	root, want := buildDirs(t, st, 20, 100, false)
	f, mnt := mount(t, st, root)
	for round := range 2 {
		if got := walk(t, mnt); !slices.Equal(got, want) {
			t.Fatalf("walk %d: %d paths, want %d", round, len(got), len(want))
		}
	}
	kernelHasNoOpendir(t, f)
	if n := f.Counters.Opendirs.Load(); n != 1 {
		t.Fatalf("%d OPENDIRs after two walks, want the one answered ENOSYS", n)
	}
	before := f.Counters.Snapshot()
	if got := walk(t, mnt); !slices.Equal(got, want) {
		t.Fatalf("warm walk: %d paths, want %d", len(got), len(want))
	}
	after := f.Counters.Snapshot()
	if n := f.Counters.Opendirs.Load(); n != 1 {
		t.Errorf("the warm walk sent %d OPENDIRs", n-1)
	}
	if after != before {
		t.Errorf("the warm walk reached the server: %+v before, %+v after", before, after)
	}
	// Every directory was listed once, by the first walk.
	if n, dirs := after.Readdirs, int64(2*20+1); n != dirs {
		t.Errorf("%d listings made, want %d (one per directory)", n, dirs)
	}
}

// The same through an overlay on the projection, as an attempt root is,
// with a change in its upper layer (so some directories are merged).
func TestWarmWalkThroughOverlaySendsNothing(t *testing.T) {
	st := newCountingStore()
	root, want := buildDirs(t, st, 10, 100, false)
	f, lower := mount(t, st, root)
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		testenv.Require(t, "overlay") // skips, or fails in CI
		t.Fatalf("overlay mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	if err := os.WriteFile(filepath.Join(merged, "d03", "sub", "new"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	want = append(want, "d03/sub/new")
	slices.Sort(want)
	for round := range 2 {
		if got := walk(t, merged); !slices.Equal(got, want) {
			t.Fatalf("walk %d: %d paths, want %d", round, len(got), len(want))
		}
	}
	kernelHasNoOpendir(t, f)
	before, opendirs := f.Counters.Snapshot(), f.Counters.Opendirs.Load()
	if got := walk(t, merged); !slices.Equal(got, want) {
		t.Fatalf("warm walk: %d paths, want %d", len(got), len(want))
	}
	if after := f.Counters.Snapshot(); after != before {
		t.Errorf("the warm walk reached the server: %+v before, %+v after", before, after)
	}
	if n := f.Counters.Opendirs.Load(); n != opendirs || n != 1 {
		t.Errorf("%d OPENDIRs (%d by the warm walk), want the one answered ENOSYS", n, n-opendirs)
	}
}

// Directories whose listings take many READDIR requests, listed by many
// walkers at once, each listing complete and in order, again after the
// kernel forgot every inode.
func TestHandlelessListingsLargeAndConcurrent(t *testing.T) {
	st := newCountingStore()
	root, want := buildDirs(t, st, 4, 1500, true)
	f, mnt := mount(t, st, root)
	check := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Half list with small getdents buffers, so the kernel
				// cache is filled by requests at many offsets.
				var got []string
				for d := range 4 {
					dir := fmt.Sprintf("d%02d/sub", d)
					names, err := listSmall(filepath.Join(mnt, dir), w%2 == 0)
					if err != nil {
						errs <- err.Error()
						return
					}
					for _, n := range names {
						got = append(got, dir+"/"+n)
					}
				}
				var files []string
				for _, p := range want {
					if strings.Count(p, "/") == 2 {
						files = append(files, p)
					}
				}
				if !slices.Equal(got, files) {
					errs <- fmt.Sprintf("walker %d: %d names, want %d", w, len(got), len(files))
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("%s: %s", what, e)
		}
	}
	check("cold")
	kernelHasNoOpendir(t, f)
	// Opens that race the first ENOSYS may each send one; none after.
	opendirs := f.Counters.Opendirs.Load()
	check("warm")
	reads := f.Counters.TreeReads.Load()
	dropCaches(t)
	check("after forgets")
	if f.Counters.TreeReads.Load() == reads {
		t.Errorf("no tree read again after dropping caches: the kernel forgot nothing, the test proves nothing")
	}
	if got := walk(t, mnt); !slices.Equal(got, want) {
		t.Fatalf("walk after forgets: %d paths, want %d", len(got), len(want))
	}
	if n := f.Counters.Opendirs.Load(); n != opendirs {
		t.Errorf("%d OPENDIRs after the cold walks, want none", n-opendirs)
	}
}

// dropCaches makes the kernel evict the projection's unused dentries and
// inodes (and send FORGET for them).
func dropCaches(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

// listSmall lists dir with getdents into a small buffer (or a large one),
// names only, in the order the file system gives them.
func listSmall(dir string, small bool) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	size := 64 << 10
	if small {
		size = 512
	}
	return readNames(fd, size, -1)
}

// readNames reads up to max names (all if max < 0) from fd's position.
func readNames(fd, size, max int) ([]string, error) {
	buf := make([]byte, size)
	var names []string
	for max < 0 || len(names) < max {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	return names, nil
}

// telldir/seekdir and rewinddir over a handleless directory: the offsets
// the kernel hands out stay valid, in this open and in another one.
func TestHandlelessSeekdir(t *testing.T) {
	st := newCountingStore()
	root, _ := buildDirs(t, st, 1, 2000, true)
	f, mnt := mount(t, st, root)
	dir := filepath.Join(mnt, "d00", "sub")
	all, err := listSmall(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	kernelHasNoOpendir(t, f)
	if len(all) != 2000 {
		t.Fatalf("%d names, want 2000", len(all))
	}
	for _, drop := range []bool{false, true} {
		if drop {
			dropCaches(t) // the kernel's cached listing goes: offsets come from the server
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		first, err := readNames(fd, 4096, 700)
		if err != nil {
			t.Fatal(err)
		}
		mark, err := unix.Seek(fd, 0, 1) // telldir
		if err != nil {
			t.Fatal(err)
		}
		rest, err := readNames(fd, 4096, -1)
		if err != nil {
			t.Fatal(err)
		}
		if got := append(slices.Clone(first), rest...); !slices.Equal(got, all) {
			t.Errorf("drop=%v: listing in pieces differs: %d names", drop, len(got))
		}
		if _, err := unix.Seek(fd, mark, 0); err != nil { // seekdir
			t.Fatal(err)
		}
		again, err := readNames(fd, 1024, -1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again, rest) {
			t.Errorf("drop=%v: after seekdir to %d: %d names, want %d", drop, mark, len(again), len(rest))
		}
		if _, err := unix.Seek(fd, 0, 0); err != nil { // rewinddir
			t.Fatal(err)
		}
		if got, err := readNames(fd, 64<<10, -1); err != nil || !slices.Equal(got, all) {
			t.Errorf("drop=%v: after rewinddir: %d names (%v)", drop, len(got), err)
		}
		// The offset means the same in another open.
		fd2, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Seek(fd2, mark, 0); err != nil {
			t.Fatal(err)
		}
		if got, err := readNames(fd2, 2048, -1); err != nil || !slices.Equal(got, rest) {
			t.Errorf("drop=%v: seekdir in a second open: %d names (%v), want %d", drop, len(got), err, len(rest))
		}
		unix.Close(fd2)
		unix.Close(fd)
	}
	if n := f.Counters.Opendirs.Load(); n != 1 {
		t.Errorf("%d OPENDIRs, want 1", n)
	}
}

// fakeRaw records what handlelessDirs asks of the bridge.
type fakeRaw struct {
	fuse.RawFileSystem // nil: any other call panics
	opens, releases    []uint64
	reads              []fuse.ReadIn
	openErr, readErr   fuse.Status
	nextFh             uint64
}

func (r *fakeRaw) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if r.openErr != fuse.OK {
		return r.openErr
	}
	r.nextFh++
	out.Fh = r.nextFh
	r.opens = append(r.opens, in.NodeId)
	return fuse.OK
}

func (r *fakeRaw) ReleaseDir(in *fuse.ReleaseIn) { r.releases = append(r.releases, in.Fh) }

func (r *fakeRaw) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, _ *fuse.DirEntryList) fuse.Status {
	r.reads = append(r.reads, *in)
	return r.readErr
}

func (r *fakeRaw) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.ReadDir(c, in, out)
}

// Each READDIR(PLUS) with handle 0 opens one bridge handle, reads through
// it at the kernel's offset and releases it, whatever fails; requests with
// a handle, and OPENDIR on a kernel without the flag, reach the bridge as
// they came.
func TestHandlelessDirsPairsOpensAndReleases(t *testing.T) {
	f, err := New(Options{Store: newCountingStore()})
	if err != nil {
		t.Fatal(err)
	}
	raw := &fakeRaw{}
	w := &handlelessDirs{RawFileSystem: raw, fsys: f}
	var oo fuse.OpenOut
	if st := w.OpenDir(nil, &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: 5}}, &oo); st != fuse.OK || len(raw.opens) != 1 {
		t.Fatalf("without the kernel's flag OPENDIR answered %v and reached the bridge %d times", st, len(raw.opens))
	}
	raw.opens, raw.nextFh = nil, 0
	w.noOpendir.Store(true)
	if st := w.OpenDir(nil, &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: 5}}, &oo); st != fuse.ENOSYS || len(raw.opens) != 0 {
		t.Fatalf("with the flag OPENDIR answered %v and reached the bridge %d times", st, len(raw.opens))
	}
	if n := f.Counters.Opendirs.Load(); n != 2 {
		t.Errorf("Opendirs = %d, want 2", n)
	}
	in := func(fh, off uint64) *fuse.ReadIn {
		return &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: 9}, Fh: fh, Offset: off, Size: 4096}
	}
	list := fuse.NewDirEntryList(make([]byte, 4096), 0)
	if st := w.ReadDir(nil, in(0, 37), list); st != fuse.OK {
		t.Fatal(st)
	}
	if st := w.ReadDirPlus(nil, in(0, 0), list); st != fuse.OK {
		t.Fatal(st)
	}
	raw.readErr = fuse.EIO
	if st := w.ReadDir(nil, in(0, 5), list); st != fuse.EIO {
		t.Errorf("a failed read answered %v", st)
	}
	raw.readErr = fuse.OK
	raw.openErr = fuse.ENOENT
	if st := w.ReadDirPlus(nil, in(0, 5), list); st != fuse.ENOENT {
		t.Errorf("a failed open answered %v", st)
	}
	raw.openErr = fuse.OK
	if st := w.ReadDir(nil, in(42, 3), list); st != fuse.OK {
		t.Fatal(st)
	}
	if !slices.Equal(raw.opens, []uint64{9, 9, 9}) || !slices.Equal(raw.releases, []uint64{1, 2, 3}) {
		t.Errorf("opened for nodes %v, released handles %v: want three of each, paired", raw.opens, raw.releases)
	}
	var got [][2]uint64
	for _, r := range raw.reads {
		got = append(got, [2]uint64{r.Fh, r.Offset})
	}
	if want := [][2]uint64{{1, 37}, {2, 0}, {3, 5}, {42, 3}}; !slices.Equal(got, want) {
		t.Errorf("reads (handle, offset) %v, want %v", got, want)
	}
}
