package rootfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Options says how lookups under a Root resolve.
type Options struct {
	// NoXDev refuses lookups that cross a mount point (EXDEV).
	NoXDev bool
}

// Root is an open directory that paths are resolved inside.
type Root struct {
	fd      int    // O_PATH descriptor of the directory
	dir     string // host path, for messages
	resolve uint64
}

// Open opens dir as a root. The error is an *fs.PathError.
func Open(dir string, o Options) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	resolve := uint64(unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS)
	if o.NoXDev {
		resolve |= unix.RESOLVE_NO_XDEV
	}
	return &Root{fd: fd, dir: dir, resolve: resolve}, nil
}

// Close releases the descriptor (and with it the mount it pins).
func (r *Root) Close() error { return unix.Close(r.fd) }

// Dir is the host path the root was opened at.
func (r *Root) Dir() string { return r.dir }

// Fd is the O_PATH descriptor of the root, for calls about the root
// directory itself (fstat). A plain *at lookup of a path against it is
// not confined; use OpenFD.
func (r *Root) Fd() int { return r.fd }

// rel is the spelling of p (absolute or relative, "/" or "" for the root)
// that openat2 takes relative to the root descriptor.
func rel(p string) string {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return "."
	}
	return p
}

// maxRetries bounds the EAGAIN retries of openat2; each is a rename
// elsewhere on the system racing the lookup, so a few suffice.
const maxRetries = 64

// OpenFD resolves p inside the root and opens it with flags (O_CLOEXEC is
// added) and mode, which openat2 refuses unless flags create a file. The
// caller closes the descriptor.
func (r *Root) OpenFD(p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: r.resolve}
	for range maxRetries {
		fd, err := unix.Openat2(r.fd, rel(p), &how)
		if err != unix.EAGAIN && err != unix.EINTR {
			return fd, err
		}
	}
	return -1, unix.EAGAIN
}

// OpenFile is OpenFD as an *os.File named by p.
func (r *Root) OpenFile(p string, flags int, mode uint32) (*os.File, error) {
	fd, err := r.OpenFD(p, flags, mode)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// Stat describes what p names inside the root, following a final symlink
// inside it.
func (r *Root) Stat(p string) (unix.Stat_t, error) { return r.stat(p, 0) }

// Lstat is Stat without following a final symlink.
func (r *Root) Lstat(p string) (unix.Stat_t, error) { return r.stat(p, unix.O_NOFOLLOW) }

func (r *Root) stat(p string, flags int) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.OpenFD(p, unix.O_PATH|flags, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// Parent resolves the directory holding p's last component and returns an
// O_PATH descriptor of it (the caller closes it) and that component, to
// act on with an *at call. Trailing slashes are dropped (a caller that
// gives them meaning checks for them); the root itself, and a path ending
// in "..", come back as the directory they name and ".", so the component
// is never one an *at call would resolve outside the root.
func (r *Root) Parent(p string) (dirfd int, base string, err error) {
	p = strings.Trim(p, "/")
	dir, base := path.Split(p)
	if base == "" || base == ".." {
		dir, base = p, "."
	}
	fd, err := r.OpenFD(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// ProcPath names the inode fd refers to, for calls that have no form
// usable on an O_PATH descriptor.
func ProcPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// Reopen opens the inode the (O_PATH) descriptor fd names with flags, as
// open(2) of its /proc/self/fd link does: whatever happened to its path
// since, the same inode. O_NOCTTY is added.
func Reopen(fd int, flags int) (*os.File, error) {
	return os.OpenFile(ProcPath(fd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
}

// ErrNotRegular is OpenRegular's answer for anything but a regular file.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens the regular file at p (following symlinks inside the
// root) for reading and returns its size. The type is checked on an O_PATH
// descriptor first, so a FIFO or a device is never opened (opening one
// can block or have effects of its own); anything else is ErrNotRegular,
// which also matches fs.ErrInvalid.
func (r *Root) OpenRegular(p string) (*os.File, int64, error) {
	pfd, err := r.OpenFD(p, unix.O_PATH, 0)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, 0, notRegular{}
	}
	f, err := Reopen(pfd, os.O_RDONLY)
	if err != nil {
		return nil, 0, err
	}
	return f, st.Size, nil
}

type notRegular struct{}

func (notRegular) Error() string        { return ErrNotRegular.Error() }
func (notRegular) Is(target error) bool { return target == ErrNotRegular || target == fs.ErrInvalid }

// MkdirAll makes the directory p and its missing parents, each new one
// with exactly perm (whatever the umask), and returns an O_PATH descriptor
// of p for the caller to close. Existing components may be symlinks to
// directories inside the root.
func (r *Root) MkdirAll(p string, perm uint32) (int, error) {
	fd, err := r.OpenFD(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	cur := "/"
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if c == "" || c == "." || c == ".." {
			cur = path.Join(cur, c)
			continue
		}
		next := path.Join(cur, c)
		fd, err := r.OpenFD(next, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
		pfd, err := r.OpenFD(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(pfd, c, perm)
		if err == nil {
			// Open the new directory itself, never a link a racing
			// writer put in its place, to undo the umask.
			if dfd, oerr := unix.Openat(pfd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); oerr == nil {
				unix.Fchmod(dfd, perm)
				unix.Close(dfd)
			}
		}
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		cur = next
	}
	return r.OpenFD(p, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// RemoveAll deletes p: a file, a symlink (never what it names), or a
// directory with everything in it. Unlike os.RemoveAll, a missing p is
// ENOENT, and the root itself is EINVAL. ctx is checked between entries.
func (r *Root) RemoveAll(ctx context.Context, p string) error {
	if rel(p) == "." {
		return unix.EINVAL
	}
	dfd, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if base == "." {
		return unix.EINVAL
	}
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

// FileMode converts a stat(2) mode to an fs.FileMode: type, permission
// and the setuid, setgid and sticky bits.
func FileMode(m uint32) fs.FileMode {
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

// UnixMode is FileMode's inverse for what a mkdir, open or chmod takes:
// the permission and the setuid, setgid and sticky bits.
func UnixMode(m fs.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		mode |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		mode |= unix.S_ISVTX
	}
	return mode
}
