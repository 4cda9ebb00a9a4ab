package ingest

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// importCounting imports dir with cache and returns the root and the file
// bytes it read.
func importCounting(t *testing.T, st Store, dir string, cache *StatCache) (Result, int64) {
	t.Helper()
	var read int64
	res, err := Dir(context.Background(), st, dir, Options{StatCache: cache, Progress: func(n int64) { read = n }})
	if err != nil {
		t.Fatal(err)
	}
	return res, read
}

// laterCache is a cache whose imports happen an hour from now: every file
// of a test tree is old enough to be remembered.
func laterCache() *StatCache {
	c := NewStatCache(0)
	c.nowFunc = func() time.Time { return time.Now().Add(time.Hour) }
	return c
}

func statCacheTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a"), []byte("alpha"), 0o644)
	writeFile(t, filepath.Join(dir, "sub", "b"), []byte("bravo bravo"), 0o644)
	writeFile(t, filepath.Join(dir, "sub", "big"), make([]byte, 3<<20), 0o600)
	return dir
}

// An unchanged tree is re-imported without reading a byte, to the same root.
func TestStatCacheSkipsUnchangedFiles(t *testing.T) {
	st := newStore()
	dir := statCacheTree(t)
	cache := laterCache()
	first, read := importCounting(t, st, dir, cache)
	if read == 0 || cache.Len() != 3 {
		t.Fatalf("first import read %d bytes and remembered %d files, want >0 and 3", read, cache.Len())
	}
	again, read := importCounting(t, st, dir, cache)
	if again.Root != first.Root || read != 0 {
		t.Fatalf("re-import: root %s (first %s), %d bytes read, want the same root and 0", again.Root.Short(), first.Root.Short(), read)
	}
}

// A changed file is always read again, even at the same size with its
// mtime put back (ctime moves regardless), and so is a file whose object
// the store lost. The roots are those of an import without the cache.
func TestStatCacheRereadsChangedFiles(t *testing.T) {
	st := newStore()
	dir := statCacheTree(t)
	cache := laterCache()
	importCounting(t, st, dir, cache)

	p := filepath.Join(dir, "sub", "b")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	// The cache's clock is an hour ahead, so nothing is racy to it: let the
	// kernel's clock move past p's ctime first, or the rewrite could get
	// the same ctime (that case is the racy one, tested below).
	waitClockPast(t, dir, p)
	writeFile(t, p, []byte("BRAVO bravo"), 0o644) // same size
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	got, read := importCounting(t, st, dir, cache)
	want, err := Dir(context.Background(), newStore(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Root != want.Root || read != int64(len("BRAVO bravo")) {
		t.Fatalf("after a same-size change with mtime restored: root %s (want %s), %d bytes read, want %d",
			got.Root.Short(), want.Root.Short(), read, len("BRAVO bravo"))
	}

	// The store lost an object (a collection, a corrupt copy removed).
	id := flatten(t, st, got.Root)["a"].ID
	if err := st.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	again, read := importCounting(t, st, dir, cache)
	if again.Root != want.Root || read != int64(len("alpha")) {
		t.Fatalf("after the store lost a: root %s, %d bytes read, want %d", again.Root.Short(), read, len("alpha"))
	}
	if ok, err := st.Has(context.Background(), id); err != nil || !ok {
		t.Fatalf("a not stored again: %v, %v", ok, err)
	}
}

// Racy timestamps: files whose mtime or ctime is within RacyWindow of the
// read are not remembered (a change in the same clock tick would not show),
// so the next import reads them again.
func TestStatCacheRacyFilesAreReadAgain(t *testing.T) {
	st := newStore()
	dir := statCacheTree(t) // written just now: all racy
	cache := NewStatCache(0)
	first, _ := importCounting(t, st, dir, cache)
	if n := cache.Len(); n != 0 {
		t.Fatalf("%d racy files remembered", n)
	}
	// Rewritten at once, same size, mtime put back: must not be missed.
	p := filepath.Join(dir, "a")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, []byte("ALPHA"), 0o644)
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	again, read := importCounting(t, st, dir, cache)
	if again.Root == first.Root || read == 0 {
		t.Fatalf("racy re-import: root unchanged %v, %d bytes read", again.Root == first.Root, read)
	}
	if got := string(blobOf(t, st, flatten(t, st, again.Root)["a"].ID)); got != "ALPHA" {
		t.Fatalf("racy re-import stored %q for a", got)
	}
}

// waitClockPast waits until a file created in dir gets a ctime later than
// p's: the filesystem's clock has moved on.
func waitClockPast(t *testing.T, dir, p string) {
	t.Helper()
	ctime := func(name string) int64 {
		var st unix.Stat_t
		if err := unix.Lstat(name, &st); err != nil {
			t.Fatal(err)
		}
		return timeNs(st.Ctim.Sec, st.Ctim.Nsec)
	}
	old := ctime(p)
	probe := filepath.Join(dir, ".clock")
	defer os.Remove(probe)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		writeFile(t, probe, nil, 0o644)
		if ctime(probe) > old {
			return
		}
		runtime.Gosched()
	}
	t.Fatal("the filesystem's clock did not move in a minute")
}

// The cache remembers a file's xattrs with it; setting one moves the ctime,
// so the next import sees it.
func TestStatCacheSeesXattrChanges(t *testing.T) {
	st := newStore()
	dir := statCacheTree(t)
	if !xattrsSupported(t, dir) {
		t.Skip("no user xattrs here")
	}
	p := filepath.Join(dir, "a")
	if err := unix.Lsetxattr(p, "user.one", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	cache := laterCache()
	first, _ := importCounting(t, st, dir, cache)
	if got := flatten(t, st, first.Root)["a"].Xattrs; len(got) != 1 {
		t.Fatalf("first import: xattrs %v", got)
	}
	again, read := importCounting(t, st, dir, cache)
	if again.Root != first.Root || read != 0 {
		t.Fatalf("unchanged re-import: same root %v, %d bytes read", again.Root == first.Root, read)
	}
	waitClockPast(t, dir, p)
	if err := unix.Lsetxattr(p, "user.two", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	got, _ := importCounting(t, st, dir, cache)
	want, err := Dir(context.Background(), newStore(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Root != want.Root {
		t.Fatalf("after setting an xattr: root %s, want %s", got.Root.Short(), want.Root.Short())
	}
}

// A full cache forgets a file for each new one: it stays at its bound, and
// what it still remembers is still right (a re-import gives the same root).
func TestStatCacheStaysWithinItsBound(t *testing.T) {
	st := newStore()
	dir := statCacheTree(t)
	cache := laterCache()
	cache.max = 2
	first, _ := importCounting(t, st, dir, cache)
	if n := cache.Len(); n != 2 {
		t.Fatalf("a cache of 2 files remembers %d", n)
	}
	again, _ := importCounting(t, st, dir, cache)
	if again.Root != first.Root || cache.Len() != 2 {
		t.Fatalf("re-import: root %s (first %s), %d remembered", again.Root.Short(), first.Root.Short(), cache.Len())
	}
}

// The packed table agrees with a plain map through inserts, updates,
// forgets (racy files) and evictions at its bound, on colliding inodes of
// several devices; an entry stays 80 bytes.
func TestStatCacheTableMatchesAMap(t *testing.T) {
	if n := unsafe.Sizeof(statEntry{}); n != 80 {
		t.Fatalf("a stat cache entry is %d bytes, want 80", n)
	}
	for _, bound := range []int{1, 7, 100, 1000} {
		c := laterCache()
		c.max = bound
		rng := rand.New(rand.NewPCG(uint64(bound), 1))
		type val struct {
			key statKey
			id  cas.ID
		}
		ref := map[fileID]val{}
		old := time.Now().Add(-time.Hour)
		for step := range 10000 {
			f := fileID{dev: uint64(rng.IntN(3)) << 8, ino: 1 + uint64(rng.IntN(3*bound))}
			st := unix.Stat_t{Dev: f.dev, Ino: f.ino, Size: int64(rng.IntN(4))}
			st.Mtim, st.Ctim = unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano()+int64(rng.IntN(2)))
			var id cas.ID
			id[0], id[1] = byte(step), byte(step>>8)
			switch rng.IntN(4) {
			case 0: // racy: forgotten
				st.Ctim = unix.NsecToTimespec(time.Now().Add(2 * time.Hour).UnixNano())
				c.remember(&st, id, nil, time.Now())
				delete(ref, f)
			case 1, 2:
				var xs []cas.Xattr
				if step%5 == 0 {
					xs = []cas.Xattr{{Name: "user.x", Value: []byte{byte(step)}}}
				}
				c.remember(&st, id, xs, time.Now())
				if _, ok := ref[f]; !ok && len(ref) >= bound {
					// Evicted something: drop from ref whatever c lost.
					for g := range ref {
						if _, ok := c.find(g); !ok {
							delete(ref, g)
						}
					}
				}
				ref[f] = val{keyOf(&st), id}
				if got, _, _, ok := c.lookup(&st); !ok || got != id {
					t.Fatalf("bound %d step %d: just remembered %v, lookup %v %v", bound, step, f, ok, got)
				}
				if gotXs := c.xattrs[f]; len(gotXs) != len(xs) {
					t.Fatalf("bound %d step %d: xattrs %v, want %v", bound, step, gotXs, xs)
				}
			default:
				got, _, _, ok := c.lookup(&st)
				want, wok := ref[f]
				wok = wok && want.key == keyOf(&st)
				if ok != wok || (ok && got != want.id) {
					t.Fatalf("bound %d step %d: lookup %v = %v %v, want %v %v", bound, step, f, got, ok, want.id, wok)
				}
			}
			if c.Len() != len(ref) || c.Len() > bound {
				t.Fatalf("bound %d step %d: %d remembered, want %d (bound %d)", bound, step, c.Len(), len(ref), bound)
			}
		}
		for g, v := range ref {
			i, ok := c.find(g)
			if !ok || c.slots[i].id != v.id {
				t.Fatalf("bound %d: %v lost", bound, g)
			}
		}
		for g := range c.xattrs {
			if i, ok := c.find(g); !ok || !c.slots[i].hasXattrs {
				t.Fatalf("bound %d: xattrs of %v kept after it was forgotten", bound, g)
			}
		}
	}
}

// fillCache remembers n files of device 1 in c.
func fillCache(c *StatCache, n int) {
	old := time.Now().Add(-time.Hour)
	for i := range n {
		st := unix.Stat_t{Dev: 1, Ino: uint64(i + 1), Size: int64(i)}
		st.Mtim, st.Ctim = unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano())
		c.remember(&st, cas.ZeroID, nil, time.Now())
	}
}

// A cache's table, mapped outside the heap, goes back to the system when
// the cache is dropped (a fabric's cache is dropped with the fabric: a
// process that makes many, as tests and in-process restarts do, must not
// keep every table it ever mapped).
func TestStatCacheTableIsUnmappedWhenDropped(t *testing.T) {
	base := mappedSlots.Load()
	for range 8 {
		fillCache(NewStatCache(0), 5000)
	}
	if mappedSlots.Load() <= base {
		t.Fatalf("no table mapped (%d bytes, %d before)", mappedSlots.Load(), base)
	}
	deadline := time.Now().Add(time.Minute)
	for mappedSlots.Load() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of dropped tables still mapped (%d before)", mappedSlots.Load(), base)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// Where the kernel refuses a mapping the table lives on the heap: growing
// it never hands heap memory to munmap (which would unmap the pages of a
// large, page-aligned heap object under the Go runtime).
func TestStatCacheHeapTableIsNotUnmapped(t *testing.T) {
	mmap, munmap := mmapSlots, munmapSlots
	t.Cleanup(func() { mmapSlots, munmapSlots = mmap, munmap })
	mmapSlots = func(int) ([]byte, error) { return nil, unix.ENOMEM }
	munmapSlots = func(b []byte) error {
		t.Errorf("munmap of %d bytes of a heap table", len(b))
		return unix.EINVAL
	}
	before := mappedSlots.Load()
	c := NewStatCache(0)
	fillCache(c, 20000) // grows through tables of 64 KiB and more
	if mappedSlots.Load() != before {
		t.Fatalf("mapped bytes moved from %d to %d with mmap refused", before, mappedSlots.Load())
	}
	// The table still answers: nothing was unmapped under it.
	for i := range 20000 {
		st := unix.Stat_t{Dev: 1, Ino: uint64(i + 1), Size: int64(i)}
		if _, ok := c.find(fileOf(&st)); !ok {
			t.Fatalf("file %d lost", i+1)
		}
	}
	runtime.KeepAlive(c)
}

// hasCounting is a store that counts the Has calls of the ids in files.
type hasCounting struct {
	*local.Store
	files map[cas.ID]bool
	n     atomic.Int64
}

func (s *hasCounting) Has(ctx context.Context, id cas.ID) (bool, error) {
	if s.files[id] {
		s.n.Add(1)
	}
	return s.Store.Has(ctx, id)
}

// uncounted hides its store's deletion counter.
type uncounted struct{ Store }

func openCounting(t *testing.T) *hasCounting {
	t.Helper()
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &hasCounting{Store: st, files: map[cas.ID]bool{}}
}

// fileIDs adds the ids of root's regular files to s.files and returns the
// one of name.
func (s *hasCounting) fileIDs(t *testing.T, root cas.ID, name string) cas.ID {
	t.Helper()
	var id cas.ID
	for p, e := range flatten(t, s, root) {
		if e.Type == cas.TypeFile {
			s.files[e.ID] = true
			if p == name {
				id = e.ID
			}
		}
	}
	return id
}

// A store that counts its deletions and deleted nothing since the files
// were imported is not asked about them again; after a deletion every hit
// is checked once more, the lost object read and stored again, and then
// trusted again.
func TestStatCacheTrustsAStoreThatDeletedNothing(t *testing.T) {
	st := openCounting(t)
	dir := statCacheTree(t)
	cache := laterCache()
	first, _ := importCounting(t, st, dir, cache)
	a := st.fileIDs(t, first.Root, "a")
	for i := range 2 {
		again, read := importCounting(t, st, dir, cache)
		if again.Root != first.Root || read != 0 || st.n.Load() != 0 {
			t.Fatalf("re-import %d: root %s (first %s), %d bytes read, %d Has of files; want the same root, 0, 0",
				i, again.Root.Short(), first.Root.Short(), read, st.n.Load())
		}
	}

	if err := st.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	again, read := importCounting(t, st, dir, cache)
	// 3 hits asked, and a's content once read (objects.putBytes asks).
	if again.Root != first.Root || read != int64(len("alpha")) || st.n.Load() != 4 {
		t.Fatalf("after a deletion: root %s, %d bytes read, %d Has of files; want the same root, %d, 4",
			again.Root.Short(), read, st.n.Load(), len("alpha"))
	}
	if ok, err := st.Store.Has(context.Background(), a); err != nil || !ok {
		t.Fatalf("a not stored again: %v, %v", ok, err)
	}
	st.n.Store(0)
	if _, read := importCounting(t, st, dir, cache); read != 0 || st.n.Load() != 0 {
		t.Fatalf("once checked again: %d bytes read, %d Has of files; want 0, 0", read, st.n.Load())
	}
}

// A store without a deletion counter is asked about every hit, every time.
func TestStatCacheChecksAStoreWithoutACounter(t *testing.T) {
	st := openCounting(t)
	dir := statCacheTree(t)
	cache := laterCache()
	first, _ := importCounting(t, uncounted{st}, dir, cache)
	st.fileIDs(t, first.Root, "")
	for i := range 2 {
		if _, read := importCounting(t, uncounted{st}, dir, cache); read != 0 || st.n.Load() != int64(3*(i+1)) {
			t.Fatalf("re-import %d: %d bytes read, %d Has of files in all; want 0, %d", i, read, st.n.Load(), 3*(i+1))
		}
	}
}

// What an import read is trusted present only once the import published
// its objects (an import that fails drops its last batch): an entry
// remembered by a read and not confirmed since is asked about once, then
// trusted.
func TestStatCacheTrustsOnlyConfirmedEntries(t *testing.T) {
	st := openCounting(t)
	dir := statCacheTree(t)
	cache := laterCache()
	first, _ := importCounting(t, st, dir, cache)
	id := st.fileIDs(t, first.Root, "a")
	var stt unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "a"), &stt); err != nil {
		t.Fatal(err)
	}
	if !cache.remember(&stt, id, nil, time.Now().Add(time.Hour)) {
		t.Fatal("a not remembered")
	}
	for i, want := range []int64{1, 1} {
		if _, read := importCounting(t, st, dir, cache); read != 0 || st.n.Load() != want {
			t.Fatalf("re-import %d: %d bytes read, %d Has of files in all; want 0, %d", i, read, st.n.Load(), want)
		}
	}
}

// A file an import read is known present, at the count the import started
// with, only once that import published its objects; never if it failed.
func TestStatCacheImportTokens(t *testing.T) {
	c := laterCache()
	dir := statCacheTree(t)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "a"), &st); err != nil {
		t.Fatal(err)
	}
	id := cas.Sum([]byte("alpha"))
	present := func() uint64 {
		_, _, p, ok := c.lookup(&st)
		if !ok {
			t.Fatal("a not remembered")
		}
		return p
	}
	failed := c.beginImport(4)
	c.rememberAs(&st, id, nil, c.now(), failed)
	if p := present(); p != 0 {
		t.Fatalf("during the import: present %d, want 0", p)
	}
	c.endImport(failed, false)
	if p := present(); p != 0 {
		t.Fatalf("after the import failed: present %d, want 0", p)
	}
	ok := c.beginImport(6)
	c.rememberAs(&st, id, nil, c.now(), ok)
	c.endImport(ok, true)
	if p := present(); p != 7 {
		t.Fatalf("after the import published: present %d, want 7", p)
	}
}

// Growing a mapped table gives the outgrown one back in steps as it is
// walked, so the two never take their sum in memory; every file stays
// remembered across the growths.
func TestStatCacheGrowReleasesTheOldTableAsItGoes(t *testing.T) {
	release := releaseSlots
	t.Cleanup(func() { releaseSlots = release })
	type span struct{ start, n uintptr }
	var spans []span
	releaseSlots = func(b []byte) {
		spans = append(spans, span{uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))})
		release(b)
	}
	c := NewStatCache(0)
	const n = 30000 // the last growth outgrows a table of 2.6 MB: released in steps
	fillCache(c, n)
	if c.mapping.b == nil {
		t.Skip("the kernel refused the mapping: the table is on the heap")
	}
	if len(spans) < 2 {
		t.Fatalf("%d releases of outgrown tables, want them in steps", len(spans))
	}
	for i, s := range spans {
		if s.n%releaseStep != 0 || s.start%uintptr(os.Getpagesize()) != 0 {
			t.Fatalf("release %d: %d bytes at %#x, not whole steps from a page", i, s.n, s.start)
		}
	}
	if c.Len() != n {
		t.Fatalf("%d files remembered, want %d", c.Len(), n)
	}
	for i := range n {
		if _, ok := c.find(fileID{dev: 1, ino: uint64(i + 1)}); !ok {
			t.Fatalf("file %d forgotten across the growths", i+1)
		}
	}
}
