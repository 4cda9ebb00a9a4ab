package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// dirNode is a directory of a projected tree. Its tree is read on first use
// and kept while the kernel keeps the inode.
type dirNode struct {
	fs.Inode
	fsys *FS
	root cas.ID // the projected root, for inode numbers
	path string // path inside root ("" for the root itself)
	id   cas.ID // this directory's tree

	// tree is read on first use; loaded is set (after tree or err) once
	// the outcome is final. Only a missing or corrupt tree is a final
	// error: anything else (an interrupted request, a transient failure of
	// the store) is reported and tried again on the next use.
	//
	// The tree stays encoded (cas.TreeView): a lookup or a listing decodes
	// the entries it needs, so a directory of a million names costs its
	// encoded bytes, not a decoded Entry per name.
	mu     sync.Mutex
	loaded atomic.Bool
	tree   *cas.TreeView
	err    syscall.Errno
}

var (
	_ fs.NodeLookuper       = (*dirNode)(nil)
	_ fs.NodeOpendirHandler = (*dirNode)(nil)
	_ fs.NodeGetattrer      = (*dirNode)(nil)
	_ fs.NodeGetxattrer     = (*dirNode)(nil)
	_ fs.NodeListxattrer    = (*dirNode)(nil)
)

func (d *dirNode) ensure(ctx context.Context) syscall.Errno {
	if d.loaded.Load() {
		return d.err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.loaded.Load() {
		return d.err
	}
	d.fsys.Counters.TreeReads.Add(1)
	// Not cancellable: the kernel interrupts a request whenever the
	// calling thread gets a signal (a Go program's preemption signal is
	// enough), and a short local read is better finished than failed with
	// EINTR, which the caller's lstat or open would return as is.
	t, err := cas.ReadTreeView(context.WithoutCancel(ctx), d.fsys.opts.Store, d.id)
	if err != nil {
		errno := toErrno(err)
		if errno != syscall.ENOENT {
			d.fsys.opts.Logger.Error("read tree", "tree", d.id.String(), "err", err)
		}
		if errno == syscall.ENOENT || errors.Is(err, cas.ErrCorrupt) {
			d.err = errno
			d.loaded.Store(true)
		}
		return errno
	}
	d.tree = t
	d.loaded.Store(true)
	return 0
}

func (d *dirNode) fillAttr(out *fuse.Attr) {
	fillCommon(out, &d.tree.Attr)
	out.Mode = syscall.S_IFDIR | d.tree.Mode
	out.Ino = inoFor(d.root, d.path, false)
	out.Size = 4096
	out.Blocks = 8
	out.Nlink = uint32(2 + d.tree.Dirs())
}

func (d *dirNode) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := d.ensure(ctx); errno != 0 {
		return errno
	}
	d.fillAttr(&out.Attr)
	out.SetTimeout(d.fsys.opts.Timeout)
	return 0
}

func (d *dirNode) child(name string) string {
	if d.path == "" {
		return name
	}
	return d.path + "/" + name
}

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	d.fsys.Counters.Lookups.Add(1)
	if errno := d.ensure(ctx); errno != 0 {
		return nil, errno
	}
	e, ok := d.tree.Lookup(name)
	if !ok {
		// Cache the miss as long as a hit: the tree never changes.
		out.SetEntryTimeout(d.fsys.opts.Timeout)
		return nil, syscall.ENOENT
	}
	p := d.child(name)
	if e.Type == cas.TypeDir {
		c := &dirNode{fsys: d.fsys, root: d.root, path: p, id: e.ID}
		if errno := c.ensure(ctx); errno != 0 {
			// Not a negative entry: the tree may be stored later (see
			// rootsDir.Lookup), and the name is in its parent.
			out.SetEntryTimeout(time.Nanosecond)
			return nil, errno
		}
		c.fillAttr(&out.Attr)
		d.fsys.setTimeouts(out)
		return d.NewInode(ctx, c, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: out.Attr.Ino}), 0
	}
	n := &leafNode{fsys: d.fsys, entry: &e, ino: d.leafIno(&e, p)}
	n.fillAttr(&out.Attr)
	d.fsys.setTimeouts(out)
	return d.NewInode(ctx, n, fs.StableAttr{Mode: typeMode(e.Type), Ino: n.ino}), 0
}

func (d *dirNode) leafIno(e *cas.Entry, p string) uint64 {
	if e.LinkGroup != "" {
		return inoFor(d.root, e.LinkGroup, true)
	}
	return inoFor(d.root, p, false)
}

// dirent is entry i as a directory entry. Only a member of a hard-link
// group needs the entry decoded (its inode number follows the group).
func (d *dirNode) dirent(i int) fuse.DirEntry {
	name, typ := d.tree.Name(i), d.tree.Type(i)
	p := d.child(name)
	ino := inoFor(d.root, p, false)
	if typ != cas.TypeDir && d.tree.Linked(i) {
		e := d.tree.Entry(i)
		ino = d.leafIno(&e, p)
	}
	return fuse.DirEntry{Name: name, Mode: typeMode(typ), Ino: ino}
}

// OpendirHandle opens the directory for listing and lets the kernel keep
// what it reads in its page cache (FOPEN_CACHE_DIR, FOPEN_KEEP_CACHE): a
// projected directory never changes, so after the first listing a readdir
// costs the kernel an OPENDIR and a RELEASEDIR round trip, not a READDIRPLUS
// that re-sends every entry with its attributes.
func (d *dirNode) OpendirHandle(ctx context.Context, _ uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if errno := d.ensure(ctx); errno != 0 {
		return nil, 0, errno
	}
	return &listingHandle{d: d}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// listingHandle serves an open directory from its tree, entry by entry,
// and counts, in Counters.Readdirs, the listings the kernel actually asked
// for (those read from the start: a listing spans several requests, and
// without OPENDIR each request has a handle of its own, see
// handlelessDirs). Offsets are positions in the tree (1 after the first
// entry).
type listingHandle struct {
	d    *dirNode
	mu   sync.Mutex
	next int
	// started is set once this handle's position leaves 0 by reading.
	started bool
}

var (
	_ fs.FileReaddirenter = (*listingHandle)(nil)
	_ fs.FileSeekdirer    = (*listingHandle)(nil)
)

func (h *listingHandle) Readdirent(context.Context) (*fuse.DirEntry, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.next == 0 && !h.started {
		h.started = true
		h.d.fsys.Counters.Readdirs.Add(1)
	}
	if h.next >= h.d.tree.Len() {
		return nil, 0
	}
	e := h.d.dirent(h.next)
	h.next++
	e.Off = uint64(h.next)
	return &e, 0
}

func (h *listingHandle) Seekdir(_ context.Context, off uint64) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	// A position past the end (lseek on the directory, or a listing
	// the kernel cached only in part) reads as the end, as on a disk
	// file system, not EINVAL.
	h.next = int(min(off, uint64(h.d.tree.Len())))
	h.started = false // rewinddir: a new listing
	return 0
}

func (d *dirNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if errno := d.ensure(ctx); errno != 0 {
		return 0, errno
	}
	return getxattr(d.tree.Xattrs, attr, dest)
}

func (d *dirNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if errno := d.ensure(ctx); errno != 0 {
		return 0, errno
	}
	return listxattr(d.tree.Xattrs, dest)
}

// leafNode is any non-directory: file, symlink, device or fifo. Its entry
// is decoded from the parent's tree by the lookup that made the node, and
// lives as long as the inode the kernel holds.
type leafNode struct {
	fs.Inode
	fsys  *FS
	entry *cas.Entry
	ino   uint64
}

var (
	_ fs.NodeGetattrer   = (*leafNode)(nil)
	_ fs.NodeLseeker     = (*leafNode)(nil)
	_ fs.NodeOpener      = (*leafNode)(nil)
	_ fs.NodeReadlinker  = (*leafNode)(nil)
	_ fs.NodeGetxattrer  = (*leafNode)(nil)
	_ fs.NodeListxattrer = (*leafNode)(nil)
)

func (n *leafNode) fillAttr(out *fuse.Attr) {
	e := n.entry
	fillCommon(out, &e.Attr)
	out.Mode = typeMode(e.Type) | e.Mode
	out.Ino = n.ino
	out.Size = uint64(e.Size)
	out.Blocks = leafBlocks(e)
	out.Nlink = 1
	if e.Nlink > 1 {
		out.Nlink = e.Nlink
	}
	if e.Type == cas.TypeCharDev || e.Type == cas.TypeBlockDev {
		out.Rdev = uint32(mkdev(e.Major, e.Minor))
	}
}

func (n *leafNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fillAttr(&out.Attr)
	out.SetTimeout(n.fsys.opts.Timeout)
	return 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the holes the tree records
// (the kernel handles the other whences itself). Overlayfs's copy-up and
// cp, tar and rsync skip holes this way, so a sparse file stays sparse
// when it is copied out of the projection.
func (n *leafNode) Lseek(_ context.Context, _ fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	if off > 1<<63-1 {
		return 0, syscall.ENXIO
	}
	var got int64
	var ok bool
	switch whence {
	case unix.SEEK_DATA:
		got, ok = cas.SeekData(n.entry.Holes, n.entry.Size, int64(off))
	case unix.SEEK_HOLE:
		got, ok = cas.SeekHole(n.entry.Holes, n.entry.Size, int64(off))
	default:
		return 0, syscall.EINVAL
	}
	if !ok {
		return 0, syscall.ENXIO
	}
	return uint64(got), 0
}

func (n *leafNode) Readlink(context.Context) ([]byte, syscall.Errno) {
	if n.entry.Type != cas.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(n.entry.Target), 0
}

func (n *leafNode) Getxattr(_ context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return getxattr(n.entry.Xattrs, attr, dest)
}

func (n *leafNode) Listxattr(_ context.Context, dest []byte) (uint32, syscall.Errno) {
	return listxattr(n.entry.Xattrs, dest)
}

// Open serves a file's blob. Writes are refused (the mount is read-only in
// the kernel as well). Every open checks the blob (see verifyFD and
// verify) before anything of it is served.
func (n *leafNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.fsys.Counters.Opens.Add(1)
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		return nil, 0, syscall.EROFS
	}
	if n.entry.Type != cas.TypeFile {
		return nil, 0, syscall.EINVAL
	}
	if n.fsys.paths != nil {
		// Open first and verify what this very descriptor reads, so the
		// file handed to the kernel is the one checked.
		fd, err := syscall.Open(n.fsys.paths.Path(n.entry.ID), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err == syscall.ENOENT {
			// A cache in front of a remote store (cas/tier) may not hold
			// the blob yet, or evicted it: a Get fetches it (verified).
			if errno := n.fsys.verify(ctx, n.entry.ID); errno != 0 {
				return nil, 0, errno
			}
			fd, err = syscall.Open(n.fsys.paths.Path(n.entry.ID), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		}
		if err != nil {
			return nil, 0, toErrno(err)
		}
		if errno := n.fsys.verifyFD(ctx, n.entry.ID, fd); errno != 0 {
			syscall.Close(fd)
			return nil, 0, errno
		}
		if errno := n.fsys.checkHoles(ctx, n.entry); errno != 0 {
			syscall.Close(fd)
			return nil, 0, errno
		}
		return &fdHandle{fsys: n.fsys, fd: fd}, fuse.FOPEN_KEEP_CACHE, 0
	}
	if errno := n.fsys.verify(ctx, n.entry.ID); errno != 0 {
		return nil, 0, errno
	}
	if errno := n.fsys.checkHoles(ctx, n.entry); errno != 0 {
		return nil, 0, errno
	}
	return &streamHandle{fsys: n.fsys, id: n.entry.ID}, fuse.FOPEN_KEEP_CACHE, 0
}

// verifyBuffer is the read size of a blob's verification.
const verifyBuffer = 256 << 10

// verify hashes a blob from a store that cannot name its files, on every
// open: each Get may come from disk (or further).
func (f *FS) verify(ctx context.Context, id cas.ID) syscall.Errno {
	f.Counters.BlobVerifies.Add(1)
	// Not cancellable, like a tree read (see dirNode.ensure): an open
	// interrupted by a signal would fail with EINTR, which open(2) callers
	// do not retry; a caller that died leaves a verified blob behind.
	rc, err := f.opts.Store.Get(context.WithoutCancel(ctx), id)
	if err == nil {
		// Large reads: io.Discard would read in 8 KiB pieces, a syscall
		// and a hasher call each.
		_, err = io.CopyBuffer(struct{ io.Writer }{io.Discard}, rc, make([]byte, verifyBuffer))
		rc.Close()
	}
	if err != nil {
		f.corrupt(id, err)
		return toErrno(err)
	}
	return 0
}

// fileKey identifies one state of a blob file: any write to it, a
// replacement or a truncation changes it (ctime cannot be set back).
type fileKey struct {
	dev, ino   uint64
	size       int64
	mtim, ctim syscall.Timespec
}

// verifyFD checks the blob file fd against id before the kernel is handed
// it. The blob is hashed whenever its content may come from disk into the
// page cache the kernel serves it from: when the file changed since the
// last good hash (fileKey), or when not all of it is in the page cache
// (cachestat(2); where the kernel lacks it, always). A file that is wholly
// cached and unchanged since a good hash holds what was hashed. Hashing
// reads through fd, which also brings the file into the cache, verified.
//
// What this cannot see: a descriptor already handed to the kernel reads
// the file directly (passthrough), so pages evicted and read back while it
// is open are not re-hashed until the next open.
func (f *FS) verifyFD(ctx context.Context, id cas.ID, fd int) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return toErrno(err)
	}
	key := fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtim: st.Mtim, ctim: st.Ctim}
	f.mu.Lock()
	good, ok := f.verified[id]
	f.mu.Unlock()
	if ok && good == key && resident(fd, st.Size) {
		return 0
	}
	f.Counters.BlobVerifies.Add(1)
	h := cas.NewHasher()
	buf := make([]byte, verifyBuffer)
	var off int64
	for {
		n, err := syscall.Pread(fd, buf, off)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			f.opts.Logger.Error("verify blob: read", "blob", id.String(), "err", err)
			return syscall.EIO
		}
		if n == 0 {
			break
		}
		h.Write(buf[:n])
		off += int64(n)
	}
	if got := cas.IDFromHash(h); got != id || off != st.Size {
		f.corrupt(id, fmt.Errorf("blob %s: content hashes to %s (%d bytes): %w", id, got.Short(), off, cas.ErrCorrupt))
		f.mu.Lock()
		delete(f.verified, id)
		f.mu.Unlock()
		return syscall.EIO
	}
	f.mu.Lock()
	if len(f.verified) >= maxVerified {
		// Forgetting only costs a hash on the next open of each blob.
		clear(f.verified)
	}
	f.verified[id] = key
	f.mu.Unlock()
	return 0
}

// maxVerified bounds the blobs verifyFD remembers (about 100 bytes each).
const maxVerified = 1 << 20

// resident reports whether all size bytes of fd are in the page cache.
func resident(fd int, size int64) bool {
	if size == 0 {
		return true
	}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: 0, Len: uint64(size)}, &cs, 0); err != nil {
		return false // unknown: hash
	}
	pages := (uint64(size) + uint64(os.Getpagesize()) - 1) / uint64(os.Getpagesize())
	return cs.Cache >= pages
}

// corrupt reports damage found in a blob: a log line, the counter the
// daemon's metrics show, and Options.OnCorrupt (which the daemon turns
// into a cas.corrupt event). A blob that is merely missing is not damage.
func (f *FS) corrupt(id cas.ID, err error) {
	if !errors.Is(err, cas.ErrCorrupt) {
		f.opts.Logger.Error("verify blob", "blob", id.String(), "err", err)
		return
	}
	f.Counters.CorruptBlobs.Add(1)
	f.opts.Logger.Error("corrupt blob: refusing to serve it", "blob", id.String(), "err", err)
	if f.opts.OnCorrupt != nil {
		f.opts.OnCorrupt(id)
	}
}

// fdHandle reads a local blob file; the kernel reads it directly when
// passthrough is available.
type fdHandle struct {
	fsys *FS
	fd   int
}

var (
	_ fs.FilePassthroughFder = (*fdHandle)(nil)
	_ fs.FileReader          = (*fdHandle)(nil)
	_ fs.FileReleaser        = (*fdHandle)(nil)
)

func (h *fdHandle) PassthroughFd() (int, bool) { return h.fd, true }

func (h *fdHandle) Read(_ context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.fsys.Counters.Reads.Add(1)
	return fuse.ReadResultFd(uintptr(h.fd), off, len(dest)), 0
}

func (h *fdHandle) Release(context.Context) syscall.Errno {
	return toErrno(syscall.Close(h.fd))
}

// streamHandle serves a blob from a store that cannot name files: it reads
// forward and reopens on a backward seek. Good enough for fakes and remote
// tiers behind a local cache; the hot path is fdHandle.
type streamHandle struct {
	fsys *FS
	id   cas.ID
	mu   sync.Mutex
	rc   io.ReadCloser
	pos  int64
}

func (h *streamHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.fsys.Counters.Reads.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rc == nil || off < h.pos {
		if h.rc != nil {
			h.rc.Close()
		}
		rc, err := h.fsys.opts.Store.Get(ctx, h.id)
		if err != nil {
			return nil, toErrno(err)
		}
		h.rc, h.pos = rc, 0
	}
	if off > h.pos {
		n, err := io.CopyN(io.Discard, h.rc, off-h.pos)
		h.pos += n
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, toErrno(err)
		}
	}
	n, err := io.ReadFull(h.rc, dest)
	h.pos += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *streamHandle) Release(context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rc != nil {
		h.rc.Close()
	}
	return 0
}

func fillCommon(out *fuse.Attr, a *cas.Attr) {
	out.Uid, out.Gid = a.UID, a.GID
	sec, nsec := uint64(a.MtimeNs/1e9), uint32(a.MtimeNs%1e9)
	if a.MtimeNs < 0 {
		sec, nsec = 0, 0
	}
	out.Mtime, out.Mtimensec = sec, nsec
	out.Atime, out.Atimensec = sec, nsec
	out.Ctime, out.Ctimensec = sec, nsec
	out.Blksize = blockSize
}

// blockSize is the block size the projection reports, that of a disk
// filesystem.
const blockSize = 4096

// fastSymlinkMax is the longest symlink target ext4 keeps in the inode
// itself, taking no block.
const fastSymlinkMax = 59

// leafBlocks is st_blocks (512-byte units) as ext4 with 4 KiB blocks
// reports it: a file's blocks that hold data (none for holes), one block
// for a symlink whose target does not fit in the inode, none otherwise.
func leafBlocks(e *cas.Entry) uint64 {
	var n int64
	switch e.Type {
	case cas.TypeFile:
		n = cas.DataBlocks(e.Holes, e.Size, blockSize)
	case cas.TypeSymlink:
		if len(e.Target) > fastSymlinkMax {
			n = 1
		}
	}
	return uint64(n) * (blockSize / 512)
}

func typeMode(t cas.Type) uint32 {
	switch t {
	case cas.TypeDir:
		return syscall.S_IFDIR
	case cas.TypeSymlink:
		return syscall.S_IFLNK
	case cas.TypeCharDev:
		return syscall.S_IFCHR
	case cas.TypeBlockDev:
		return syscall.S_IFBLK
	case cas.TypeFIFO:
		return syscall.S_IFIFO
	}
	return syscall.S_IFREG
}

func mkdev(major, minor uint32) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12 | uint64(major&^0xfff)<<32
}

func getxattr(xs []cas.Xattr, name string, dest []byte) (uint32, syscall.Errno) {
	for _, x := range xs {
		if x.Name == name {
			if len(dest) == 0 {
				return uint32(len(x.Value)), 0
			}
			if len(dest) < len(x.Value) {
				return uint32(len(x.Value)), syscall.ERANGE
			}
			return uint32(copy(dest, x.Value)), 0
		}
	}
	return 0, syscall.ENODATA
}

func listxattr(xs []cas.Xattr, dest []byte) (uint32, syscall.Errno) {
	n := 0
	for _, x := range xs {
		n += len(x.Name) + 1
	}
	if len(dest) == 0 {
		return uint32(n), 0
	}
	if len(dest) < n {
		return uint32(n), syscall.ERANGE
	}
	off := 0
	for _, x := range xs {
		off += copy(dest[off:], x.Name)
		dest[off] = 0
		off++
	}
	return uint32(n), 0
}

// toErrno is the one translation of errors to errnos in this package.
func toErrno(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, cas.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	default:
		return syscall.EIO
	}
}
