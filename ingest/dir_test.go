package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/internal/testenv"
)

// richTree fills root with everything the tree format holds that this
// machine lets us make, and returns the relative paths it created. Only
// root can make devices, chown and set trusted.* xattrs; without root
// those are left out.
func richTree(t *testing.T, root string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 3<<20+17) // over smallFileMax: the streaming paths
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	writeFile(t, filepath.Join(root, "a.txt"), []byte("hello\n"), 0o644)
	writeFile(t, filepath.Join(root, "same.txt"), []byte("hello\n"), 0o600) // same blob, other attrs
	writeFile(t, filepath.Join(root, "big.bin"), big, 0o644)
	writeFile(t, filepath.Join(root, "empty"), nil, 0o644)
	writeFile(t, filepath.Join(root, "setuid"), []byte("#!/bin/sh\n"), 0o4755)
	writeFile(t, filepath.Join(root, "sgid", "f"), []byte("g"), 0o2640)
	writeFile(t, filepath.Join(root, "sub", "deep", "x.txt"), []byte("deep"), 0o644)
	writeFile(t, filepath.Join(root, "héllo wörld"), []byte("unicode"), 0o644)
	long := strings.Repeat("long-name-", 12) // over ustar's 100 bytes
	writeFile(t, filepath.Join(root, long, strings.Repeat("x", 200)), []byte("long"), 0o644)
	must(t, unix.Chmod(filepath.Join(root, "sgid"), 0o2775))
	must(t, os.Mkdir(filepath.Join(root, "sticky"), 0o755))
	must(t, unix.Chmod(filepath.Join(root, "sticky"), 0o1777))
	must(t, os.Mkdir(filepath.Join(root, "emptydir"), 0o700))
	must(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "sub", "hl")))
	must(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "sub", "deep", "hl2")))
	must(t, os.Symlink("a.txt", filepath.Join(root, "link")))
	must(t, os.Symlink("../nowhere/x", filepath.Join(root, "sub", "dangling")))
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o640))
	must(t, unix.Chmod(filepath.Join(root, "fifo"), 0o640))
	if isRoot(t) {
		must(t, unix.Mknod(filepath.Join(root, "cdev"), unix.S_IFCHR|0o620, int(unix.Mkdev(1, 3))))
		must(t, unix.Chmod(filepath.Join(root, "cdev"), 0o620))
		must(t, unix.Mknod(filepath.Join(root, "bdev"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))))
		must(t, os.Lchown(filepath.Join(root, "sub", "deep", "x.txt"), 1234, 5678))
		must(t, os.Lchown(filepath.Join(root, "link"), 42, 43))
		must(t, os.Chown(filepath.Join(root, "sgid"), 100000, 100000))
	}
	if xattrsSupported(t, root) {
		must(t, unix.Lsetxattr(filepath.Join(root, "a.txt"), "user.b", []byte("2"), 0))
		must(t, unix.Lsetxattr(filepath.Join(root, "a.txt"), "user.a", []byte("binary\x00\xff"), 0))
		must(t, unix.Lsetxattr(filepath.Join(root, "sub"), "user.dir", []byte("d"), 0))
		must(t, unix.Lsetxattr(root, "user.root", []byte("r"), 0))
		if isRoot(t) {
			must(t, unix.Lsetxattr(filepath.Join(root, "big.bin"), "trusted.t", []byte("tt"), 0))
		}
		// A POSIX ACL (user 1000 may read), as the kernel stores it: GNU tar
		// with --xattrs-include='*' carries it as a binary xattr.
		acl := []byte{2, 0, 0, 0, 1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff, 2, 0, 4, 0, 0xe8, 3, 0, 0,
			4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff, 0x10, 0, 4, 0, 0xff, 0xff, 0xff, 0xff, 0x20, 0, 4, 0, 0xff, 0xff, 0xff, 0xff}
		if err := unix.Lsetxattr(filepath.Join(root, "same.txt"), "system.posix_acl_access", acl, 0); err != nil &&
			!errors.Is(err, unix.ENOTSUP) {
			t.Fatal(err)
		}
	}
	// Deterministic nanosecond mtimes, last, since creating entries
	// changes their directory's mtime (setting times and xattrs does not).
	i := int64(0)
	must(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		i++
		ts := []unix.Timespec{{Sec: 1700000000 + i, Nsec: 123456789 + i}, {Sec: 1600000000 + i, Nsec: 987654321 - i}}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}))
	// One file with a whole-second mtime (GNU tar writes no PAX mtime
	// then), one from before 1970 (PAX "-1000.25").
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "empty"),
		[]unix.Timespec{{Sec: 5}, {Sec: 1234567890}}, 0))
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "setuid"),
		[]unix.Timespec{{Sec: 5}, {Sec: -1001, Nsec: 750000000}}, 0))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// gnuTar archives dir the way the import contract names.
func gnuTar(t *testing.T, dir string) []byte {
	t.Helper()
	testenv.Require(t, "cmd:tar")
	cmd := exec.Command("tar", "--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner",
		"-C", dir, "-cf", "-", ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tar: %v: %s", err, stderr.String())
	}
	return out
}

func TestDirReimportWritesNothing(t *testing.T) {
	root := t.TempDir()
	richTree(t, root)
	st := newStore()
	ctx := context.Background()
	first, err := Dir(ctx, st, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if first.NewObjects == 0 || int(first.NewObjects) != st.Stats().Created {
		t.Fatalf("first import: NewObjects %d, store created %d", first.NewObjects, st.Stats().Created)
	}
	if first.NewBytes != st.Stats().BytesPut {
		t.Fatalf("first import: NewBytes %d, store took %d", first.NewBytes, st.Stats().BytesPut)
	}
	st.ResetStats()
	second, err := Dir(ctx, st, root, Options{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if second.Root != first.Root {
		t.Fatalf("re-import root %s, first %s", second.Root.Short(), first.Root.Short())
	}
	if s := st.Stats(); second.NewObjects != 0 || second.NewBytes != 0 || s.Put != 0 || s.Created != 0 {
		t.Fatalf("re-import wrote: result %+v, store %+v", second.Stats, s)
	}
	if second.Files != first.Files || second.Bytes != first.Bytes || first.Files == 0 {
		t.Fatalf("counts differ: %+v vs %+v", first.Stats, second.Stats)
	}
}

func TestDirMatchesGNUTar(t *testing.T) {
	root := t.TempDir()
	richTree(t, root)
	st := newStore()
	ctx := context.Background()
	want, err := Dir(ctx, st, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	plain := gnuTar(t, root)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	must(t, zw.Close())
	var zs bytes.Buffer
	enc, err := zstd.NewWriter(&zs)
	must(t, err)
	enc.Write(plain)
	must(t, enc.Close())

	for _, tc := range []struct {
		name string
		data []byte
	}{{"plain", plain}, {"gzip", gz.Bytes()}, {"zstd", zs.Bytes()}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Tar(ctx, st, bytes.NewReader(tc.data), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Root != want.Root {
				diffTrees(t, st, want.Root, got.Root)
				t.Fatalf("tar root %s, dir root %s", got.Root.Short(), want.Root.Short())
			}
			if got.Files != want.Files || got.Dirs != want.Dirs || got.Symlinks != want.Symlinks ||
				got.Others != want.Others || got.Bytes != want.Bytes {
				t.Errorf("counts: tar %+v, dir %+v", got.Stats, want.Stats)
			}
		})
	}
	// The rich tree holds what the test claims it does.
	es := flatten(t, st, want.Root)
	for _, p := range []string{"a.txt", "big.bin", "sub/hl", "sub/deep/hl2", "link", "fifo", "sticky", "sgid/f"} {
		if _, ok := es[p]; !ok {
			t.Errorf("tree lacks %s", p)
		}
	}
	if xattrsSupported(t, root) && len(es["a.txt"].Xattrs) != 2 {
		t.Errorf("a.txt xattrs %q", es["a.txt"].Xattrs)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "same.txt"), "system.posix_acl_access", nil); err == nil {
		if xs := es["same.txt"].Xattrs; len(xs) != 1 || xs[0].Name != "system.posix_acl_access" {
			t.Errorf("same.txt lost its ACL: %q", xs)
		}
	}
}

// diffTrees logs how two roots differ, to make a failed comparison legible.
func diffTrees(t *testing.T, g cas.Getter, a, b cas.ID) {
	t.Helper()
	ea, eb := flatten(t, g, a), flatten(t, g, b)
	for _, k := range keys(ea) {
		x, ok := eb[k]
		if !ok {
			t.Logf("only in first: %q", k)
			continue
		}
		y := ea[k]
		x.ID, y.ID = cas.ZeroID, cas.ZeroID
		if xa, ya := fmtEntry(x), fmtEntry(y); xa != ya {
			t.Logf("%q differs:\n  first  %s\n  second %s", k, ya, xa)
		}
	}
	for _, k := range keys(eb) {
		if _, ok := ea[k]; !ok {
			t.Logf("only in second: %q", k)
		}
	}
}

func fmtEntry(e cas.Entry) string {
	var b strings.Builder
	b.WriteString(e.Type.String())
	for _, x := range e.Xattrs {
		b.WriteString(" " + x.Name + "=" + string(x.Value))
	}
	return b.String() + " " + strings.Join([]string{
		itoa(int64(e.Mode)), itoa(int64(e.UID)), itoa(int64(e.GID)), itoa(e.MtimeNs), itoa(e.Size),
		e.Target, e.LinkGroup, itoa(int64(e.Nlink)), itoa(int64(e.Major)), itoa(int64(e.Minor))}, ",")
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestDirEntries(t *testing.T) {
	root := t.TempDir()
	richTree(t, root)
	logger, logs := testLogger()
	sock := filepath.Join(root, "sub", "sock")
	l, err := net.Listen("unix", sock)
	must(t, err)
	defer l.Close()
	// The socket changed sub's mtime; the expectations below do not
	// depend on it.
	st := newStore()
	res, err := Dir(context.Background(), st, root, Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Skipped, []string{"sub/sock"}) {
		t.Errorf("Skipped = %q, want [sub/sock]", res.Skipped)
	}
	if !strings.Contains(logs.String(), "sub/sock") || !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no warning logged for the socket: %q", logs.String())
	}
	es := flatten(t, st, res.Root)
	if _, ok := es["sub/sock"]; ok {
		t.Error("socket imported")
	}

	get := func(p string) cas.Entry {
		t.Helper()
		e, ok := es[p]
		if !ok {
			t.Fatalf("no entry %q; have %q", p, keys(es))
		}
		return e
	}
	var lst unix.Stat_t
	must(t, unix.Lstat(filepath.Join(root, "a.txt"), &lst))
	a := get("a.txt")
	if a.Type != cas.TypeFile || a.Mode != 0o644 || a.Size != 6 || a.MtimeNs != lst.Mtim.Nano() ||
		string(blobOf(t, st, a.ID)) != "hello\n" {
		t.Errorf("a.txt = %+v", a)
	}
	if a.MtimeNs%1e9 == 0 {
		t.Errorf("a.txt mtime %d lost its nanoseconds", a.MtimeNs)
	}
	if e := get("setuid"); e.Mode != 0o4755 || e.MtimeNs != -1000250000000 {
		t.Errorf("setuid mode %o mtime %d", e.Mode, e.MtimeNs)
	}
	if e := get("sgid"); e.Type != cas.TypeDir || e.Mode != 0o2775 {
		t.Errorf("sgid dir = %+v", e)
	}
	if e := get("sgid/f"); e.Mode != 0o2640 {
		t.Errorf("sgid/f mode %o", e.Mode)
	}
	if e := get("sticky"); e.Mode != 0o1777 {
		t.Errorf("sticky mode %o", e.Mode)
	}
	if e := get("emptydir"); e.Type != cas.TypeDir || e.Mode != 0o700 {
		t.Errorf("emptydir = %+v", e)
	}
	if e := get("link"); e.Type != cas.TypeSymlink || e.Target != "a.txt" || e.Mode != 0o777 || e.Size != 5 {
		t.Errorf("link = %+v", e)
	}
	if e := get("sub/dangling"); e.Target != "../nowhere/x" {
		t.Errorf("dangling = %+v", e)
	}
	if e := get("fifo"); e.Type != cas.TypeFIFO || e.Mode != 0o640 {
		t.Errorf("fifo = %+v", e)
	}
	if e := get("big.bin"); e.Size != 3<<20+17 {
		t.Errorf("big.bin size %d", e.Size)
	} else if got, _ := os.ReadFile(filepath.Join(root, "big.bin")); cas.Sum(got) != e.ID {
		t.Error("big.bin id is not the hash of its content")
	}
	if e := get("empty"); e.Size != 0 || e.ID != cas.Sum(nil) || e.MtimeNs != 1234567890e9 {
		t.Errorf("empty = %+v", e)
	}
	if isRoot(t) {
		if e := get("cdev"); e.Type != cas.TypeCharDev || e.Major != 1 || e.Minor != 3 || e.Mode != 0o620 {
			t.Errorf("cdev = %+v", e)
		}
		if e := get("bdev"); e.Type != cas.TypeBlockDev || e.Major != 7 || e.Minor != 200 {
			t.Errorf("bdev = %+v", e)
		}
		if e := get("sub/deep/x.txt"); e.UID != 1234 || e.GID != 5678 {
			t.Errorf("x.txt owner %d:%d", e.UID, e.GID)
		}
		if e := get("link"); e.UID != 42 || e.GID != 43 {
			t.Errorf("symlink owner %d:%d", e.UID, e.GID)
		}
		if e := get("sgid"); e.UID != 100000 {
			t.Errorf("sgid owner %d", e.UID)
		}
	}
	wantCounts := Stats{Files: 11, Dirs: 7, Symlinks: 2, Others: 1}
	if isRoot(t) {
		wantCounts.Others = 3
	}
	if res.Files != wantCounts.Files || res.Dirs != wantCounts.Dirs || res.Symlinks != wantCounts.Symlinks ||
		res.Others != wantCounts.Others {
		t.Errorf("counts %+v, want %+v", res.Stats, wantCounts)
	}
}

func TestDirHardLinks(t *testing.T) {
	root := t.TempDir()
	body := bytes.Repeat([]byte("x"), 5000)
	writeFile(t, filepath.Join(root, "b", "first"), body, 0o640)
	must(t, os.Mkdir(filepath.Join(root, "a"), 0o755))
	must(t, os.Link(filepath.Join(root, "b", "first"), filepath.Join(root, "a", "second")))
	must(t, os.Link(filepath.Join(root, "b", "first"), filepath.Join(root, "c")))
	// Same bytes, own inode: same blob, no link group.
	writeFile(t, filepath.Join(root, "copy"), body, 0o640)
	// A hard-linked fifo: links are not only for regular files.
	must(t, unix.Mkfifo(filepath.Join(root, "p1"), 0o600))
	must(t, os.Link(filepath.Join(root, "p1"), filepath.Join(root, "p2")))

	st := newStore()
	res, err := Dir(context.Background(), st, root, Options{Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	// The linked inode is read once, the copy once.
	if res.Bytes != 2*int64(len(body)) {
		t.Errorf("Bytes = %d, want %d: a hard-linked inode was read more than once", res.Bytes, 2*len(body))
	}
	if res.Files != 4 || res.Others != 2 {
		t.Errorf("counts %+v", res.Stats)
	}
	es := flatten(t, st, res.Root)
	// Groups are named by their first member in depth-first name order.
	for _, p := range []string{"a/second", "b/first", "c"} {
		e := es[p]
		if e.LinkGroup != "a/second" || e.Nlink != 3 || e.ID != cas.Sum(body) || e.Mode != 0o640 {
			t.Errorf("%s = group %q nlink %d mode %o", p, e.LinkGroup, e.Nlink, e.Mode)
		}
	}
	if e := es["copy"]; e.LinkGroup != "" || e.ID != cas.Sum(body) {
		t.Errorf("copy = %+v", e)
	}
	for _, p := range []string{"p1", "p2"} {
		if e := es[p]; e.Type != cas.TypeFIFO || e.LinkGroup != "p1" || e.Nlink != 2 {
			t.Errorf("%s = %+v", p, e)
		}
	}
}

func TestDirXattrs(t *testing.T) {
	root := t.TempDir()
	if !xattrsSupported(t, root) {
		t.Skipf("filesystem at %s does not support user.* xattrs", root)
	}
	writeFile(t, filepath.Join(root, "f"), []byte("x"), 0o644)
	must(t, os.Mkdir(filepath.Join(root, "d"), 0o755))
	set := func(p, name, val string) {
		t.Helper()
		must(t, unix.Lsetxattr(p, name, []byte(val), 0))
	}
	set(filepath.Join(root, "f"), "user.zeta", "z")
	set(filepath.Join(root, "f"), "user.alpha", "a\x00b")
	set(filepath.Join(root, "f"), "user.empty", "")
	set(filepath.Join(root, "d"), "user.d", "dir")
	set(root, "user.r", "root")
	want := map[string][]cas.Xattr{
		"f": {{Name: "user.alpha", Value: []byte("a\x00b")}, {Name: "user.empty"}, {Name: "user.zeta", Value: []byte("z")}},
		"d": {{Name: "user.d", Value: []byte("dir")}},
		"":  {{Name: "user.r", Value: []byte("root")}},
	}
	if isRoot(t) {
		set(filepath.Join(root, "f"), "trusted.secret", "s")
		want["f"] = append([]cas.Xattr{{Name: "trusted.secret", Value: []byte("s")}}, want["f"]...)
	}
	st := newStore()
	res, err := Dir(context.Background(), st, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	es := flatten(t, st, res.Root)
	for p, w := range want {
		got := es[p].Xattrs
		if len(got) != len(w) {
			t.Errorf("%q xattrs = %q, want %q", p, got, w)
			continue
		}
		for i := range w {
			if got[i].Name != w[i].Name || !bytes.Equal(got[i].Value, w[i].Value) {
				t.Errorf("%q xattr %d = %q, want %q", p, i, got[i], w[i])
			}
		}
	}
}

func TestDirLargeFileStreams(t *testing.T) {
	const size = 64 << 20
	root := t.TempDir()
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(t, err)
	must(t, f.Truncate(size)) // sparse: quick to make, real bytes to read
	must(t, f.Close())
	st := &countingStore{}
	peak := heapPeak(t)
	res, err := Dir(context.Background(), st, root, Options{Workers: 2})
	maxHeap := peak()
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != size || st.bytes.Load() != size {
		t.Fatalf("Bytes %d, stored %d, want %d", res.Bytes, st.bytes.Load(), size)
	}
	// Reading the file whole would hold at least its size at once.
	if maxHeap >= size/2 {
		t.Errorf("importing a %d MiB file took the heap to %d MiB", size>>20, maxHeap>>20)
	}
	t.Logf("peak heap %d MiB for a %d MiB file", maxHeap>>20, size>>20)
	zero := make([]byte, size)
	if want := cas.Sum(zero); st.last != want {
		t.Error("stored id is not the hash of the file")
	}
}

// heapPeak samples the heap until the returned function is called, which
// returns the largest size seen.
func heapPeak(t *testing.T) func() uint64 {
	t.Helper()
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-stopped
		return peak.Load()
	}
}

// countingStore keeps no content: Put hashes and counts the large objects,
// Has knows nothing, Get finds nothing.
type countingStore struct {
	bytes atomic.Int64
	last  cas.ID
}

func (c *countingStore) Has(context.Context, cas.ID) (bool, error) { return false, nil }

func (c *countingStore) Get(_ context.Context, id cas.ID) (io.ReadCloser, error) {
	return nil, fmt.Errorf("get %s: %w", id, cas.ErrNotFound)
}

func (c *countingStore) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	h := cas.NewHasher()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, err := r.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if err != nil {
			break
		}
	}
	id := cas.IDFromHash(h)
	if n > 1<<20 {
		c.bytes.Add(n)
		c.last = id
	}
	return cas.Info{ID: id, Size: n}, true, nil
}

func TestDirCancel(t *testing.T) {
	root := t.TempDir()
	body := bytes.Repeat([]byte("y"), 64<<10)
	for i := range 300 {
		body[0] = byte(i)
		body[1] = byte(i >> 8)
		writeFile(t, filepath.Join(root, "d"+itoa(int64(i%7)), "f"+itoa(int64(i))), body, 0o644)
	}
	t.Run("before", func(t *testing.T) {
		noLeaks(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := Dir(ctx, newStore(), root, Options{})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
	t.Run("during", func(t *testing.T) {
		noLeaks(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var seen atomic.Int64
		st := newStore()
		_, err := Dir(ctx, st, root, Options{Workers: 4, Progress: func(n int64) {
			if n > 1<<20 {
				cancel()
			}
			seen.Store(n)
		}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		// Prompt: far from all 300 files were read after the cancel.
		if n := seen.Load(); n > 200*int64(len(body)) {
			t.Errorf("read %d bytes before stopping", n)
		}
	})
}

func TestDirProgress(t *testing.T) {
	root := t.TempDir()
	richTree(t, root)
	var calls []int64
	res, err := Dir(context.Background(), newStore(), root, Options{Progress: func(n int64) {
		calls = append(calls, n) // never concurrent, by contract (the race detector checks)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) == 0 || calls[len(calls)-1] != res.Bytes {
		t.Fatalf("progress calls %v, want last %d", calls, res.Bytes)
	}
	if !slices.IsSorted(calls) {
		t.Errorf("progress went backwards: %v", calls)
	}
}

func TestDirErrors(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "f"), []byte("x"), 0o644)
	st := newStore()
	ctx := context.Background()
	if _, err := Dir(ctx, st, filepath.Join(root, "missing"), Options{}); !errors.Is(err, cas.ErrNotFound) {
		t.Errorf("missing dir: %v", err)
	}
	if _, err := Dir(ctx, st, filepath.Join(root, "f"), Options{}); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Errorf("file as dir: %v", err)
	}
	if _, err := Dir(ctx, st, root, Options{Workers: -1}); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Errorf("negative workers: %v", err)
	}
	// A symlink as the import path itself is followed.
	link := filepath.Join(t.TempDir(), "link")
	must(t, os.Symlink(root, link))
	a, err := Dir(ctx, st, root, Options{})
	must(t, err)
	b, err := Dir(ctx, st, link, Options{})
	must(t, err)
	if a.Root != b.Root {
		t.Error("importing through a symlink to the root gave another tree")
	}
	// A store failure surfaces as itself.
	boom := errors.New("disk on fire")
	st.SetFault(func(op mem.Op, _ cas.ID) error {
		if op == mem.OpPut {
			return boom
		}
		return nil
	})
	writeFile(t, filepath.Join(root, "new"), []byte("new content"), 0o644)
	if _, err := Dir(ctx, st, root, Options{}); !errors.Is(err, boom) {
		t.Errorf("store failure: %v", err)
	}
	// So does a failure to publish the batch, and nothing is left half-done.
	st.SetFault(func(op mem.Op, _ cas.ID) error {
		if op == mem.OpCommit {
			return boom
		}
		return nil
	})
	if _, err := Dir(ctx, st, root, Options{}); !errors.Is(err, boom) {
		t.Errorf("commit failure: %v", err)
	}
	st.SetFault(nil)
	st.ResetStats()
	res, err := Dir(ctx, st, root, Options{})
	must(t, err)
	if res.NewObjects == 0 || int(res.NewObjects) != st.Stats().Created {
		t.Errorf("after failures: NewObjects %d, created %d", res.NewObjects, st.Stats().Created)
	}
	flatten(t, st, res.Root)
}

func BenchmarkDir(b *testing.B) {
	root := b.TempDir()
	body := bytes.Repeat([]byte("b"), 8<<10)
	for i := range 1000 {
		body[0], body[1] = byte(i), byte(i>>8)
		p := filepath.Join(root, "d"+itoa(int64(i%20)), "f"+itoa(int64(i)))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	b.Run("fresh", func(b *testing.B) {
		b.SetBytes(1000 * int64(len(body)))
		for b.Loop() {
			if _, err := Dir(ctx, newStore(), root, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reimport", func(b *testing.B) {
		st := newStore()
		if _, err := Dir(ctx, st, root, Options{}); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(1000 * int64(len(body)))
		for b.Loop() {
			if _, err := Dir(ctx, st, root, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDirFileSizesAtBufferEdges: files on either side of each buffer a
// worker reads with (smallBufSize, smallFileMax) import as their content,
// whichever road the import guesses for large files.
func TestDirFileSizesAtBufferEdges(t *testing.T) {
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	want := map[string]cas.ID{}
	for _, n := range []int{0, 1, smallBufSize - 1, smallBufSize, smallBufSize + 1, smallFileMax - 1, smallFileMax, smallFileMax + 1} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		name := fmt.Sprintf("f%d", n)
		writeFile(t, filepath.Join(root, name), b, 0o644)
		want[name] = cas.Sum(b)
	}
	for _, newContent := range []bool{false, true} {
		t.Run(fmt.Sprintf("NewContent=%v", newContent), func(t *testing.T) {
			ctx := context.Background()
			st := mem.New()
			res, err := Dir(ctx, st, root, Options{Workers: 2, NewContent: newContent})
			if err != nil {
				t.Fatal(err)
			}
			tree, err := cas.ReadTree(ctx, st, res.Root)
			if err != nil {
				t.Fatal(err)
			}
			if len(tree.Entries) != len(want) {
				t.Fatalf("%d entries, want %d", len(tree.Entries), len(want))
			}
			for _, e := range tree.Entries {
				if e.ID != want[e.Name] {
					t.Errorf("%s: id %s, want %s", e.Name, e.ID.Short(), want[e.Name].Short())
				}
				if b, err := cas.ReadAll(ctx, st, e.ID); err != nil || cas.Sum(b) != want[e.Name] {
					t.Errorf("%s: stored content: %v", e.Name, err)
				}
			}
		})
	}
}
