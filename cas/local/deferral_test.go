//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// deferBatch puts n random objects of size bytes into a batch and commits
// it with a Deferral in its context; it returns the contents.
func deferBatch(t *testing.T, s *Store, d *cas.Deferral, n, size int) [][]byte {
	t.Helper()
	ctx := context.Background()
	b := s.NewBatch().(*batch)
	b.syncfs = func(fd int) error { t.Error("a deferred batch called syncfs"); return nil }
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
	if err := b.Commit(cas.WithDeferral(ctx, d)); err != nil {
		t.Fatal(err)
	}
	return out
}

func logOffset(s *Store) int64 {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return s.log.off
}

func pubNames(t *testing.T, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), pubPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestDeferredBatchPublishesNothingUntilPublish: a small batch committed
// with a Deferral flushes nothing (no redo log append, no syncfs), hands
// over every object's id and bytes and publishes nothing until Publish.
func TestDeferredBatchPublishesNothingUntilPublish(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	off := logOffset(s)
	d := &cas.Deferral{}
	objs := deferBatch(t, s, d, 3, 4096)
	if logOffset(s) != off {
		t.Error("a deferred batch appended to the store's redo log")
	}
	got := d.Objects()
	if len(got) != len(objs) {
		t.Fatalf("deferral holds %d objects, want %d", len(got), len(objs))
	}
	for i, o := range got {
		if cas.Sum(o.Data) != o.ID || !bytes.Equal(o.Data, objs[i]) {
			t.Errorf("deferred object %d: id %s, bytes do not match", i, o.ID)
		}
		if ok, _ := s.Has(ctx, o.ID); ok {
			t.Errorf("object %s published before Publish", o.ID)
		}
	}
	if err := d.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	checkObjects(t, s, objs)
	if len(d.Objects()) != 0 {
		t.Error("a published deferral still lists objects")
	}
	// The redo names stay until a flush of the store retires them.
	if n := len(pubNames(t, s)); n != len(objs) {
		t.Errorf("%d pub- names after Publish, want %d (retired only by a flush)", n, len(objs))
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := pubNames(t, s); len(n) != 0 {
		t.Errorf("pub- names after Sync: %v", n)
	}
	// Ended: a later batch commits on its own.
	more := deferBatch(t, s, d, 1, 100)
	checkObjects(t, s, more)
}

// TestDeferredBatchAbortLeavesNothing: Abort removes the temp files and
// publishes nothing.
func TestDeferredBatchAbortLeavesNothing(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := &cas.Deferral{}
	objs := deferBatch(t, s, d, 2, 1000)
	d.Abort()
	for _, c := range objs {
		if ok, _ := s.Has(context.Background(), cas.Sum(c)); ok {
			t.Errorf("aborted object %s is stored", cas.Sum(c))
		}
	}
	if n := pubNames(t, s); len(n) != 0 {
		t.Errorf("pub- names after Abort: %v", n)
	}
}

// TestDeferralLimitsCommitOnTheirOwn: a batch the Deferral cannot take
// (past its limits) commits as it would without one.
func TestDeferralLimitsCommitOnTheirOwn(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := &cas.Deferral{}
	first := deferBatch(t, s, d, cas.DeferMaxObjects-1, 10)
	second := deferBatch(t, s, d, 2, 10) // would pass DeferMaxObjects
	checkObjects(t, s, second)
	if n := len(d.Objects()); n != len(first) {
		t.Errorf("deferral holds %d objects, want %d", n, len(first))
	}
	d.Abort()
}

// TestRedoRewritesMissingAndDamagedObjects: Redo, the replay of a record
// kept outside the store, rewrites a missing or damaged object, keeps a
// whole one and refuses a record whose bytes do not hash to its id.
func TestRedoRewritesMissingAndDamagedObjects(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := &cas.Deferral{}
	objs := deferBatch(t, s, d, 3, 4096)
	recs := d.Objects()
	if err := d.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What a machine crash can do to unflushed objects: lose one's link
	// (and its redo name), damage another's bytes.
	for _, n := range pubNames(t, s) {
		os.Remove(filepath.Join(s.tmp, n))
	}
	if err := os.Remove(s.Path(recs[0].ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.Path(recs[1].ID), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path(recs[1].ID), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := s.Redo(r.ID, r.Data); err != nil {
			t.Fatal(err)
		}
	}
	checkObjects(t, s, objs)
	if err := s.Redo(recs[0].ID, []byte("not its bytes")); !errors.Is(err, cas.ErrCorrupt) {
		t.Errorf("Redo of a damaged record: %v, want ErrCorrupt", err)
	}
}
