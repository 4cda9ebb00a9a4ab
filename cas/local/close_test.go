//go:build linux

package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// redoFDs counts this process's descriptors open on the redo log of the
// store in dir.
func redoFDs(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "redo.log")
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && p == want {
			n++
		}
	}
	return n
}

// TestCloseReleasesRedoLog: every Open of a writing store opens its redo
// log; Close gives the descriptor back, so a process that opens and
// closes stores (a daemon's restarts of its state, tests) does not leak
// one per Open.
func TestCloseReleasesRedoLog(t *testing.T) {
	dir := t.TempDir()
	for range 3 {
		s := open(t, dir)
		if n := redoFDs(t, dir); n != 1 {
			t.Fatalf("%d descriptors on the redo log with one store open, want 1", n)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	if n := redoFDs(t, dir); n != 0 {
		t.Fatalf("%d descriptors on the redo log after Close", n)
	}
}

// TestStatBeforeAndAfterClose: Stat finds an object and reports a missing
// one as not found both through the objects directory the store holds open
// and, once Close released it, by path.
func TestStatBeforeAndAfterClose(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	info, _, err := s.Put(ctx, strings.NewReader("some content"))
	if err != nil {
		t.Fatal(err)
	}
	missing := cas.Sum([]byte("never stored"))
	check := func(when string) {
		t.Helper()
		if got, err := s.Stat(ctx, info.ID); err != nil || got.Size != info.Size {
			t.Fatalf("%s: Stat of a stored object: %+v, %v; want size %d", when, got, err, info.Size)
		}
		if _, err := s.Stat(ctx, missing); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("%s: Stat of a missing object: %v, want not found", when, err)
		}
	}
	check("open")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed")
}
