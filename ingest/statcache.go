package ingest

import (
	"bytes"
	"math"
	"math/bits"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// StatCache lets Dir skip reading the files of a tree it imported before
// and that did not change since, as git's index does for `git status`: per
// file (device and inode) it remembers the size, mtime and ctime (all in
// nanoseconds) and the id of the content it read. A file whose lstat
// matches all five is taken as unchanged: Dir makes sure the store still
// has the object (which also tells a collection running meanwhile that the
// import uses it) and reads nothing. Any difference, a missing
// object or a sparse file (whose holes are not cached) reads the file as
// usual. The file's xattrs are remembered with it (setting one moves the
// ctime), so a hit lists none either.
//
// Racy timestamps: a file written in the same clock tick as it was read
// could change again without its mtime or ctime moving. So, as git does
// with its racily clean entries, a file is only remembered when its mtime
// and ctime are both older than RacyWindow before the moment Dir started
// reading it; a file changed after that moment has a ctime the kernel sets
// from a clock no coarser than that window, so a later change always shows.
// A racy file is simply read again by the next import, and remembered then.
// ctime cannot be set from user space, so a tool that restores mtime after
// writing (touch -r, rsync -t, tar -x) does not hide a change either.
//
// Making sure the object is stored costs a stat of it in the store, about
// twice the file's own lstat, so Dir skips it when the store counts its
// deletions (cas.DeletionCounter: the disk store, through the GC tracker)
// and removed nothing since the object was last known stored: each entry
// holds the count at that moment: for a file an import read, the count
// when the import started, valid once the import has published its
// objects (before, they may sit in an unpublished batch; the entry holds
// a token of the import until then, see beginImport), and for a hit whose
// Has found the object, the count read before the Has; so a removal
// racing either leaves the entry to be checked again. A trusted hit still records the id for a collection
// (gc.Tracker.Note), before it reads the count: a collection's deletion
// either sees the record and keeps the object, or moved the count first.
// The cache binds to the first counting store an import uses; imports into
// any other store, and through stores that do not count (a remote tier, a
// test's fake), ask about every hit. As with git's index, which never
// checks that its objects exist, an unchanged tree then re-imports at the
// cost of its lstats.
//
// Keyed by device and inode rather than path, an entry holds no string. A
// hard link or a rename of an unchanged file is still the same content; a
// new file on a reused inode has a ctime after the old one was remembered
// (which was at least RacyWindow before a read).
//
// The cache lives in memory, per daemon process, and holds at most its
// bound of files (when full, remembering one forgets another). An entry is
// a packed record of 80 bytes (inode, size, mtime, ctime, content id,
// deletion count, device) in one open-addressing table (linear probing),
// mapped outside the Go heap (see allocSlots), so it costs no map or
// collector overhead: at most 7/8 of its slots are used, so a file costs
// 80-92 bytes, plus a table doubling's transient. The default bound, a
// million files, is at most 92 MiB. Xattrs are rare and kept in a side
// map, only for the files that have some. A StatCache is safe for
// concurrent use. Upper (seals) never uses it: an attempt's writes are new
// content.
type StatCache struct {
	mu      sync.Mutex
	slots   []statEntry            // len 0 or the capacity; ino 0 marks a free slot
	mapping *slotMapping           // slots' mapping, unmapped when the cache is dropped
	n       int                    // used slots
	xattrs  map[fileID][]cas.Xattr // of the remembered files that have any
	max     int
	racy    time.Duration
	nowFunc func() time.Time
	// counter is the store whose deletion counts the entries' present
	// fields hold (see StatCache); set by the first import that binds it.
	counter cas.DeletionCounter
	// imports holds the recent imports' tokens (see beginImport), order
	// them oldest first; seq numbers them.
	imports map[uint64]importState
	order   []uint64
	seq     uint64
}

// RacyWindow is how much older than the start of its read a file's mtime and
// ctime must be for the StatCache to remember it.
const RacyWindow = time.Second

// DefaultStatCacheEntries bounds a StatCache made with NewStatCache(0): a
// million files, at most 92 MiB of the daemon's memory (about 92 bytes a
// file, see StatCache), so an import of a huge tree is remembered whole
// within the daemon's memory budget of issue #15.
const DefaultStatCacheEntries = 1 << 20

// fileID names a file: its device and inode.
type fileID struct{ dev, ino uint64 }

// statEntry is one remembered file, packed: 80 bytes, no pointer.
type statEntry struct {
	ino uint64 // 0: a free slot (no file has inode 0)
	statKey
	id cas.ID
	// present is 1 + the store's cas.DeletionCounter count at which id
	// was last known stored (0: not known; see StatCache).
	present   uint64
	dev       uint32 // st_dev as the kernel encodes it (files on a device beyond 32 bits are not remembered)
	hasXattrs bool
}

// statKey is what must match, besides the file, for a remembered file to
// count as unchanged.
type statKey struct {
	size         int64
	mtime, ctime int64
}

// NewStatCache returns an empty cache of at most max files (0: the
// default).
func NewStatCache(max int) *StatCache {
	if max <= 0 {
		max = DefaultStatCacheEntries
	}
	c := &StatCache{xattrs: map[fileID][]cas.Xattr{}, max: max, racy: RacyWindow, nowFunc: time.Now,
		mapping: &slotMapping{}}
	// The table is outside the heap: the collector frees the cache, not
	// its table (a fabric, and so its cache, may be one of many a process
	// makes and drops).
	runtime.AddCleanup(c, (*slotMapping).free, c.mapping)
	return c
}

// Len is the number of files remembered.
func (c *StatCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func fileOf(st *unix.Stat_t) fileID { return fileID{dev: st.Dev, ino: st.Ino} }

func keyOf(st *unix.Stat_t) statKey {
	return statKey{size: st.Size, mtime: timeNs(st.Mtim.Sec, st.Mtim.Nsec), ctime: timeNs(st.Ctim.Sec, st.Ctim.Nsec)}
}

// lookup returns the id and the xattrs remembered for the file st
// describes if st matches them, and the entry's present stamp (see trust).
// Any change of a file's xattrs moves its ctime too, so they need not be
// listed again (the slice is the caller's).
func (c *StatCache) lookup(st *unix.Stat_t) (cas.ID, []cas.Xattr, uint64, bool) {
	if c == nil {
		return cas.ZeroID, nil, 0, false
	}
	f := fileOf(st)
	if !cacheable(f) {
		return cas.ZeroID, nil, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.find(f)
	if !ok || c.slots[i].statKey != keyOf(st) {
		return cas.ZeroID, nil, 0, false
	}
	var xs []cas.Xattr
	if c.slots[i].hasXattrs {
		xs = cloneXattrs(c.xattrs[f])
	}
	return c.slots[i].id, xs, c.resolve(i), true
}

// bind reports whether the entries' present stamps may be read against
// dc's counts: dc is the counter the cache was first bound to (an import
// into another store, or through another wrapper, checks every hit).
func (c *StatCache) bind(dc cas.DeletionCounter) bool {
	if c == nil || dc == nil || !reflect.TypeOf(dc).Comparable() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counter == nil {
		c.counter = dc
	}
	return c.counter == dc
}

// An import's token stands, in the present stamps of the entries it
// remembers, for the deletion count read when it started, until it has
// published its objects (see beginImport).
const importToken = 1 << 63

// maxImportTokens bounds the tokens kept: an entry whose token was
// dropped is checked by the next hit, as an unconfirmed one.
const maxImportTokens = 64

// importState is an import's count at its start, and whether it has
// published its objects.
type importState struct {
	n    uint64
	done bool
}

// beginImport returns the present stamp the files an import starting now,
// with the store's deletion count at n, remember: a token, resolved to n
// once the import calls endImport(tok, true), and never if it fails.
func (c *StatCache) beginImport(n uint64) uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	tok := importToken | c.seq
	if c.imports == nil {
		c.imports = map[uint64]importState{}
	}
	c.imports[tok] = importState{n: n}
	c.order = append(c.order, tok)
	for len(c.order) > maxImportTokens {
		delete(c.imports, c.order[0])
		c.order = c.order[1:]
	}
	return tok
}

// endImport resolves tok (published) or forgets it (failed).
func (c *StatCache) endImport(tok uint64, published bool) {
	if c == nil || tok == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.imports[tok]
	if !ok {
		return
	}
	if published {
		st.done = true
		c.imports[tok] = st
	} else {
		delete(c.imports, tok)
	}
}

// resolve returns the present stamp of slot i, its import's token
// replaced by that import's count once it published; the caller holds mu.
func (c *StatCache) resolve(i int) uint64 {
	p := c.slots[i].present
	if p&importToken == 0 {
		return p
	}
	if st, ok := c.imports[p]; ok && st.done {
		c.slots[i].present = st.n + 1
		return st.n + 1
	}
	return 0
}

// confirm stamps the entry of the file st describes, if it still holds
// id, as present at count n.
func (c *StatCache) confirm(st *unix.Stat_t, id cas.ID, n uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.find(fileOf(st)); ok && c.slots[i].id == id {
		c.slots[i].present = n + 1
	}
}

func cloneXattrs(xs []cas.Xattr) []cas.Xattr {
	if xs == nil {
		return nil
	}
	out := make([]cas.Xattr, len(xs))
	for i, x := range xs {
		x.Value = bytes.Clone(x.Value)
		out[i] = x
	}
	return out
}

// now is the moment a read starts, for remember.
func (c *StatCache) now() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.nowFunc()
}

// remember records that the file whose lstat before the read (which
// started at readStart) was st holds id and has xattrs, and reports
// whether it did: not for a racy file (see StatCache). The entry is not
// known present.
func (c *StatCache) remember(st *unix.Stat_t, id cas.ID, xattrs []cas.Xattr, readStart time.Time) bool {
	return c.rememberAs(st, id, xattrs, readStart, 0)
}

// rememberAs is remember with the entry's present stamp: an import's
// token (beginImport), since its objects may still sit in an unpublished
// batch.
func (c *StatCache) rememberAs(st *unix.Stat_t, id cas.ID, xattrs []cas.Xattr, readStart time.Time, present uint64) bool {
	if c == nil {
		return false
	}
	f := fileOf(st)
	if !cacheable(f) {
		return false
	}
	k := keyOf(st)
	limit := readStart.Add(-c.racy).UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if k.mtime >= limit || k.ctime >= limit {
		c.forget(f)
		return false
	}
	e := statEntry{ino: f.ino, statKey: k, id: id, present: present, dev: uint32(f.dev), hasXattrs: len(xattrs) > 0}
	i, ok := c.find(f)
	if !ok {
		if c.n >= c.max {
			c.evict(f)
		}
		if c.n+1 > len(c.slots)*7/8 {
			c.grow()
		}
		i = c.home(f)
		for c.slots[i].ino != 0 {
			i = c.next(i)
		}
		c.n++
	}
	c.slots[i] = e
	delete(c.xattrs, f)
	if e.hasXattrs {
		c.xattrs[f] = cloneXattrs(xattrs)
	}
	return true
}

// cacheable reports whether the cache can hold f: its inode is not 0 (the
// mark of a free slot) and its device fits 32 bits.
func cacheable(f fileID) bool { return f.ino != 0 && f.dev <= math.MaxUint32 }

// home is f's first slot; c.slots is not empty.
func (c *StatCache) home(f fileID) int {
	h := (f.ino ^ f.dev<<40 ^ f.dev>>24) * 0x9e3779b97f4a7c15
	hi, _ := bits.Mul64(h^h>>29, uint64(len(c.slots)))
	return int(hi)
}

func (c *StatCache) next(i int) int {
	if i++; i == len(c.slots) {
		return 0
	}
	return i
}

// find returns f's slot, if remembered.
func (c *StatCache) find(f fileID) (int, bool) {
	if c.n == 0 {
		return 0, false
	}
	for i := c.home(f); c.slots[i].ino != 0; i = c.next(i) {
		if c.slots[i].ino == f.ino && uint64(c.slots[i].dev) == f.dev {
			return i, true
		}
	}
	return 0, false
}

// grow doubles the table, up to what the bound needs.
func (c *StatCache) grow() {
	size := max(64, 2*len(c.slots))
	size = min(size, c.max+c.max/7+1)
	if size <= len(c.slots) {
		return
	}
	old, oldMapped := c.slots, c.mapping.b
	c.slots, c.mapping.b = allocSlots(size)
	// home orders slots by the same fraction of the hash at every size,
	// so walking the old table in order fills the new one from its start
	// too: the pages of the old table already walked go back to the
	// system as the new one's fill, and the two tables never take their
	// sum in memory at once (at a million files they would hold 180 MB).
	released := 0
	for j, e := range old {
		if e.ino != 0 {
			i := c.home(fileID{dev: uint64(e.dev), ino: e.ino})
			for c.slots[i].ino != 0 {
				i = c.next(i)
			}
			c.slots[i] = e
		}
		if oldMapped != nil {
			walked := (j + 1) * int(unsafe.Sizeof(statEntry{}))
			if done := walked &^ (releaseStep - 1); done > released {
				releaseSlots(oldMapped[released:done])
				released = done
			}
		}
	}
	unmapSlots(oldMapped)
}

// releaseStep is how much of an outgrown table grow gives back at a time
// (a multiple of the page size).
const releaseStep = 1 << 20

// allocSlots maps a zeroed table of n slots outside the Go heap: the
// collector neither scans it nor paces itself on it (on the heap a table
// of T bytes let garbage grow by T more before a collection), and the
// pages of an outgrown table go back to the system at once. Where the
// kernel refuses the mapping, the heap serves (mapped is then nil: heap
// memory must never reach munmap, which would unmap a large, page-aligned
// heap object under the Go runtime).
func allocSlots(n int) (slots []statEntry, mapped []byte) {
	b, err := mmapSlots(n * int(unsafe.Sizeof(statEntry{})))
	if err != nil {
		return make([]statEntry, n), nil
	}
	mappedSlots.Add(int64(len(b)))
	return unsafe.Slice((*statEntry)(unsafe.Pointer(unsafe.SliceData(b))), n), b
}

// unmapSlots unmaps a table allocSlots mapped (nil: none).
func unmapSlots(b []byte) {
	if len(b) == 0 {
		return
	}
	if munmapSlots(b) == nil {
		mappedSlots.Add(-int64(len(b)))
	}
}

// slotMapping holds a cache's mapped table for the cleanup that unmaps
// it when the cache is dropped.
type slotMapping struct{ b []byte }

func (m *slotMapping) free() { unmapSlots(m.b) }

// mmapSlots and munmapSlots map and unmap tables (tests replace them);
// mappedSlots counts the bytes mapped.
var (
	mmapSlots = func(size int) ([]byte, error) {
		return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	}
	munmapSlots = unix.Munmap
	// releaseSlots drops the pages of a range of a mapped table, which is
	// not read again (grow); a failure only keeps them until the unmap.
	releaseSlots = func(b []byte) { _ = unix.Madvise(b, unix.MADV_DONTNEED) }
	mappedSlots  atomic.Int64
)

// evict forgets one remembered file to make room for f: the one in f's
// first slot, or after it.
func (c *StatCache) evict(f fileID) {
	if c.n == 0 {
		return
	}
	i := c.home(f)
	for c.slots[i].ino == 0 {
		i = c.next(i)
	}
	c.remove(i)
}

func (c *StatCache) forget(f fileID) {
	if i, ok := c.find(f); ok {
		c.remove(i)
	}
}

// remove frees slot i, moving back the entries after it that probing
// would otherwise no longer reach (backward-shift deletion).
func (c *StatCache) remove(i int) {
	e := c.slots[i]
	if e.hasXattrs {
		delete(c.xattrs, fileID{dev: uint64(e.dev), ino: e.ino})
	}
	c.n--
	size := len(c.slots)
	for j := c.next(i); c.slots[j].ino != 0; j = c.next(j) {
		h := c.home(fileID{dev: uint64(c.slots[j].dev), ino: c.slots[j].ino})
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if (j-h+size)%size >= (j-i+size)%size {
			c.slots[i] = c.slots[j]
			i = j
		}
	}
	c.slots[i] = statEntry{}
}
