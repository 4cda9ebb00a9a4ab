package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/castest"
	"github.com/esf-dev/esf/cas/local"
)

// harness gives the suite its hooks into a disk store.
type harness struct{ *local.Store }

// Corrupt flips the last byte of the object file in place, as a bad disk
// would: same inode, same size, same name.
func (h harness) Corrupt(t testing.TB, id cas.ID) {
	t.Helper()
	p := h.Path(id)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		t.Fatalf("corrupt %s: cannot flip a byte of a %d-byte object (%v)", id.Short(), fi.Size(), err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, fi.Size()-1); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, fi.Size()-1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
}

func (h harness) TempFiles(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(h.Dir(), "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if !isRedoRecord(h.Store, e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names
}

// isRedoRecord reports whether tmp/name is a batch's redo record awaiting
// retirement (see NewBatch): a second link of the object it names.
func isRedoRecord(s *local.Store, name string) bool {
	rest, ok := strings.CutPrefix(name, "pub-")
	if !ok || len(rest) < 2*cas.IDSize {
		return false
	}
	id, err := cas.ParseID(rest[:2*cas.IDSize])
	if err != nil {
		return false
	}
	a, err1 := os.Lstat(filepath.Join(s.Dir(), "tmp", name))
	b, err2 := os.Lstat(s.Path(id))
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

func open(t testing.TB, dir string) *local.Store {
	t.Helper()
	s, err := local.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	castest.Run(t, func(t *testing.T) cas.Store { return harness{open(t, t.TempDir())} })
}

func TestLayoutAndMode(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	for _, size := range []int{0, 5, 1 << 20} {
		b := make([]byte, size)
		rand.Read(b)
		info, _, err := s.Put(ctx, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		h := info.ID.String()
		want := filepath.Join(dir, "objects", h[:2], h[2:])
		if s.Path(info.ID) != want {
			t.Fatalf("Path = %s, want %s", s.Path(info.ID), want)
		}
		fi, err := os.Lstat(want)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o444 || fi.Size() != int64(size) {
			t.Fatalf("object file mode %v size %d, want -r--r--r-- %d", fi.Mode(), fi.Size(), size)
		}
		// The FUSE layer reads the file directly.
		if got, err := os.ReadFile(want); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("object file content differs (%v)", err)
		}
	}
	if left := (harness{s}).TempFiles(t); len(left) != 0 {
		t.Fatalf("temp files after successful puts: %q", left)
	}
	if s.Dir() != dir {
		t.Fatalf("Dir = %s, want %s", s.Dir(), dir)
	}
}

func TestPutExistingLeavesStoredCopyAlone(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	for _, size := range []int{7, 2 << 20} {
		b := make([]byte, size)
		rand.Read(b)
		info, _, err := s.Put(ctx, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		before := statT(t, s.Path(info.ID))
		time.Sleep(10 * time.Millisecond) // so a rewrite would show in ctime
		if _, created, err := s.Put(ctx, bytes.NewReader(b)); err != nil || created {
			t.Fatalf("re-put: created %v, %v", created, err)
		}
		after := statT(t, s.Path(info.ID))
		if before.Ino != after.Ino || before.Ctim != after.Ctim || before.Mtim != after.Mtim {
			t.Fatalf("re-put of %d bytes touched the stored file: ino %d->%d ctime %v->%v",
				size, before.Ino, after.Ino, before.Ctim, after.Ctim)
		}
		if left := (harness{s}).TempFiles(t); len(left) != 0 {
			t.Fatalf("temp files after re-put: %q", left)
		}
	}
}

func statT(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// The suite only asks for at least one winner; rename without replace gives
// exactly one, which keeps "created" counts (quota, metrics) exact.
func TestConcurrentSamePutHasOneWinner(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{10, 1 << 20} {
		s := open(t, t.TempDir())
		b := make([]byte, size)
		rand.Read(b)
		var wg sync.WaitGroup
		var mu sync.Mutex
		created := 0
		for range 12 {
			wg.Go(func() {
				_, c, err := s.Put(ctx, bytes.NewReader(b))
				if err != nil {
					t.Error(err)
				}
				if c {
					mu.Lock()
					created++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if created != 1 {
			t.Fatalf("%d-byte object: %d concurrent puts reported created, want exactly 1", size, created)
		}
		if left := (harness{s}).TempFiles(t); len(left) != 0 {
			t.Fatalf("temp files left: %q", left)
		}
	}
}

func TestOpenRemovesOnlyStaleTemps(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	tmp := filepath.Join(dir, "tmp")
	old := time.Now().Add(-2 * time.Hour)
	for _, name := range []string{"put-stale", "put-fresh"} {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(filepath.Join(tmp, "put-stale"), old, old); err != nil {
		t.Fatal(err)
	}
	// Disabled cleanup keeps both.
	if _, err := local.Open(dir, &local.Options{StaleTempAge: -1}); err != nil {
		t.Fatal(err)
	}
	if got := (harness{open(t, dir)}).TempFiles(t); len(got) != 1 || got[0] != "put-fresh" {
		t.Fatalf("after Open, tmp holds %q, want only put-fresh (a live Put of another process)", got)
	}
	s, err := local.Open(dir, &local.Options{StaleTempAge: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := (harness{s}).TempFiles(t); len(got) != 0 {
		t.Fatalf("after Open with a tiny StaleTempAge, tmp holds %q", got)
	}
}

func TestReopenKeepsObjects(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	info, _, err := s.Put(ctx, strings.NewReader("persist"))
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir)
	got, err := cas.ReadAll(ctx, s2, info.ID)
	if err != nil || string(got) != "persist" {
		t.Fatalf("after reopen: %q, %v", got, err)
	}
	if _, created, err := s2.Put(ctx, strings.NewReader("persist")); err != nil || created {
		t.Fatalf("put after reopen: created %v, %v", created, err)
	}
}

func TestWalkIgnoresStrays(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	info, _, err := s.Put(ctx, strings.NewReader("real"))
	if err != nil {
		t.Fatal(err)
	}
	h := info.ID.String()
	objects := filepath.Join(dir, "objects")
	strays := []string{
		filepath.Join(objects, "README"),
		filepath.Join(objects, "zz", strings.Repeat("0", 62)),
		filepath.Join(objects, h[:2], "notanid"),
		filepath.Join(objects, h[:2], strings.ToUpper(h[2:])),
		filepath.Join(objects, h[:2], h[2:]+".tmp"),
	}
	for _, p := range strays {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A directory with an object's name is not an object either.
	other := cas.Sum([]byte("dir"))
	if err := os.MkdirAll(s.Path(other), 0o755); err != nil {
		t.Fatal(err)
	}
	var got []cas.Info
	if err := s.Walk(ctx, func(i cas.Info) error { got = append(got, i); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != info {
		t.Fatalf("walk = %+v, want only %+v", got, info)
	}
}

func TestOpenRejectsBadDir(t *testing.T) {
	if _, err := local.Open("", nil); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Fatalf("Open(\"\"): err = %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Open(file, nil); err == nil {
		t.Fatal("Open on a regular file succeeded")
	}
}

func benchPut(b *testing.B, size int, fresh bool) {
	ctx := context.Background()
	s := open(b, b.TempDir())
	buf := make([]byte, size)
	rand.Read(buf)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if fresh {
			// Distinct content each time: the first 8 bytes count.
			for j := range 8 {
				buf[j] = byte(i >> (8 * j))
			}
		}
		if _, _, err := s.Put(ctx, bytes.NewReader(buf)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPutNew4K(b *testing.B)      { benchPut(b, 4<<10, true) }
func BenchmarkPutExisting4K(b *testing.B) { benchPut(b, 4<<10, false) }
func BenchmarkPutNew8M(b *testing.B)      { benchPut(b, 8<<20, true) }

// The import row of the bench suite: one large new object, hashed, written
// and fsynced (the source is in memory, as a file in the page cache is).
func BenchmarkPutNew256M(b *testing.B) { benchPut(b, 256<<20, true) }

func BenchmarkGet4K(b *testing.B) {
	ctx := context.Background()
	s := open(b, b.TempDir())
	info, _, err := s.Put(ctx, bytes.NewReader(make([]byte, 4<<10)))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(info.Size)
	for b.Loop() {
		if _, err := cas.ReadAll(ctx, s, info.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// Deletions moves with every Delete, of a present object or not, and with
// nothing else (Puts, Gets, Stats).
func TestDeletionsCountsRemovals(t *testing.T) {
	s, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	n0, ok := s.Deletions()
	if !ok {
		t.Fatal("the disk store does not count deletions")
	}
	info, _, err := s.Put(ctx, strings.NewReader("counted"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Deletions(); n != n0 {
		t.Fatalf("a Put and a Stat moved the count %d -> %d", n0, n)
	}
	for i := range 2 { // present, then already gone
		if err := s.Delete(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
		n, _ := s.Deletions()
		if n <= n0 {
			t.Fatalf("Delete %d left the count at %d", i, n)
		}
		n0 = n
	}
}
