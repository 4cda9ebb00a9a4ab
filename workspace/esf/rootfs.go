package esf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// rootFS is an attempt's writable root on this host, seen as the container
// sees it. Every path is resolved by the kernel with openat2 and
// RESOLVE_IN_ROOT relative to a descriptor of the root: ".." stops at the
// top and a symlink, absolute or relative, names a path inside the root, so
// nothing the container writes can send a read or a write outside it.
// Operations on a name (create, rename, unlink) resolve the parent that
// way and then act on the last component alone with an *at call, which
// never follows it.
//
// A rootFS is opened per operation and closed at its end: a descriptor
// held open would keep the mount busy and make the daemon's unmount (on
// release or suspend) fail.
type rootFS struct {
	fd  int    // O_PATH descriptor of the root directory
	dir string // host path, for messages
}

// resolveFlags keeps resolution inside the root, refuses /proc-style magic
// links (which jump to whatever they name) and mount crossings (nothing is
// mounted inside an attempt root on the host side).
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// errRootGone says the directory is no longer the attempt's mounted root:
// the attempt was released, suspended or reclaimed under us.
var errRootGone = errors.New("attempt root is not mounted")

// openRoot opens dir, which must be a mount point (the overlay of a live
// attempt); an unmounted directory (a released attempt leaves an empty
// mountpoint until its delta is deleted) is errRootGone, so a write never
// lands in the daemon's state dir.
func openRoot(dir string) (*rootFS, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%s: %w", dir, errRootGone)
		}
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	var st, parent unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Fstatat(fd, "..", &parent, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Dev == parent.Dev {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", dir, errRootGone)
	}
	return &rootFS{fd: fd, dir: dir}, nil
}

func (r *rootFS) close() { unix.Close(r.fd) }

// rel is the spelling of the absolute, cleaned path p that openat2 takes
// relative to the root.
func rel(p string) string {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return "."
	}
	return p
}

// open resolves p inside the root. The kernel answers EAGAIN when a
// concurrent rename might have let ".." race out; it asks for a retry.
func (r *rootFS) open(p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveFlags}
	for range 32 {
		fd, err := unix.Openat2(r.fd, rel(p), &how)
		if err != unix.EAGAIN && err != unix.EINTR {
			return fd, err
		}
	}
	return -1, unix.EAGAIN
}

// reopen turns an O_PATH descriptor into a real one of the same inode
// (open(2) of /proc/self/fd/N opens what the descriptor names, whatever
// happened to its path since). Checking the type on the O_PATH descriptor
// first means a FIFO or a device is never opened.
func reopen(fd int, flags int) (*os.File, error) {
	return os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
}

// parent resolves the directory holding the last component of p and
// returns an O_PATH descriptor of it and that component. p must not be
// the root.
func (r *rootFS) parent(p string) (int, string, error) {
	dir, base := path.Split(rel(p))
	if base == "" || base == "." {
		return -1, "", unix.EINVAL
	}
	fd, err := r.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// info describes the entry name of the directory dirfd without following
// it, for a listing whose paths are under abs.
func info(dirfd int, name, abs string) (vfs.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return vfs.FileInfo{}, err
	}
	fi := fileInfo(abs, &st)
	if fi.Mode&fs.ModeSymlink != 0 {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return vfs.FileInfo{}, err
		}
		fi.Target = string(buf[:n])
	}
	return fi, nil
}

func fileInfo(abs string, st *unix.Stat_t) vfs.FileInfo {
	return vfs.FileInfo{Path: abs, Size: st.Size, Mode: fileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Unix())}
}

// fileMode converts a stat mode to an fs.FileMode (type, permission and
// the setuid, setgid and sticky bits).
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// openFile opens the regular file at p (following symlinks inside the
// root) for reading. Anything else is fs.ErrInvalid.
func (r *rootFS) openFile(p string) (*os.File, int64, error) {
	pfd, err := r.open(p, unix.O_PATH, 0)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, 0, fs.ErrInvalid
	}
	f, err := reopen(pfd, os.O_RDONLY)
	if err != nil {
		return nil, 0, err
	}
	return f, st.Size, nil
}

// list returns the entries of the directory at p (following symlinks
// inside the root), or, for anything else, p's own entry as its parent's
// listing shows it.
func (r *rootFS) list(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	pfd, err := r.open(p, unix.O_PATH, 0)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ELOOP) {
		return nil, err
	}
	var st unix.Stat_t
	if err == nil {
		defer unix.Close(pfd)
		if err := unix.Fstat(pfd, &st); err != nil {
			return nil, err
		}
	}
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// A file, or a symlink that names nothing inside the root: the
		// entry itself.
		if p == "/" {
			return nil, err
		}
		dfd, base, perr := r.parent(p)
		if perr != nil {
			return nil, perr
		}
		defer unix.Close(dfd)
		fi, ierr := info(dfd, base, p)
		if ierr != nil {
			return nil, ierr
		}
		return []vfs.FileInfo{fi}, nil
	}
	d, err := reopen(pfd, os.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	dfd := int(d.Fd())
	out := make([]vfs.FileInfo, 0, len(names))
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fi, err := info(dfd, n, path.Join(p, n))
		if errors.Is(err, unix.ENOENT) {
			continue // removed while we listed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	sortInfos(out)
	return out, nil
}

func sortInfos(s []vfs.FileInfo) {
	slices.SortFunc(s, func(a, b vfs.FileInfo) int { return strings.Compare(a.Path, b.Path) })
}

// mkdirAll makes the directory p and its missing parents (mode 0755) and
// returns an O_PATH descriptor of it. Existing components may be symlinks
// to directories inside the root.
func (r *rootFS) mkdirAll(p string) (int, error) {
	fd, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	cur := "/"
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		next := path.Join(cur, c)
		fd, err := r.open(next, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
		pfd, err := r.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(pfd, c, 0o755)
		if err == nil {
			// Whatever the umask: open the new directory itself (never
			// following a link a racing writer put in its place).
			if dfd, oerr := unix.Openat(pfd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); oerr == nil {
				unix.Fchmod(dfd, 0o755)
				unix.Close(dfd)
			}
		}
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		cur = next
	}
	return r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// copyBuf is the chunk of a streamed write: big enough for throughput, and
// ctx is checked between chunks.
const copyBuf = 1 << 20

// writeFile streams src into p atomically: a temporary file beside it,
// fsync, rename over p, fsync of the directory. A replaced regular file
// keeps its mode and owner; a new one (or one replacing a symlink, which
// is replaced, never written through) is 0644 and owned by this process
// (root). A failed or cancelled write removes the temporary file and
// leaves p as it was.
func (r *rootFS) writeFile(ctx context.Context, p string, src io.Reader) error {
	if p == "/" {
		return unix.EISDIR
	}
	dir, base := path.Split(p)
	dfd, err := r.mkdirAll(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	mode, uid, gid := uint32(0o644), -1, -1
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return unix.EISDIR
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return err
	}
	tmp := ".esf-upload-" + randomHex(8)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		if !done {
			f.Close() // a second Close after the one below is harmless
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err := io.CopyBuffer(f, &ctxReader{ctx: ctx, r: src}, make([]byte, copyBuf)); err != nil {
		return err
	}
	if uid >= 0 {
		// chown first: it clears the setuid and setgid bits chmod restores.
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return err
	}
	done = true
	// The rename is durable once the directory is.
	d, err := reopen(dfd, os.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// remove deletes p: a file, a symlink (never what it names), or a
// directory with everything in it.
func (r *rootFS) remove(ctx context.Context, p string) error {
	if p == "/" {
		return unix.EINVAL
	}
	dfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dfd, base, 0)
	}
	return removeTree(ctx, dfd, base)
}

// removeTree deletes the directory name of dirfd and its contents. Each
// step names one component relative to an open descriptor, with
// O_NOFOLLOW, so a symlink met on the way is unlinked, never entered.
func removeTree(ctx context.Context, dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return err
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			d.Close()
			return err
		}
		err := unix.Unlinkat(fd, n, 0)
		if errors.Is(err, unix.EISDIR) {
			err = removeTree(ctx, fd, n)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			d.Close()
			return err
		}
	}
	d.Close()
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// ctxReader ends a copy when ctx ends, between reads.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// fsError is the *fs.PathError of a failed file operation on abs: the
// io/fs class of the errno, which stays reachable too.
func fsError(op, abs string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == abs {
		return err
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, fs.ErrInvalid) || errors.Is(err, fs.ErrNotExist) {
			return &fs.PathError{Op: op, Path: abs, Err: err}
		}
		return err
	}
	return &fs.PathError{Op: op, Path: abs, Err: &errnoError{errno: errno, class: errnoClass(errno)}}
}

// errnoError is an errno that also matches its io/fs (or workspace) class.
type errnoError struct {
	errno unix.Errno
	class error
}

func (e *errnoError) Error() string        { return e.errno.Error() }
func (e *errnoError) Unwrap() error        { return e.errno }
func (e *errnoError) Is(target error) bool { return target == e.class }

func errnoClass(e unix.Errno) error {
	switch e {
	case unix.ENOENT:
		return fs.ErrNotExist
	case unix.EEXIST, unix.ENOTEMPTY:
		return fs.ErrExist
	case unix.EACCES, unix.EPERM, unix.EROFS, unix.EXDEV:
		return fs.ErrPermission
	case unix.ENOTDIR, unix.EISDIR, unix.EINVAL, unix.ELOOP, unix.ENAMETOOLONG:
		return fs.ErrInvalid
	case unix.EDQUOT:
		return workspace.ErrPolicy
	}
	return workspace.ErrProvider
}
