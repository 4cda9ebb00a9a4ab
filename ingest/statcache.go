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
// absolute path it remembers the file's device, inode, size, mtime and
// ctime (all in nanoseconds) and the id of the content it read. A file whose
// lstat matches all five is taken as unchanged: Dir asks the store whether
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
// The cache lives in memory, per daemon process; at most MaxEntries paths
// (then it starts over). A StatCache is safe for concurrent use. Upper
// (seals) never uses it: an attempt's writes are new content.
type StatCache struct {
	mu      sync.Mutex
	m       map[string]statEntry
	max     int
	racy    time.Duration
	nowFunc func() time.Time
}

// RacyWindow is how much older than the start of its read a file's mtime and
// ctime must be for the StatCache to remember it.
const RacyWindow = time.Second

// DefaultStatCacheEntries bounds a StatCache made with NewStatCache(0).
const DefaultStatCacheEntries = 1 << 20

type statEntry struct {
	statKey
	id     cas.ID
	xattrs []cas.Xattr
}

// statKey is what must match for a remembered file to count as unchanged.
type statKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

// NewStatCache returns an empty cache of at most max paths (0: the
// default).
func NewStatCache(max int) *StatCache {
	if max <= 0 {
		max = DefaultStatCacheEntries
	}
	return &StatCache{m: map[string]statEntry{}, max: max, racy: RacyWindow, nowFunc: time.Now}
}

// Len is the number of paths remembered.
func (c *StatCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func keyOf(st *unix.Stat_t) statKey {
	return statKey{dev: st.Dev, ino: st.Ino, size: st.Size,
		mtime: timeNs(st.Mtim.Sec, st.Mtim.Nsec), ctime: timeNs(st.Ctim.Sec, st.Ctim.Nsec)}
}

// lookup returns the id and the xattrs remembered for path if st matches
// it. Any change of a file's xattrs moves its ctime too, so they need not
// be listed again (the slice is the caller's).
func (c *StatCache) lookup(path string, st *unix.Stat_t) (cas.ID, []cas.Xattr, bool) {
	if c == nil {
		return cas.ZeroID, nil, false
	}
	c.mu.Lock()
	e, ok := c.m[path]
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

// remember records that path, whose lstat before the read (which started
// at readStart) was st, holds id and has xattrs; unless the file is racy
// (see StatCache).
func (c *StatCache) remember(path string, st *unix.Stat_t, id cas.ID, xattrs []cas.Xattr, readStart time.Time) {
	if c == nil {
		return
	}
	e := statEntry{statKey: keyOf(st), id: id, xattrs: cloneXattrs(xattrs)}
	limit := readStart.Add(-c.racy).UnixNano()
	if e.mtime >= limit || e.ctime >= limit {
		c.forget(path)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[path]; !ok && len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[path] = e
}

func (c *StatCache) forget(path string) {
	c.mu.Lock()
	delete(c.m, path)
	c.mu.Unlock()
}
