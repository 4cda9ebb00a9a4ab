//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// hookedBatch is a batch of a fresh store whose syncfs and rename go through
// the given hooks (nil means the real call).
type hookedBatch struct {
	s   *Store
	b   *batch
	ids []cas.ID // what was put, in id order (the order of publication)
}

func newHookedBatch(t *testing.T, n int, syncfs func(call, fd int) error, rename func(call int, oldpath, newpath string) error) *hookedBatch {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookedBatch{s: s, b: s.NewBatch().(*batch)}
	syncCalls, renameCalls := 0, 0
	h.b.syncfs = func(fd int) error {
		syncCalls++
		if syncfs != nil {
			if err := syncfs(syncCalls, fd); err != nil {
				return err
			}
		}
		return unix.Syncfs(fd)
	}
	h.b.rename = func(oldpath, newpath string) error {
		renameCalls++
		if rename != nil {
			if err := rename(renameCalls, oldpath, newpath); err != nil {
				return err
			}
		}
		return renameNoReplace(oldpath, newpath)
	}
	t.Cleanup(h.b.Abort)
	ctx := context.Background()
	for i := range n {
		// Sizes on both sides of the in-memory hashing threshold.
		content := make([]byte, []int{10, 4096, bufSize + 1}[i%3])
		rand.Read(content)
		info, created, err := h.b.Put(ctx, bytes.NewReader(content))
		if err != nil || !created {
			t.Fatalf("batch put: created %v, %v", created, err)
		}
		h.ids = append(h.ids, info.ID)
	}
	slices.SortFunc(h.ids, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
	if syncCalls != 0 || renameCalls != 0 {
		t.Fatalf("Put called syncfs %d times and rename %d times; only Commit may", syncCalls, renameCalls)
	}
	return h
}

// published reports, per id in order, whether its object is visible.
func (h *hookedBatch) published(t *testing.T) []bool {
	t.Helper()
	var out []bool
	for _, id := range h.ids {
		_, err := os.Lstat(h.s.Path(id))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		out = append(out, err == nil)
	}
	return out
}

func (h *hookedBatch) temps(t *testing.T) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(h.s.tmp)
	if err != nil {
		t.Fatal(err)
	}
	return ents
}

// checkClean asserts what every Commit leaves: no temp files, nothing in
// flight, and each published object whole.
func (h *hookedBatch) checkClean(t *testing.T) {
	t.Helper()
	if left := h.temps(t); len(left) != 0 {
		t.Fatalf("%d temp files left after Commit", len(left))
	}
	h.s.mu.Lock()
	n := len(h.s.inflight)
	h.s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d ids still registered in flight after Commit", n)
	}
	for i, ok := range h.published(t) {
		if ok {
			if _, err := cas.ReadAll(context.Background(), h.s, h.ids[i]); err != nil {
				t.Fatalf("published object %d: %v", i, err)
			}
		}
	}
}

func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// The crash-safety argument of Commit: every temp file is complete,
// read-only and flushed, and its fan-out directory exists, before any name
// is published; every rename is flushed before Commit returns.
func TestBatchPublishesOnlyAfterSyncfs(t *testing.T) {
	const n = 9
	var h *hookedBatch
	syncs := 0
	h = newHookedBatch(t, n, func(call, fd int) error {
		syncs = call
		switch call {
		case 1:
			if got := count(h.published(t)); got != 0 {
				t.Errorf("%d objects published before the first syncfs", got)
			}
			temps := h.temps(t)
			if len(temps) != n {
				t.Errorf("%d temp files at the first syncfs, want %d", len(temps), n)
			}
			for _, e := range temps {
				fi, err := e.Info()
				if err != nil || fi.Mode() != 0o444 {
					t.Errorf("temp file %s at the first syncfs: mode %v (%v), want 0444", e.Name(), fi.Mode(), err)
				}
			}
			for _, id := range h.ids {
				if _, err := os.Stat(h.s.fanoutDir(id)); err != nil {
					t.Errorf("fan-out directory not created before the first syncfs: %v", err)
				}
			}
		case 2:
			if got := count(h.published(t)); got != n {
				t.Errorf("%d of %d objects published at the second syncfs", got, n)
			}
			h.s.mu.Lock()
			inflight := len(h.s.inflight)
			h.s.mu.Unlock()
			if inflight != n {
				t.Errorf("%d ids in flight during the second syncfs, want %d", inflight, n)
			}
		}
		return nil
	}, func(call int, _, _ string) error {
		if syncs != 1 {
			t.Errorf("rename %d ran after %d syncfs calls, want after exactly 1", call, syncs)
		}
		return nil
	})
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if syncs != 2 {
		t.Fatalf("Commit called syncfs %d times, want 2", syncs)
	}
	if got := count(h.published(t)); got != n {
		t.Fatalf("%d of %d objects published", got, n)
	}
	for _, id := range h.ids {
		if !h.s.fanout[id[0]].Load() {
			t.Fatalf("fan-out %02x not marked durable after Commit", id[0])
		}
	}
	h.checkClean(t)
}

// failAt returns a hook whose nth call fails with EIO.
func failAt(n int) func(call, _ int) error {
	return func(call, _ int) error {
		if call == n {
			return unix.EIO
		}
		return nil
	}
}

func TestBatchCommitFailures(t *testing.T) {
	const n = 6
	for _, tc := range []struct {
		name          string
		syncfs        func(call, fd int) error
		rename        func(call int, cancel func()) error
		want          error
		wantPublished int
		wantSyncs     int
	}{
		{
			name:   "FirstSyncfsFails",
			syncfs: failAt(1),
			want:   unix.EIO, wantPublished: 0, wantSyncs: 1,
		},
		{
			// A failure part-way publishes a prefix, still flushed.
			name:   "RenameFails",
			rename: func(call int, _ func()) error { return failAt(3)(call, 0) },
			want:   unix.EIO, wantPublished: 2, wantSyncs: 2,
		},
		{
			name: "CancelledDuringPublication",
			rename: func(call int, cancel func()) error {
				if call == 2 {
					cancel() // seen before the third rename
				}
				return nil
			},
			want: context.Canceled, wantPublished: 2, wantSyncs: 2,
		},
		{
			name:   "SecondSyncfsFails",
			syncfs: failAt(2),
			want:   unix.EIO, wantPublished: n, wantSyncs: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			syncs := 0
			h := newHookedBatch(t, n, func(call, fd int) error {
				syncs = call
				if tc.syncfs != nil {
					return tc.syncfs(call, fd)
				}
				return nil
			}, func(call int, _, _ string) error {
				if tc.rename != nil {
					return tc.rename(call, cancel)
				}
				return nil
			})
			err := h.b.Commit(ctx)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Commit: err = %v, want %v", err, tc.want)
			}
			if syncs != tc.wantSyncs {
				t.Fatalf("syncfs called %d times, want %d", syncs, tc.wantSyncs)
			}
			pub := h.published(t)
			for i, ok := range pub {
				if ok != (i < tc.wantPublished) {
					t.Fatalf("published %v, want the first %d in id order", pub, tc.wantPublished)
				}
			}
			h.checkClean(t)
			h.b.Abort() // a no-op after Commit
			if got := count(h.published(t)); got != tc.wantPublished {
				t.Fatalf("Abort after a failed Commit removed objects: %d left, want %d", got, tc.wantPublished)
			}
		})
	}
}
