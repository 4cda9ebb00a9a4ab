//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// hookedBatch is a batch of a fresh store whose syncfs and link go through
// the given hooks (nil means the real call).
type hookedBatch struct {
	s   *Store
	b   *batch
	ids []cas.ID // what was put, in id order (the order of publication)
}

func newHookedBatch(t *testing.T, n int, syncfs func(call, fd int) error, link func(call int, oldpath, newpath string) error) *hookedBatch {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookedBatch{s: s, b: s.NewBatch().(*batch)}
	syncCalls, linkCalls := 0, 0
	h.b.syncfs = func(fd int) error {
		syncCalls++
		if syncfs != nil {
			if err := syncfs(syncCalls, fd); err != nil {
				return err
			}
		}
		return unix.Syncfs(fd)
	}
	h.b.link = func(oldpath, newpath string) error {
		linkCalls++
		if link != nil {
			if err := link(linkCalls, oldpath, newpath); err != nil {
				return err
			}
		}
		return os.Link(oldpath, newpath)
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
	if syncCalls != 0 || linkCalls != 0 {
		t.Fatalf("Put called syncfs %d times and link %d times; only Commit may", syncCalls, linkCalls)
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

// temps lists the temp files, redo records awaiting retirement included.
func (h *hookedBatch) temps(t *testing.T) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(h.s.tmp)
	if err != nil {
		t.Fatal(err)
	}
	return ents
}

// redoRecords returns the names of the redo records awaiting retirement.
func redoRecords(s *Store) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, ns := range s.retire {
		for _, n := range ns {
			out[filepath.Base(n)] = true
		}
	}
	return out
}

// checkClean asserts what every Commit leaves: no temp files but the redo
// records of published objects (each a second link of its object), nothing
// in flight, and each published object whole.
func (h *hookedBatch) checkClean(t *testing.T) {
	t.Helper()
	redo := redoRecords(h.s)
	for _, e := range h.temps(t) {
		if !redo[e.Name()] {
			t.Fatalf("temp file %s left after Commit", e.Name())
		}
		id, err := cas.ParseID(strings.TrimPrefix(e.Name(), pubPrefix)[:2*cas.IDSize])
		if err != nil {
			t.Fatal(err)
		}
		a, err1 := os.Lstat(filepath.Join(h.s.tmp, e.Name()))
		b, err2 := os.Lstat(h.s.Path(id))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Fatalf("redo record %s is not a link of its object (%v, %v)", e.Name(), err1, err2)
		}
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
// read-only, named after its object and flushed, and its fan-out directory
// exists, before any name is published; the one syncfs comes before the
// first link, and each published object keeps its flushed temp name (its
// redo record) until a later flush. The next batch's syncfs retires them.
func TestBatchPublishesOnlyAfterSyncfs(t *testing.T) {
	const n = 9
	var h *hookedBatch
	syncs := 0
	h = newHookedBatch(t, n, func(call, fd int) error {
		syncs = call
		if got := count(h.published(t)); got != 0 {
			t.Errorf("%d objects published before the syncfs", got)
		}
		temps := h.temps(t)
		if len(temps) != n {
			t.Errorf("%d temp files at the syncfs, want %d", len(temps), n)
		}
		for _, e := range temps {
			fi, err := e.Info()
			if err != nil || fi.Mode() != 0o444 {
				t.Errorf("temp file %s at the syncfs: mode %v (%v), want 0444", e.Name(), fi.Mode(), err)
			}
			if !strings.HasPrefix(e.Name(), pubPrefix) {
				t.Errorf("temp file %s at the syncfs does not name its object", e.Name())
			}
		}
		for _, id := range h.ids {
			if _, err := os.Stat(h.s.fanoutDir(id)); err != nil {
				t.Errorf("fan-out directory not created before the syncfs: %v", err)
			}
		}
		return nil
	}, func(call int, _, _ string) error {
		if syncs != 1 {
			t.Errorf("link %d ran after %d syncfs calls, want after exactly 1", call, syncs)
		}
		return nil
	})
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if syncs != 1 {
		t.Fatalf("Commit called syncfs %d times, want 1", syncs)
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
	if got := len(redoRecords(h.s)); got != n {
		t.Fatalf("%d redo records after Commit, want %d", got, n)
	}

	// The next batch's flush covers the links: it retires the records.
	// (A large object: a batch of small ones is made durable by the redo
	// log instead, without a syncfs.)
	another := make([]byte, bufSize+1)
	rand.Read(another)
	b2 := h.s.NewBatch()
	if _, _, err := b2.Put(context.Background(), bytes.NewReader(another)); err != nil {
		t.Fatal(err)
	}
	if err := b2.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	redo := redoRecords(h.s)
	if len(redo) != 1 {
		t.Fatalf("%d redo records after the next Commit, want its own 1", len(redo))
	}
	if ents := h.temps(t); len(ents) != 1 || !redo[ents[0].Name()] {
		t.Fatalf("temp files after the next Commit: %v", ents)
	}
	if got := count(h.published(t)); got != n {
		t.Fatalf("%d of %d objects published after retirement", got, n)
	}
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
			// A failure part-way publishes a prefix, covered by redo records.
			name:   "LinkFails",
			rename: func(call int, _ func()) error { return failAt(3)(call, 0) },
			want:   unix.EIO, wantPublished: 2, wantSyncs: 1,
		},
		{
			name: "CancelledDuringPublication",
			rename: func(call int, cancel func()) error {
				if call == 2 {
					cancel() // seen before the third link
				}
				return nil
			},
			want: context.Canceled, wantPublished: 2, wantSyncs: 1,
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

// smallHooks counts and can fail the system calls of a small batch's
// Commit.
type smallHooks struct {
	mu                       sync.Mutex
	fsyncs, dirSyncs, syncfs int
	renames                  int
	failFsync, failDirSync   bool
	// synced are the directories synced, in order.
	synced []string
	// onRename runs before each rename.
	onRename func()
}

// smallLimit is the Options.SmallBatch of the small-batch tests.
const smallLimit = 16

func newSmallBatch(t *testing.T, n int, hk *smallHooks) *hookedBatch {
	t.Helper()
	s, err := Open(t.TempDir(), &Options{SmallBatch: smallLimit})
	if err != nil {
		t.Fatal(err)
	}
	h := &hookedBatch{s: s, b: s.NewBatch().(*batch)}
	h.b.syncfs = func(fd int) error {
		hk.mu.Lock()
		hk.syncfs++
		hk.mu.Unlock()
		return unix.Syncfs(fd)
	}
	h.b.fsync = func(fd int) error {
		hk.mu.Lock()
		hk.fsyncs++
		fail := hk.failFsync && hk.fsyncs == 2
		hk.mu.Unlock()
		if fail {
			return unix.EIO
		}
		return unix.Fsync(fd)
	}
	h.b.syncDir = func(dir string) error {
		hk.mu.Lock()
		hk.dirSyncs++
		hk.synced = append(hk.synced, dir)
		fail := hk.failDirSync
		hk.mu.Unlock()
		if fail {
			return unix.EIO
		}
		return syncDir(dir)
	}
	h.b.rename = func(oldpath, newpath string) error {
		hk.mu.Lock()
		hk.renames++
		hk.mu.Unlock()
		if hk.onRename != nil {
			hk.onRename()
		}
		return renameNoReplace(oldpath, newpath)
	}
	t.Cleanup(h.b.Abort)
	for i := range n {
		content := make([]byte, []int{10, 4096, bufSize + 1}[i%3])
		rand.Read(content)
		info, created, err := h.b.Put(context.Background(), bytes.NewReader(content))
		if err != nil || !created {
			t.Fatalf("batch put: created %v, %v", created, err)
		}
		h.ids = append(h.ids, info.ID)
	}
	slices.SortFunc(h.ids, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
	return h
}

// A small batch flushes file by file: every temp file is fsynced before
// the first rename, every fan-out directory a rename touched after the
// last one, and syncfs never runs.
func TestSmallBatchFlushesFileByFile(t *testing.T) {
	const n = 5
	hk := &smallHooks{}
	var h *hookedBatch
	hk.onRename = func() {
		hk.mu.Lock()
		defer hk.mu.Unlock()
		if hk.fsyncs != n {
			t.Errorf("rename %d ran after %d of %d fsyncs", hk.renames, hk.fsyncs, n)
		}
		for _, d := range hk.synced {
			if d != h.s.objects {
				t.Errorf("fan-out directory %s synced before the rename %d", d, hk.renames)
			}
		}
		for _, e := range h.temps(t) {
			if fi, err := e.Info(); err != nil || fi.Mode() != 0o444 {
				t.Errorf("temp file %s at rename: mode %v (%v), want 0444", e.Name(), fi.Mode(), err)
			}
		}
	}
	h = newSmallBatch(t, n, hk)
	// Fan-outs are new in a fresh store: ensureFanout syncs objects/ once
	// per new fan-out before any temp file is flushed.
	fans := map[byte]bool{}
	for _, id := range h.ids {
		fans[id[0]] = true
	}
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if hk.syncfs != 0 || hk.fsyncs != n || hk.renames != n {
		t.Fatalf("syncfs %d, fsyncs %d, renames %d; want 0, %d, %d", hk.syncfs, hk.fsyncs, hk.renames, n, n)
	}
	// One sync of objects/ per new fan-out, one of each fan-out after the
	// renames.
	if want := 2 * len(fans); hk.dirSyncs != want {
		t.Fatalf("%d directory syncs, want %d", hk.dirSyncs, want)
	}
	if got := count(h.published(t)); got != n {
		t.Fatalf("%d of %d objects published", got, n)
	}
	h.checkClean(t)
	if len(h.b.open) != 0 {
		t.Fatal("descriptors left open after Commit")
	}
}

func TestSmallBatchFailures(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name                   string
		failFsync, failDirSync bool
		wantPublished          int
	}{
		{"FsyncFails", true, false, 0},
		{"DirSyncFails", false, true, 0}, // the fan-outs are new: ensureFanout fails first
	} {
		t.Run(tc.name, func(t *testing.T) {
			hk := &smallHooks{failFsync: tc.failFsync, failDirSync: tc.failDirSync}
			h := newSmallBatch(t, n, hk)
			err := h.b.Commit(context.Background())
			if !errors.Is(err, unix.EIO) {
				t.Fatalf("Commit: %v, want EIO", err)
			}
			if got := count(h.published(t)); got != tc.wantPublished {
				t.Fatalf("%d objects published, want %d", got, tc.wantPublished)
			}
			h.checkClean(t)
		})
	}
	// With the fan-outs known, a failed sync after the renames leaves the
	// objects published and reports the error.
	hk := &smallHooks{}
	h := newSmallBatch(t, n, hk)
	for _, id := range h.ids {
		h.s.fanout[id[0]].Store(true)
		if err := os.MkdirAll(h.s.fanoutDir(id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hk.failDirSync = true
	if err := h.b.Commit(context.Background()); !errors.Is(err, unix.EIO) {
		t.Fatalf("Commit with a failing fan-out sync: %v, want EIO", err)
	}
	if got := count(h.published(t)); got != n {
		t.Fatalf("%d objects published, want all %d", got, n)
	}
	h.checkClean(t)
}

// A batch that grows past the limit closes its files and flushes with
// syncfs, once, and no file by file.
func TestSmallBatchGrowsIntoSyncfs(t *testing.T) {
	hk := &smallHooks{}
	h := newSmallBatch(t, smallLimit+1, hk)
	if h.b.open != nil {
		t.Fatalf("%d descriptors still open past the limit", len(h.b.open))
	}
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if hk.syncfs != 1 || hk.fsyncs != 0 {
		t.Fatalf("syncfs %d, fsyncs %d; want 1 and 0", hk.syncfs, hk.fsyncs)
	}
	if got := count(h.published(t)); got != smallLimit+1 {
		t.Fatalf("%d objects published", got)
	}
	h.checkClean(t)
}

// Abort of a small batch closes its descriptors and removes its files.
func TestSmallBatchAbort(t *testing.T) {
	hk := &smallHooks{}
	h := newSmallBatch(t, 3, hk)
	fds := make([]int, 0, 3)
	for _, fd := range h.b.open {
		fds = append(fds, fd)
	}
	h.b.Abort()
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			// The number may have been reused by another open meanwhile;
			// only a temp file of ours would be a leak.
			if p, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); strings.Contains(p, h.b.prefix) {
				t.Errorf("fd %d (%s) still open after Abort", fd, p)
			}
		}
	}
	if left := h.temps(t); len(left) != 0 {
		t.Fatalf("%d temp files left after Abort", len(left))
	}
	if hk.fsyncs != 0 || hk.renames != 0 {
		t.Fatal("Abort flushed or renamed")
	}
}

// A crash may lose a batch's unflushed links: Open redoes them from the
// redo records, drops records of objects present, and removes records whose
// content does not hash to the id they name (a batch that never flushed).
// A store opened with cleanup disabled (the FUSE server) touches nothing.
func TestOpenRedoesLostLinks(t *testing.T) {
	h := newHookedBatch(t, 6, nil, nil)
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The crash: the links of the first half are lost, the rest made it.
	lost := h.ids[:3]
	for _, id := range lost {
		if err := os.Remove(h.s.Path(id)); err != nil {
			t.Fatal(err)
		}
	}
	// A record of a batch that crashed before its flush: torn content.
	torn := cas.Sum([]byte("the whole object"))
	bogus := filepath.Join(h.s.tmp, pubPrefix+torn.String()+"-batch-0-1")
	if err := os.WriteFile(bogus, []byte("the wh"), 0o444); err != nil {
		t.Fatal(err)
	}

	reader, err := Open(h.s.dir, &Options{StaleTempAge: -1})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(h.temps(t)); got != 7 {
		t.Fatalf("an Open without cleanup changed tmp/: %d files, want 7", got)
	}
	for _, id := range lost {
		if ok, _ := reader.Has(context.Background(), id); ok {
			t.Fatalf("an Open without cleanup redid %s", id.Short())
		}
	}

	s, err := Open(h.s.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range h.ids {
		if _, err := cas.ReadAll(context.Background(), s, id); err != nil {
			t.Fatalf("object %s after the redo: %v", id.Short(), err)
		}
	}
	if ok, _ := s.Has(context.Background(), torn); ok {
		t.Fatal("a torn redo record was published")
	}
	if left := h.temps(t); len(left) != 0 {
		t.Fatalf("%d temp files left after the redo", len(left))
	}
}

// Delete also removes the object's redo record, which would hold its space
// and bring it back after a crash.
func TestDeleteRemovesRedoRecord(t *testing.T) {
	h := newHookedBatch(t, 2, nil, nil)
	if err := h.b.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Delete(context.Background(), h.ids[0]); err != nil {
		t.Fatal(err)
	}
	ents := h.temps(t)
	if len(ents) != 1 || !strings.Contains(ents[0].Name(), h.ids[1].String()) {
		t.Fatalf("temp files after deleting one of two objects: %v", ents)
	}
}
