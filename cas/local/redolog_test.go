//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// putSmall commits a batch of n random objects of size bytes and returns
// their contents; syncfs counts the batch's syncfs calls.
func putSmall(t *testing.T, s *Store, n, size int, syncfs *int) [][]byte {
	t.Helper()
	ctx := context.Background()
	b := s.NewBatch().(*batch)
	b.syncfs = func(fd int) error { *syncfs++; return nil }
	defer b.Abort()
	var out [][]byte
	for range n {
		c := make([]byte, size)
		rand.Read(c)
		if _, _, err := b.Put(ctx, bytes.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkObjects(t *testing.T, s *Store, objs [][]byte) {
	t.Helper()
	for _, c := range objs {
		got, err := cas.ReadAll(context.Background(), s, cas.Sum(c))
		if err != nil || !bytes.Equal(got, c) {
			t.Fatalf("object %s: %v", cas.Sum(c), err)
		}
	}
}

// TestRedoLogMakesSmallBatchesDurable: a batch of small objects commits
// with no syncfs (one fdatasync of the redo log), and Open rewrites what a
// machine crash could lose of it: a link, a fan-out directory, the bytes
// of an unflushed file.
func TestRedoLogMakesSmallBatchesDurable(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	syncs := 0
	objs := putSmall(t, s, 5, 4096, &syncs)
	objs = append(objs, putSmall(t, s, 1, 10, &syncs)...)
	if syncs != 0 {
		t.Fatalf("small batches called syncfs %d times, want 0", syncs)
	}
	checkObjects(t, s, objs)

	// The crash: every redo name gone (their data was never flushed), the
	// first object's link lost, the second's bytes lost, the third's
	// whole fan-out directory lost.
	ents, _ := os.ReadDir(s.tmp)
	for _, e := range ents {
		os.Remove(filepath.Join(s.tmp, e.Name()))
	}
	ids := []cas.ID{cas.Sum(objs[0]), cas.Sum(objs[1]), cas.Sum(objs[2])}
	if err := os.Remove(s.Path(ids[0])); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(s.Path(ids[1]), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(s.fanoutDir(ids[2])); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkObjects(t, s2, objs)
	for _, id := range ids {
		fi, err := os.Stat(s2.Path(id))
		if err != nil || fi.Mode() != 0o444 {
			t.Fatalf("redone object %s: %v %v", id, fi.Mode(), err)
		}
	}
	// The replayed generation is over: a third Open has nothing to redo.
	if err := os.Remove(s2.Path(ids[0])); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if has, _ := s3.Has(context.Background(), ids[0]); has {
		t.Fatal("an object of a replayed generation came back: the log was not restarted")
	}
}

// TestRedoLogFullFlushesAndRestarts: when the log is full, the commit that
// finds it so makes every earlier object durable with one syncfs, retires
// the batches' redo names and starts a new generation; what it logs next
// survives a reopen.
func TestRedoLogFullFlushesAndRestarts(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	syncs := 0
	s.log.syncfs = func(fd int) error { syncs++; return nil }
	gen := s.log.gen
	var objs [][]byte
	for i := 0; s.log.gen == gen; i++ {
		if i > 2*redoSize/(64<<10) {
			t.Fatal("the log never restarted")
		}
		objs = append(objs, putSmall(t, s, 1, 64<<10, new(int))...)
	}
	if syncs != 1 {
		t.Fatalf("the full log called syncfs %d times, want 1", syncs)
	}
	if got := len(redoRecords(s)); got != 1 {
		t.Fatalf("%d redo names after the restart, want the last batch's 1", got)
	}
	checkObjects(t, s, objs)
	last := objs[len(objs)-1]
	if err := os.Remove(s.Path(cas.Sum(last))); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkObjects(t, s2, [][]byte{last})
}

// TestRedoLogSkipsBigBatches: a batch with a streamed object, or more
// than the log takes, flushes with syncfs as before.
func TestRedoLogSkipsBigBatches(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	syncs := 0
	putSmall(t, s, 1, bufSize+1, &syncs)
	if syncs != 1 {
		t.Fatalf("a batch with a large object called syncfs %d times, want 1", syncs)
	}
	putSmall(t, s, redoMaxObjects+1, 10, &syncs)
	if syncs != 2 {
		t.Fatalf("a batch of %d objects called syncfs %d times in all, want 2", redoMaxObjects+1, syncs)
	}
}

// TestRedoLogTornRecordEndsReplay: a record whose bytes do not hash to its
// id (a write the crash tore) ends the replay; the records before it are
// redone, nothing after it is.
func TestRedoLogTornRecordEndsReplay(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := putSmall(t, s, 2, 100, new(int))
	off := s.log.off
	second := putSmall(t, s, 2, 100, new(int))
	// Flip one byte of the second batch's first object.
	f, err := os.OpenFile(filepath.Join(dir, redoName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'!'}, off+redoRecHead+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, c := range append(append([][]byte{}, first...), second...) {
		if err := os.Remove(s.Path(cas.Sum(c))); err != nil {
			t.Fatal(err)
		}
	}
	// Their unflushed redo names went with the crash too.
	ents, _ := os.ReadDir(s.tmp)
	for _, e := range ents {
		os.Remove(filepath.Join(s.tmp, e.Name()))
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkObjects(t, s2, first)
	for _, c := range second {
		if has, _ := s2.Has(context.Background(), cas.Sum(c)); has {
			t.Errorf("object %s after the torn record came back", cas.Sum(c))
		}
	}
}
