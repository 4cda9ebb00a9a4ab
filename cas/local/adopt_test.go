//go:build linux

package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

func writeRandom(t *testing.T, p string, n int, mode os.FileMode) []byte {
	t.Helper()
	c := make([]byte, n)
	rand.Read(c)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, c, mode); err != nil {
		t.Fatal(err)
	}
	return c
}

func statOf(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func adopt(t *testing.T, b cas.Batch, p string) (cas.Info, bool, error) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return b.(cas.Adopter).Adopt(context.Background(), f, f)
}

// TestBatchAdopt: an adopted file becomes its object without a copy (same
// inode, read-only, the store's owner and no set-id bit, so its writer
// cannot make it writable again), visible and durable at Commit like a
// Put's; content already stored leaves the file alone.
func TestBatchAdopt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "store"))
	p := filepath.Join(dir, "upper", "big")
	c := writeRandom(t, p, 2<<20+3, 0o640)
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o4750); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	defer b.Abort()
	info, created, err := adopt(t, b, p)
	if err != nil || !created || info.ID != cas.Sum(c) || info.Size != int64(len(c)) {
		t.Fatalf("adopt: %+v created %v, %v", info, created, err)
	}
	if has, err := s.Has(ctx, info.ID); err != nil || has {
		t.Fatalf("adopted object visible before Commit: %v %v", has, err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	up, obj := statOf(t, p), statOf(t, s.Path(info.ID))
	if up.Ino != obj.Ino || obj.Mode&0o7777 != 0o444 {
		t.Fatalf("object inode %d mode %o, file inode %d: want the file's inode, read-only", obj.Ino, obj.Mode&0o7777, up.Ino)
	}
	if int(obj.Uid) != os.Geteuid() || int(obj.Gid) != os.Getegid() {
		t.Fatalf("adopted object owned by %d:%d, want the store's %d:%d", obj.Uid, obj.Gid, os.Geteuid(), os.Getegid())
	}
	if got, err := cas.ReadAll(ctx, s, info.ID); err != nil || !bytes.Equal(got, c) {
		t.Fatalf("read adopted object: %v", err)
	}

	// The same content again: stored already, the second file untouched.
	p2 := filepath.Join(dir, "upper", "again")
	if err := os.WriteFile(p2, c, 0o600); err != nil {
		t.Fatal(err)
	}
	b2 := s.NewBatch()
	defer b2.Abort()
	if _, created, err := adopt(t, b2, p2); err != nil || created {
		t.Fatalf("adopt of stored content: created %v, %v", created, err)
	}
	if err := b2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := statOf(t, p2); st.Nlink != 1 || st.Mode&0o7777 != 0o600 {
		t.Fatalf("file of stored content: %d links, mode %o; want untouched", st.Nlink, st.Mode&0o7777)
	}
}

// TestBatchAdoptRedoAfterLostLink: an adopted object whose link into
// objects/ a crash lost comes back at Open from its redo record, as a
// Put's does (the same protocol).
func TestBatchAdoptRedoAfterLostLink(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sd := filepath.Join(dir, "store")
	s := open(t, sd)
	p := filepath.Join(dir, "upper", "big")
	c := writeRandom(t, p, 1<<20+1, 0o644)
	b := s.NewBatch()
	info, _, err := adopt(t, b, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The crash: the link was never written back.
	if err := os.Remove(s.Path(info.ID)); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, sd)
	if got, err := cas.ReadAll(ctx, s2, info.ID); err != nil || !bytes.Equal(got, c) {
		t.Fatalf("adopted object after the redo: %v", err)
	}
}

// changingReader appends to the file it reads once it is half read.
type changingReader struct {
	f    *os.File
	n    int64
	done bool
}

func (r *changingReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	r.n += int64(n)
	if !r.done && r.n > 1<<20 {
		r.done = true
		w, werr := os.OpenFile(r.f.Name(), os.O_WRONLY|os.O_APPEND, 0)
		if werr != nil {
			return n, werr
		}
		w.Write([]byte("more"))
		w.Close()
	}
	return n, err
}

// TestBatchAdoptChangedFile: a file written while it is hashed is not
// adopted (its hash would not name what the store then holds).
func TestBatchAdoptChangedFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "store"))
	p := filepath.Join(dir, "upper", "big")
	writeRandom(t, p, 2<<20, 0o644)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := s.NewBatch()
	defer b.Abort()
	_, _, err = b.(cas.Adopter).Adopt(context.Background(), f, &changingReader{f: f})
	if !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("adopt of a file written meanwhile: %v, want failed precondition", err)
	}
	if st := statOf(t, p); st.Nlink != 1 || st.Mode&0o7777 != 0o644 {
		t.Fatalf("file after the refused adoption: %d links, mode %o", st.Nlink, st.Mode&0o7777)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "store", "tmp"))
	if len(ents) != 0 {
		t.Fatalf("temp files left: %v", ents)
	}
}

// TestBatchAdoptOtherFileSystem: a file the store cannot link (tmpfs) is
// copied, and keeps its inode and mode.
func TestBatchAdoptOtherFileSystem(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "store"))
	other, err := os.MkdirTemp("/dev/shm", "esf-adopt-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	if statOf(t, other).Dev == statOf(t, dir).Dev {
		t.Skip("/dev/shm is on the store's file system")
	}
	p := filepath.Join(other, "big")
	c := writeRandom(t, p, 2<<20, 0o644)
	b := s.NewBatch()
	defer b.Abort()
	info, created, err := adopt(t, b, p)
	if err != nil || !created {
		t.Fatalf("adopt across file systems: created %v, %v", created, err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := statOf(t, p); st.Nlink != 1 || st.Mode&0o7777 != 0o644 {
		t.Fatalf("file on another file system: %d links, mode %o; want untouched", st.Nlink, st.Mode&0o7777)
	}
	f, err := s.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || !bytes.Equal(got, c) {
		t.Fatalf("copied object: %v", err)
	}
}
