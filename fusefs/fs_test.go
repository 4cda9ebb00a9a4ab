package fusefs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/testenv"
)

// countingStore is a map store that counts reads per object; it stands in
// for the content store here because these tests are about what the
// projection reads, and cas/castest holds the real stores to the contract.
type countingStore struct {
	mu    sync.Mutex
	m     map[cas.ID][]byte
	reads map[cas.ID]int
}

func newCountingStore() *countingStore {
	return &countingStore{m: map[cas.ID][]byte{}, reads: map[cas.ID]int{}}
}

func (s *countingStore) Get(_ context.Context, id cas.ID) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[id]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", id, cas.ErrNotFound)
	}
	s.reads[id]++
	return cas.VerifyingReader(id, io.NopCloser(bytes.NewReader(b))), nil
}

func (s *countingStore) Put(_ context.Context, r io.Reader) (cas.Info, bool, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return cas.Info{}, false, err
	}
	id := cas.Sum(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, had := s.m[id]
	s.m[id] = b
	return cas.Info{ID: id, Size: int64(len(b))}, !had, nil
}

func (s *countingStore) totalReads() (n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.reads {
		n += c
	}
	return n
}

func (s *countingStore) blob(t *testing.T, content string) cas.ID {
	t.Helper()
	info, _, err := s.Put(context.Background(), bytes.NewReader([]byte(content)))
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

func requireFUSE(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root", "fuse")
}

// mount serves st at a fresh directory and returns the path of root in it.
func mount(t *testing.T, st cas.Getter, root cas.ID) (*FS, string) {
	t.Helper()
	requireFUSE(t)
	f, err := New(Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	dir := sharedTempDir(t) // other users reach it in the access tests
	srv, err := Mount(dir, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return f, filepath.Join(dir, "roots", root.String())
}

func TestProjectionShowsTree(t *testing.T) {
	ctx := context.Background()
	st := newCountingStore()
	b := cas.NewBuilder(st, cas.ZeroID)
	put := func(p string, e cas.Entry, key string) {
		if err := b.Put(ctx, p, e, key); err != nil {
			t.Fatal(err)
		}
	}
	put("", cas.Entry{Type: cas.TypeDir, Attr: cas.Attr{Mode: 0o750, UID: 7, GID: 8, MtimeNs: 1_600_000_000_123_456_789}}, "")
	put("d/hello", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o4755, UID: 1000, GID: 100, MtimeNs: 1_500_000_000_000_000_001,
		Xattrs: []cas.Xattr{{Name: "user.k", Value: []byte("v")}}}, Size: 5, ID: st.blob(t, "hello")}, "")
	put("d/empty", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, ID: st.blob(t, "")}, "")
	put("link", cas.Entry{Type: cas.TypeSymlink, Attr: cas.Attr{Mode: 0o777}, Target: "/etc/passwd"}, "")
	put("fifo", cas.Entry{Type: cas.TypeFIFO, Attr: cas.Attr{Mode: 0o600}}, "")
	if err := b.Link(ctx, "hard", "d/hello"); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	_, mnt := mount(t, st, root)

	var rst unix.Stat_t
	if err := unix.Lstat(mnt, &rst); err != nil {
		t.Fatal(err)
	}
	if rst.Mode != syscall.S_IFDIR|0o750 || rst.Uid != 7 || rst.Gid != 8 || rst.Mtim.Nsec != 123_456_789 {
		t.Errorf("root attrs: mode %o uid %d gid %d mtime %v", rst.Mode, rst.Uid, rst.Gid, rst.Mtim)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "d/hello"))
	if err != nil || string(got) != "hello" {
		t.Fatalf("read d/hello = %q, %v", got, err)
	}
	var a, h unix.Stat_t
	if err := unix.Lstat(filepath.Join(mnt, "d/hello"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(mnt, "hard"), &h); err != nil {
		t.Fatal(err)
	}
	if a.Ino != h.Ino || a.Nlink != 2 || h.Nlink != 2 {
		t.Errorf("hard links: ino %d vs %d, nlink %d/%d; want one inode with nlink 2", a.Ino, h.Ino, a.Nlink, h.Nlink)
	}
	if a.Mode != syscall.S_IFREG|0o4755 || a.Uid != 1000 || a.Size != 5 {
		t.Errorf("d/hello: mode %o uid %d size %d", a.Mode, a.Uid, a.Size)
	}
	if target, err := os.Readlink(filepath.Join(mnt, "link")); err != nil || target != "/etc/passwd" {
		t.Errorf("readlink = %q, %v", target, err)
	}
	val := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(mnt, "d/hello"), "user.k", val); err != nil || string(val[:n]) != "v" {
		t.Errorf("getxattr = %q, %v", val[:n], err)
	}
	var f unix.Stat_t
	if err := unix.Lstat(filepath.Join(mnt, "fifo"), &f); err != nil || f.Mode != syscall.S_IFIFO|0o600 {
		t.Errorf("fifo mode %o, %v", f.Mode, err)
	}
	ents, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if fmt.Sprint(names) != "[d fifo hard link]" {
		t.Errorf("readdir = %v", names)
	}

	// Read-only everywhere.
	if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o644); !isErrno(err, syscall.EROFS) {
		t.Errorf("create: err = %v, want EROFS", err)
	}
	if _, err := os.OpenFile(filepath.Join(mnt, "d/hello"), os.O_WRONLY, 0); !isErrno(err, syscall.EROFS) {
		t.Errorf("open for write: err = %v, want EROFS", err)
	}
	if err := os.Remove(filepath.Join(mnt, "d/empty")); !isErrno(err, syscall.EROFS) {
		t.Errorf("unlink: err = %v, want EROFS", err)
	}

	// An unknown root and a malformed name are simply absent.
	if _, err := os.Stat(filepath.Join(filepath.Dir(mnt), cas.Sum([]byte("nope")).String())); !os.IsNotExist(err) {
		t.Errorf("unknown root: err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(mnt), "not-an-id")); !os.IsNotExist(err) {
		t.Errorf("bad root name: err = %v", err)
	}
}

func isErrno(err error, want syscall.Errno) bool {
	var errno syscall.Errno
	for e := err; e != nil; {
		if en, ok := e.(syscall.Errno); ok {
			errno = en
			break
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return errno == want
}

// TestLazyLookup proves that a lookup in a 100k-file root reads only the
// trees on its path and no blob, and that an open reads one blob.
func TestLazyLookup(t *testing.T) {
	ctx := context.Background()
	st := newCountingStore()
	b := cas.NewBuilder(st, cas.ZeroID)
	const dirs, files = 100, 1000
	for d := range dirs {
		for i := range files {
			content := fmt.Sprintf("%d/%d", d, i)
			// Blobs are counted, not stored: the projection must not read
			// them, so most need not exist.
			id := cas.Sum([]byte(content))
			if d == 42 && i == 777 {
				id = st.blob(t, content)
			}
			e := cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: int64(len(content)), ID: id}
			if err := b.Put(ctx, fmt.Sprintf("d%03d/f%04d", d, i), e, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	clear(st.reads)
	st.mu.Unlock()

	f, mnt := mount(t, st, root)
	p := filepath.Join(mnt, "d042", "f0777")
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != int64(len("42/777")) {
		t.Fatalf("size %d", fi.Size())
	}
	if n := st.totalReads(); n != 2 {
		t.Errorf("lookup made %d object reads, want 2", n)
	}
	st.mu.Lock()
	clear(st.reads)
	st.mu.Unlock()
	if got := f.Counters.TreeReads.Load(); got != 2 {
		t.Errorf("lookup read %d trees, want 2 (root and d042)", got)
	}
	if f.Counters.BlobVerifies.Load() != 0 {
		t.Errorf("lookup read a blob")
	}
	got, err := os.ReadFile(p)
	if err != nil || string(got) != "42/777" {
		t.Fatalf("read = %q, %v", got, err)
	}
	blob := cas.Sum([]byte("42/777"))
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, n := range st.reads {
		if id != blob {
			t.Errorf("open+read read object %s (%d times); only the blob should be read", id.Short(), n)
		}
	}
	if st.reads[blob] == 0 {
		t.Errorf("open+read never read the blob")
	}
	if f.Counters.BlobVerifies.Load() != 1 {
		t.Errorf("blob verified %d times, want once", f.Counters.BlobVerifies.Load())
	}
}

// A projected directory never changes, so the kernel may keep its
// listing: the second listing of a directory is served without the
// server (Readdirs counts the listings the server made).
func TestDirectoryListingIsCached(t *testing.T) {
	ctx := context.Background()
	st := newCountingStore()
	b := cas.NewBuilder(st, cas.ZeroID)
	var want []string
	for i := range 300 { // several READDIRPLUS replies' worth
		name := fmt.Sprintf("d/f%03d", i)
		want = append(want, name[2:])
		if err := b.Put(ctx, name, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: cas.Sum([]byte("x"))}, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	f, mnt := mount(t, st, root)
	list := func() []string {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(mnt, "d"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	for round := range 3 {
		if got := list(); !slices.Equal(got, want) {
			t.Fatalf("listing %d: %d names %v..., want %d", round, len(got), got[:min(3, len(got))], len(want))
		}
	}
	if n := f.Counters.Readdirs.Load(); n != 1 {
		t.Fatalf("the server listed the directory %d times, want once", n)
	}
}

// flakyStore fails the first Get of one object with an error that is
// neither "not found" nor corruption.
type flakyStore struct {
	*countingStore
	mu    sync.Mutex
	flaky cas.ID
	fails int
}

func (s *flakyStore) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil { // as the local store does
		return nil, fmt.Errorf("get %s: %w", id, err)
	}
	s.mu.Lock()
	fail := id == s.flaky && s.fails > 0
	if fail {
		s.fails--
	}
	s.mu.Unlock()
	if fail {
		return nil, fmt.Errorf("get %s: a transient failure", id)
	}
	return s.countingStore.Get(ctx, id)
}

// A tree that could not be read for a passing reason (an interrupted
// request, a transient store error) is read again on the next use instead
// of failing its directory for good; a missing one stays missing.
func TestTreeReadFailuresThatPassAreRetried(t *testing.T) {
	ctx := context.Background()
	st := &flakyStore{countingStore: newCountingStore()}
	b := cas.NewBuilder(st, cas.ZeroID)
	if err := b.Put(ctx, "d/f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: st.blob(t, "x")}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cas.ReadTree(ctx, st, root)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := tr.Lookup("d")
	st.flaky, st.fails = d.ID, 1

	f, err := New(Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	// A request the kernel interrupted (its context cancelled) still
	// reads the tree: no EINTR for an lstat that got a signal.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	n := &dirNode{fsys: f, root: root, id: root}
	if errno := n.ensure(cancelled); errno != 0 || n.tree == nil {
		t.Fatalf("ensure with a cancelled request: %v", errno)
	}
	// A transient store error fails this use only.
	flaky := &dirNode{fsys: f, root: root, path: "d", id: d.ID}
	if errno := flaky.ensure(ctx); errno == 0 {
		t.Fatal("ensure of a tree whose read failed succeeded")
	}
	if errno := flaky.ensure(ctx); errno != 0 || flaky.tree == nil {
		t.Fatalf("ensure after the store recovered: %v", errno)
	}
	// A missing tree stays missing (and is not read again).
	missing := &dirNode{fsys: f, root: root, id: cas.Sum([]byte("no such tree"))}
	reads := f.Counters.TreeReads.Load()
	for range 2 {
		if errno := missing.ensure(ctx); errno != syscall.ENOENT {
			t.Fatalf("ensure of a missing tree: %v, want ENOENT", errno)
		}
	}
	if got := f.Counters.TreeReads.Load() - reads; got != 1 {
		t.Fatalf("a missing tree was read %d times, want once", got)
	}
}

func TestStatsFile(t *testing.T) {
	ctx := context.Background()
	st := newCountingStore()
	b := cas.NewBuilder(st, cas.ZeroID)
	if err := b.Put(ctx, "f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: st.blob(t, "x")}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	_, mnt := mount(t, st, root)
	if _, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(mnt, "..", "..", StatsName))
	if err != nil {
		t.Fatal(err)
	}
	var snap Snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		t.Fatalf("stats %q: %v", raw, err)
	}
	if snap.Opens != 1 || snap.Lookups < 1 || snap.TreeReads != 1 {
		t.Fatalf("stats after one open: %+v", snap)
	}
	if err := os.WriteFile(filepath.Join(mnt, "..", "..", StatsName), nil, 0o644); err == nil {
		t.Fatal("stats file is writable")
	}
}

// A root the store lacks is not remembered as missing: a seal's node is
// committed before its small batch is linked into the store (the one-flush
// seal, fabric/storeredo.go), and a collected root comes back when a later
// seal makes the same tree. A lookup of roots/<id> in that window must not
// leave a negative entry that hides the root once it is stored.
func TestMissingRootIsNotCachedAsMissing(t *testing.T) {
	ctx := context.Background()
	src := newCountingStore()
	b := cas.NewBuilder(src, cas.ZeroID)
	if err := b.Put(ctx, "f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: src.blob(t, "x")}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	st := newCountingStore()
	_, dir := mount(t, st, root)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("stat of a root the store lacks: %v, want ENOENT", err)
	}
	st.mu.Lock()
	for id, data := range src.m {
		st.m[id] = data
	}
	st.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Fatalf("the root once stored: %v", err)
	}
}

// The same for a subdirectory whose tree the store lacks: a seal links its
// small batch in id order, so a root can be stored before a tree under it.
func TestMissingSubtreeIsNotCachedAsMissing(t *testing.T) {
	ctx := context.Background()
	src := newCountingStore()
	b := cas.NewBuilder(src, cas.ZeroID)
	if err := b.Put(ctx, "d/f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: src.blob(t, "x")}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cas.ReadTree(ctx, src, root)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := tr.Lookup("d")
	st := newCountingStore()
	for id, data := range src.m {
		if id != d.ID {
			st.m[id] = data
		}
	}
	_, dir := mount(t, st, root)
	if _, err := os.Stat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Fatalf("stat of a directory whose tree the store lacks: %v, want ENOENT", err)
	}
	st.mu.Lock()
	st.m[d.ID] = src.m[d.ID]
	st.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "d", "f")); err != nil {
		t.Fatalf("the tree once stored: %v", err)
	}
}
