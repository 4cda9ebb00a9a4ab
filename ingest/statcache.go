package ingest

import (
	"bytes"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// StatCache lets Dir skip reading the files of a tree it imported before
// and that did not change since, as git's index does for `git status`: per
// file (device and inode) it remembers the size, mtime and ctime (all in
// nanoseconds) and the id of the content it read. A file whose lstat
// matches all five is taken as unchanged: Dir asks the store whether
// it still has the object (which also tells a collection running meanwhile
// that the import uses it) and reads nothing. Any difference, a missing
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
// Keyed by device and inode rather than path, an entry holds no string:
// about 110 bytes in the map. A hard link or a rename of an unchanged file
// is still the same content; a new file on a reused inode has a ctime after
// the old one was remembered (which was at least RacyWindow before a read).
//
// The cache lives in memory, per daemon process, and holds at most its
// bound of files (when full, remembering one forgets another), so an import
// of a huge tree costs the daemon a fixed few MiB, not memory per file. A
// StatCache is safe for concurrent use. Upper (seals) never uses it: an
// attempt's writes are new content.
type StatCache struct {
	mu      sync.Mutex
	m       map[fileID]statEntry
	max     int
	racy    time.Duration
	nowFunc func() time.Time
}

// RacyWindow is how much older than the start of its read a file's mtime and
// ctime must be for the StatCache to remember it.
const RacyWindow = time.Second

// DefaultStatCacheEntries bounds a StatCache made with NewStatCache(0):
// a few MiB of the daemon's memory (measured: 64k files cost esfd 28 MiB of
// peak RSS, as the map grows), enough for a typical workspace.
const DefaultStatCacheEntries = 1 << 14

// fileID names a file: its device and inode.
type fileID struct{ dev, ino uint64 }

type statEntry struct {
	statKey
	id     cas.ID
	xattrs []cas.Xattr
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
	return &StatCache{m: map[fileID]statEntry{}, max: max, racy: RacyWindow, nowFunc: time.Now}
}

// Len is the number of files remembered.
func (c *StatCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func fileOf(st *unix.Stat_t) fileID { return fileID{dev: st.Dev, ino: st.Ino} }

func keyOf(st *unix.Stat_t) statKey {
	return statKey{size: st.Size, mtime: timeNs(st.Mtim.Sec, st.Mtim.Nsec), ctime: timeNs(st.Ctim.Sec, st.Ctim.Nsec)}
}

// lookup returns the id and the xattrs remembered for the file st
// describes if st matches them. Any change of a file's xattrs moves its ctime too, so they need not
// be listed again (the slice is the caller's).
func (c *StatCache) lookup(st *unix.Stat_t) (cas.ID, []cas.Xattr, bool) {
	if c == nil {
		return cas.ZeroID, nil, false
	}
	c.mu.Lock()
	e, ok := c.m[fileOf(st)]
	c.mu.Unlock()
	if !ok || e.statKey != keyOf(st) {
		return cas.ZeroID, nil, false
	}
	return e.id, cloneXattrs(e.xattrs), true
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
// started at readStart) was st holds id and has xattrs; unless the file is
// racy (see StatCache).
func (c *StatCache) remember(st *unix.Stat_t, id cas.ID, xattrs []cas.Xattr, readStart time.Time) {
	if c == nil {
		return
	}
	e := statEntry{statKey: keyOf(st), id: id, xattrs: cloneXattrs(xattrs)}
	limit := readStart.Add(-c.racy).UnixNano()
	if e.mtime >= limit || e.ctime >= limit {
		c.forget(fileOf(st))
		return
	}
	f := fileOf(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[f]; !ok && len(c.m) >= c.max {
		for old := range c.m { // an arbitrary one
			delete(c.m, old)
			break
		}
	}
	c.m[f] = e
}

func (c *StatCache) forget(f fileID) {
	c.mu.Lock()
	delete(c.m, f)
	c.mu.Unlock()
}
