package fusefs

import (
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// handlelessDirs sits between the kernel and go-fuse's node bridge and
// takes the two round trips of OPENDIR and RELEASEDIR off every directory
// open.
//
// A kernel that advertises FUSE_NO_OPENDIR_SUPPORT (Linux 5.1 and later)
// takes an ENOSYS answer to OPENDIR as "this server keeps no directory
// handles": from then on it opens every directory of the mount itself with
// handle 0 and FOPEN_KEEP_CACHE|FOPEN_CACHE_DIR, sends no RELEASEDIR, and
// keeps listings in its page cache (fs/fuse/file.c, fuse_file_open, and
// fuse_file_put, which skips the release when no open was sent). A warm
// walk (git status, find) then costs the server nothing at all, where it
// cost two requests per directory with handles.
//
// go-fuse v2.12's bridge cannot serve READDIR or READDIRPLUS with handle 0
// (it finds no stream for it and answers an empty listing), so this layer
// serves them by opening a bridge handle for the one request and releasing
// it before answering: the listing a handle reads is the directory node's
// tree, which the node keeps for its life (until the kernel's FORGET), so
// a handle costs a small allocation, and offsets are positions in the tree
// (listingHandle.Seekdir), valid across the requests of one listing and
// across handles. Nothing outlives the request.
//
// A kernel without the flag gets the bridge unchanged.
type handlelessDirs struct {
	fuse.RawFileSystem
	fsys      *FS
	noOpendir atomic.Bool
}

func (w *handlelessDirs) Init(s *fuse.Server) {
	w.RawFileSystem.Init(s)
	w.noOpendir.Store(s.KernelSettings().Flags64()&fuse.CAP_NO_OPENDIR_SUPPORT != 0)
	w.fsys.handleless.Store(w.noOpendir.Load())
}

func (w *handlelessDirs) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	w.fsys.Counters.Opendirs.Add(1)
	if w.noOpendir.Load() {
		return fuse.ENOSYS
	}
	return w.RawFileSystem.OpenDir(cancel, in, out)
}

func (w *handlelessDirs) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Fh != 0 {
		return w.RawFileSystem.ReadDir(cancel, in, out)
	}
	return w.handleless(cancel, in, out, w.RawFileSystem.ReadDir)
}

func (w *handlelessDirs) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Fh != 0 {
		return w.RawFileSystem.ReadDirPlus(cancel, in, out)
	}
	return w.handleless(cancel, in, out, w.RawFileSystem.ReadDirPlus)
}

// handleless serves one READDIR(PLUS) sent with handle 0 through a bridge
// handle opened and released around it.
func (w *handlelessDirs) handleless(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList,
	read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	open := fuse.OpenIn{InHeader: in.InHeader, Flags: syscall.O_RDONLY | syscall.O_DIRECTORY}
	var opened fuse.OpenOut
	if st := w.RawFileSystem.OpenDir(cancel, &open, &opened); !st.Ok() {
		return st
	}
	defer w.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: in.InHeader, Fh: opened.Fh})
	if opened.Fh == 0 { // never from the bridge; never loop on it
		return fuse.EIO
	}
	r := *in
	r.Fh = opened.Fh
	return read(cancel, &r, out)
}

// FsyncDir and Fsync answer ENOSYS: the projection is read-only and has
// nothing to sync, and the kernel takes ENOSYS as "fsync is a no-op here",
// answers 0 to every fsync after, and sends no more (fs/fuse/file.c,
// fuse_fsync_common). The bridge answered ENOTSUP, which fsync(2) returned:
// fsync of a projected directory or file failed where a read-only disk
// file system succeeds.
func (w *handlelessDirs) FsyncDir(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.ENOSYS }

func (w *handlelessDirs) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.ENOSYS }
