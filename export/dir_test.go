package export

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/errdefs"
)

func TestToDirRoundTrip(t *testing.T) {
	requireRoot(t)
	s := mem.New()
	specs := sampleSpecs()
	root := buildSpecs(t, s, specs)
	dest := filepath.Join(t.TempDir(), "out")
	var progress int64
	st, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true, Progress: func(n int64) { progress += n }})
	if err != nil {
		t.Fatal(err)
	}
	checkDir(t, dest, specs, true)
	if want := expectedStats(specs); !reflect.DeepEqual(st, want) {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	if progress != st.Bytes {
		t.Errorf("progress reported %d bytes, stats %d", progress, st.Bytes)
	}
}

// An existing empty directory is a valid destination and takes the root's
// attributes.
func TestToDirIntoEmptyDir(t *testing.T) {
	requireRoot(t)
	s := mem.New()
	specs := sampleSpecs()
	root := buildSpecs(t, s, specs)
	dest := t.TempDir()
	if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	checkDir(t, dest, specs, true)
}

func TestToDirNoOwnershipNoXattrs(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "", typ: cas.TypeDir, attr: cas.Attr{Mode: 0o755, UID: 4242, GID: 4243, MtimeNs: ts0}},
		{path: "f", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o640, UID: 4242, GID: 4243, MtimeNs: ts0, Xattrs: xattrs("user.x", "1")}, content: "f"},
		{path: "l", typ: cas.TypeSymlink, attr: cas.Attr{Mode: 0o777, UID: 4242, MtimeNs: ts0}, target: "f"},
	}
	root := buildSpecs(t, s, specs)
	dest := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true, NoOwnership: true, NoXattrs: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "f", "l"} {
		st := lstat(t, filepath.Join(dest, p))
		if st.Uid != uint32(os.Geteuid()) {
			t.Errorf("%q: owner %d, want the exporter's %d", p, st.Uid, os.Geteuid())
		}
		if xs := listXattrs(t, filepath.Join(dest, p)); len(xs) != 0 {
			t.Errorf("%q: xattrs %v with NoXattrs", p, xs)
		}
	}
	// Everything but owners and xattrs is still exact.
	if st := lstat(t, filepath.Join(dest, "f")); st.Mode&0o7777 != 0o640 || st.Mtim.Nano() != ts0 {
		t.Errorf("f: mode %o mtime %d", st.Mode&0o7777, st.Mtim.Nano())
	}
}

func TestToDirDestination(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, []spec{{path: "f", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "x"}})
	cases := []struct {
		name  string
		setup func(t *testing.T, base string) string
		class error // nil: success
	}{
		{"missing", func(t *testing.T, base string) string { return filepath.Join(base, "new") }, nil},
		{"empty dir", func(t *testing.T, base string) string { return base }, nil},
		{"trailing slash", func(t *testing.T, base string) string { return base + "/" }, nil},
		{"not empty", func(t *testing.T, base string) string {
			os.WriteFile(filepath.Join(base, "x"), nil, 0o644)
			return base
		}, errdefs.ErrFailedPrecondition},
		{"only a dotfile", func(t *testing.T, base string) string {
			os.WriteFile(filepath.Join(base, ".x"), nil, 0o644)
			return base
		}, errdefs.ErrFailedPrecondition},
		{"regular file", func(t *testing.T, base string) string {
			p := filepath.Join(base, "file")
			os.WriteFile(p, nil, 0o644)
			return p
		}, errdefs.ErrFailedPrecondition},
		{"symlink to empty dir", func(t *testing.T, base string) string {
			os.Mkdir(filepath.Join(base, "real"), 0o755)
			p := filepath.Join(base, "link")
			os.Symlink("real", p)
			return p
		}, errdefs.ErrFailedPrecondition},
		{"symlink with trailing slash", func(t *testing.T, base string) string {
			os.Mkdir(filepath.Join(base, "real"), 0o755)
			os.Symlink("real", filepath.Join(base, "link"))
			return filepath.Join(base, "link") + "//"
		}, errdefs.ErrFailedPrecondition},
		{"dangling symlink", func(t *testing.T, base string) string {
			p := filepath.Join(base, "link")
			os.Symlink("nowhere", p)
			return p
		}, errdefs.ErrFailedPrecondition},
		{"missing parent", func(t *testing.T, base string) string { return filepath.Join(base, "no", "dest") }, errdefs.ErrNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			dest := c.setup(t, base)
			before := snapshot(t, base)
			_, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
			if c.class == nil {
				if err != nil {
					t.Fatal(err)
				}
				if b, err := os.ReadFile(filepath.Join(dest, "f")); err != nil || string(b) != "x" {
					t.Fatalf("f = %q, %v", b, err)
				}
				return
			}
			if !errors.Is(err, c.class) {
				t.Fatalf("err = %v, want %v", err, c.class)
			}
			checkUntouched(t, base, before)
		})
	}
}

func TestToDirCorruptBlob(t *testing.T) {
	for _, size := range []int{5, 3<<20 + 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := mem.New()
			specs := []spec{
				{path: "a", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "good"},
				{path: "d/b", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: pattern(size)},
				{path: "d/c", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "after"},
			}
			root := buildSpecs(t, s, specs)
			id, _ := putBlob(t, s, pattern(size))
			if err := s.Corrupt(id); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(t.TempDir(), "out")
			_, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
			if !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if _, err := os.Lstat(filepath.Join(dest, "d", "b")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("corrupt file exists under its final name (lstat err %v)", err)
			}
			if _, err := os.Lstat(filepath.Join(dest, "d", "c")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("export went on after the corrupt blob (lstat err %v)", err)
			}
			if left := tempLeftovers(t, dest); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// A blob that hashes right but does not have the size its entry claims is
// corrupt too: the entry and the content disagree.
func TestToDirSizeMismatch(t *testing.T) {
	for _, delta := range []int64{-1, 1} {
		t.Run(fmt.Sprint(delta), func(t *testing.T) {
			s := mem.New()
			id, size := putBlob(t, s, "twelve bytes")
			b := cas.NewBuilder(s, cas.ZeroID)
			if err := b.Put(context.Background(), "f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, ID: id, Size: size + delta}, ""); err != nil {
				t.Fatal(err)
			}
			root, err := b.Write(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(t.TempDir(), "out")
			_, err = ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
			if !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if ents, _ := os.ReadDir(dest); len(ents) != 0 {
				t.Errorf("dest holds %v", ents)
			}
			_, err = ToTar(context.Background(), s, root, io.Discard, Options{PreservePrivileged: true})
			if !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("tar: err = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestToDirMissingObjects(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "d/f", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "missing blob"},
	}
	root := buildSpecs(t, s, specs)
	blob, _ := putBlob(t, s, "missing blob")
	s.Delete(context.Background(), blob)
	dest := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("missing blob: err = %v, want ErrNotFound", err)
	}
	if left := tempLeftovers(t, dest); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// A missing root creates nothing at all.
	dest2 := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), s, cas.Sum([]byte("nope")), dest2, Options{PreservePrivileged: true}); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("missing root: err = %v, want ErrNotFound", err)
	}
	if _, err := os.Lstat(dest2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing root created dest (lstat err %v)", err)
	}
}

func TestToDirCancel(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "a", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "first"},
		{path: "b", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "cancel here"},
		{path: "c", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "never"},
	}
	root := buildSpecs(t, s, specs)

	t.Run("before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		dest := filepath.Join(t.TempDir(), "out")
		if _, err := ToDir(ctx, s, root, dest, Options{PreservePrivileged: true}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if _, err := os.Lstat(dest); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cancelled export created dest")
		}
	})
	t.Run("during", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b, _ := putBlob(t, s, "cancel here")
		s.SetFault(func(op mem.Op, id cas.ID) error {
			if op == mem.OpGet && id == b {
				cancel()
			}
			return nil
		})
		defer s.SetFault(nil)
		dest := filepath.Join(t.TempDir(), "out")
		if _, err := ToDir(ctx, s, root, dest, Options{PreservePrivileged: true}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		for name, want := range map[string]bool{"a": true, "b": false, "c": false} {
			_, err := os.Lstat(filepath.Join(dest, name))
			if got := err == nil; got != want {
				t.Errorf("%s exists = %v, want %v", name, got, want)
			}
		}
		if left := tempLeftovers(t, dest); len(left) != 0 {
			t.Errorf("temporary files left: %v", left)
		}
	})
}

func countFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A deep tree needs one descriptor per level and leaks none.
func TestToDirDeepTreeDescriptors(t *testing.T) {
	const depth = 200
	s := mem.New()
	p := strings.Repeat("d/", depth) + "leaf"
	hard := strings.Repeat("d/", depth/2) + "hard"
	root := buildSpecs(t, s, []spec{
		{path: p, typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "bottom"},
		{path: hard, linkTo: p},
	})
	base := countFDs(t)
	var peak atomic.Int64
	s.SetFault(func(op mem.Op, _ cas.ID) error {
		if n := int64(countFDs(t)); n > peak.Load() {
			peak.Store(n)
		}
		return nil
	})
	dest := filepath.Join(t.TempDir(), "out")
	st, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
	s.SetFault(nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dirs != depth+1 || st.Files != 1 || st.Links != 1 {
		t.Errorf("stats %+v", st)
	}
	if b, err := os.ReadFile(filepath.Join(dest, hard)); err != nil || string(b) != "bottom" {
		t.Errorf("hard link: %q, %v", b, err)
	}
	if after := countFDs(t); after != base {
		t.Errorf("descriptors: %d before, %d after", base, after)
	}
	// The reading of /proc/self/fd itself holds one.
	if max := int64(base + depth + 4); peak.Load() > max {
		t.Errorf("peak descriptors %d, want at most %d (one per level)", peak.Load(), max)
	}
}

// bigGetter serves one large generated blob without storing it, so the test
// proves streaming: nothing ever holds the whole content in memory.
type bigGetter struct {
	cas.Getter
	id   cas.ID
	size int64
}

// patternReader yields size bytes repeating a fixed block that is not a
// power-of-two fraction of the buffer sizes, so misplaced chunks would show.
type patternReader struct{ off, size int64 }

var patternBlock = []byte(pattern(65521))

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if rest := r.size - r.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	n := 0
	for n < len(p) {
		n += copy(p[n:], patternBlock[(r.off+int64(n))%int64(len(patternBlock)):])
	}
	r.off += int64(n)
	return n, nil
}

func (g *bigGetter) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	if id == g.id {
		return cas.VerifyingReader(id, io.NopCloser(&patternReader{size: g.size})), nil
	}
	return g.Getter.Get(ctx, id)
}

func TestLargeFileStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100 MiB")
	}
	const size = 100 << 20
	h := cas.NewHasher()
	io.CopyBuffer(h, &patternReader{size: size}, make([]byte, 1<<20))
	id := cas.IDFromHash(h)
	s := mem.New()
	b := cas.NewBuilder(s, cas.ZeroID)
	if err := b.Put(context.Background(), "big", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, ID: id, Size: size}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	g := &bigGetter{Getter: s, id: id, size: size}

	measure := func(f func()) uint64 {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		f()
		runtime.ReadMemStats(&m1)
		return m1.TotalAlloc - m0.TotalAlloc
	}
	// The copy buffer plus whatever garbage BLAKE3 makes while verifying
	// (lukechampine.com/blake3 made about 5% of the bytes hashed): far
	// below the 100 MiB a buffered copy would take.
	const budget = 16 << 20
	dest := filepath.Join(t.TempDir(), "out")
	var st Stats
	alloc := measure(func() { st, err = ToDir(context.Background(), g, root, dest, Options{PreservePrivileged: true}) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != size || alloc > budget {
		t.Errorf("ToDir: %d bytes, allocated %d (budget %d)", st.Bytes, alloc, budget)
	}
	t.Logf("ToDir of 100 MiB allocated %d bytes", alloc)
	f, err := os.Open(filepath.Join(dest, "big"))
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	io.CopyBuffer(h, f, make([]byte, 1<<20))
	f.Close()
	if cas.IDFromHash(h) != id {
		t.Error("exported content differs")
	}

	var n int64
	alloc = measure(func() {
		_, err = ToTar(context.Background(), g, root, countWriter{&n}, Options{PreservePrivileged: true})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < size || alloc > budget {
		t.Errorf("ToTar: %d bytes, allocated %d (budget %d)", n, alloc, budget)
	}
	t.Logf("ToTar of 100 MiB allocated %d bytes", alloc)
}

type countWriter struct{ n *int64 }

func (w countWriter) Write(p []byte) (int, error) { *w.n += int64(len(p)); return len(p), nil }

// Two exports may run at once; each keeps to its own state.
func TestToDirConcurrent(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "a/f", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "one"},
		{path: "a/g", linkTo: "a/f"},
		{path: "b", typ: cas.TypeSymlink, attr: cas.Attr{Mode: 0o777}, target: "a/f"},
	}
	root := buildSpecs(t, s, specs)
	base := t.TempDir()
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := ToDir(context.Background(), s, root, filepath.Join(base, fmt.Sprint(i)), Options{PreservePrivileged: true, NoOwnership: true})
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for i := range 4 {
		var a, b unix.Stat_t
		unix.Lstat(filepath.Join(base, fmt.Sprint(i), "a/f"), &a)
		unix.Lstat(filepath.Join(base, fmt.Sprint(i), "a/g"), &b)
		if a.Ino == 0 || a.Ino != b.Ino {
			t.Errorf("export %d: a/g is not a link of a/f", i)
		}
	}
}

// Xattrs the kernel refuses (user.* on a symlink is EPERM) are skipped,
// counted and warned about once per name; the export goes on.
func TestToDirSkipsRefusedXattrs(t *testing.T) {
	s := mem.New()
	var entries []cas.Entry
	for _, name := range []string{"l1", "l2"} {
		e := symlinkEntry(name, "target")
		e.Xattrs = xattrs("user.refused", "v")
		entries = append(entries, e)
	}
	root := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: entries})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dest := filepath.Join(t.TempDir(), "out")
	st, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if st.Symlinks != 2 || st.Skipped != 2 {
		t.Errorf("stats %+v, want 2 symlinks and 2 skipped xattrs", st)
	}
	if n := strings.Count(logs.String(), "skipped xattr"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	if got, err := os.Readlink(filepath.Join(dest, "l2")); err != nil || got != "target" {
		t.Errorf("l2 -> %q, %v", got, err)
	}
}

// Every way a file reaches its final name gives the same tree: unnamed
// (O_TMPFILE) and linked by descriptor or through /proc, or under a
// temporary name and renamed (a file system without O_TMPFILE), where a
// tree's own entries on the temporary names are left alone. None leaves a
// temporary file, and a corrupt blob never gets its final name.
func TestToDirEveryWayToPlaceAFile(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name            string
		named, procLink bool
	}{{"unnamed", false, false}, {"unnamed via /proc", false, true}, {"named", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			forceNamedTemps, forceProcLink = c.named, c.procLink
			t.Cleanup(func() { forceNamedTemps, forceProcLink = false, false })
			s := mem.New()
			specs := sampleSpecs()
			root := buildSpecs(t, s, specs)
			dest := filepath.Join(t.TempDir(), "out")
			if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); err != nil {
				t.Fatal(err)
			}
			checkDir(t, dest, specs, true)

			victim := filepath.Join(t.TempDir(), "victim")
			onTemps := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{
				symlinkEntry(".esf-export-1.tmp", victim), symlinkEntry(".esf-export-2.tmp", victim), fileEntry(t, s, "f", "content"),
			}})
			dest = filepath.Join(t.TempDir(), "temps")
			if _, err := ToDir(context.Background(), s, onTemps, dest, Options{}); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(dest, "f")); string(b) != "content" {
				t.Errorf("f = %q", b)
			}
			if got, _ := os.Readlink(filepath.Join(dest, ".esf-export-1.tmp")); got != victim {
				t.Errorf("symlink on a temporary name replaced: %q", got)
			}
			if _, err := os.Lstat(victim); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("written through a symlink on a temporary name (lstat err %v)", err)
			}

			id, _ := putBlob(t, s, "corrupt me")
			if err := s.Corrupt(id); err != nil {
				t.Fatal(err)
			}
			bad := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{
				{Name: "a", Type: cas.TypeFile, ID: id, Size: int64(len("corrupt me")), Attr: cas.Attr{Mode: 0o644}},
			}})
			dest = filepath.Join(t.TempDir(), "bad")
			if _, err := ToDir(context.Background(), s, bad, dest, Options{}); !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("corrupt blob: err = %v, want ErrCorrupt", err)
			}
			if _, err := os.Lstat(filepath.Join(dest, "a")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("corrupt file exists under its final name (lstat err %v)", err)
			}
			if left := tempLeftovers(t, dest); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}
