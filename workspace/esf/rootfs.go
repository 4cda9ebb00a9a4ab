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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/randid"
	"github.com/esf-dev/esf/internal/rootfs"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// rootFS is an attempt's writable root on this host, seen as the container
// sees it: a rootfs.Root, so ".." stops at the top and a symlink, absolute
// or relative, names a path inside the root, and nothing the container
// writes can send a read or a write outside it. Lookups also refuse to
// cross mounts (nothing is mounted inside an attempt root on the host
// side).
//
// A rootFS is opened per operation and closed at its end: a descriptor
// held open would keep the mount busy and make the daemon's unmount (on
// release or suspend) fail.
type rootFS struct{ *rootfs.Root }

// errRootGone says the directory is no longer the attempt's mounted root:
// the attempt was released, suspended or reclaimed under us.
var errRootGone = errors.New("attempt root is not mounted")

// openRoot opens dir, which must be a mount point (the overlay of a live
// attempt); an unmounted directory (a released attempt leaves an empty
// mountpoint until its delta is deleted) is errRootGone, so a write never
// lands in the daemon's state dir.
func openRoot(dir string) (*rootFS, error) {
	r, err := rootfs.Open(dir, rootfs.Options{NoXDev: true})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%s: %w", dir, errRootGone)
		}
		return nil, err
	}
	// The root's own ".." on purpose: this is about the directory, not
	// a path inside it.
	var st, parent unix.Stat_t
	if err := unix.Fstat(r.Fd(), &st); err != nil {
		r.Close()
		return nil, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Fstatat(r.Fd(), "..", &parent, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Dev == parent.Dev {
		r.Close()
		return nil, fmt.Errorf("%s: %w", dir, errRootGone)
	}
	return &rootFS{r}, nil
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
	return vfs.FileInfo{Path: abs, Size: st.Size, Mode: rootfs.FileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Unix())}
}

// list returns the entries of the directory at p (following symlinks
// inside the root), or, for anything else, p's own entry as its parent's
// listing shows it.
func (r *rootFS) list(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	pfd, err := r.OpenFD(p, unix.O_PATH, 0)
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
		dfd, base, perr := r.Parent(p)
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
	d, err := rootfs.Reopen(pfd, os.O_RDONLY|unix.O_DIRECTORY)
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
	dfd, err := r.MkdirAll(dir, 0o755)
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
	tmp := ".esf-upload-" + randid.Hex(8)
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
	d, err := rootfs.Reopen(dfd, os.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
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
