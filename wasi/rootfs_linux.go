//go:build linux

package wasi

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/esf-dev/esf/internal/rootfs"
)

// rootFS is the guest's view of one host directory, resolved the way a
// chroot would resolve it: every path, and every symlink met on the way,
// is looked up with openat2(RESOLVE_IN_ROOT), so ".." stops at the top and
// an absolute target ("/usr/lib") names a path inside the directory.
//
// wazero's own DirFS joins strings and lets the host follow symlinks, so a
// guest that creates "x -> ../../../etc" reads the host's /etc (see
// TestRootFS_SymlinksStayInside); an image's absolute links would also
// resolve against the host. Both are wrong for a sandbox and for FR-07.
//
// Operations on a name (mkdir, unlink, rename, link, symlink, readlink)
// resolve the parent inside the root and act on the last component with
// the *at syscall, which never follows it. Operations that follow the last
// component (open, stat, chmod, utimens) resolve the whole path inside the
// root first and then act on that inode only.
type rootFS struct {
	experimentalsys.UnimplementedFS
	root     *rootfs.Root
	readOnly bool
}

var _ experimentalsys.FS = (*rootFS)(nil)

// openRootFS confines to dir. Mounts inside it are crossed: the extra
// read-only directories and the root may be bind mounts of their own.
func openRootFS(dir string, readOnly bool) (*rootFS, error) {
	root, err := rootfs.Open(dir, rootfs.Options{})
	if err != nil {
		return nil, err
	}
	return &rootFS{root: root, readOnly: readOnly}, nil
}

func (r *rootFS) close() error { return r.root.Close() }

// ReadModule reads the module at guestPath inside root, resolving it as the
// guest would (symlinks stay inside root), so that "exec ATTEMPT --
// /bin/tool.wasm" cannot be pointed at a host file or a device. The file
// must be a regular file of at most MaxModuleSize bytes.
func ReadModule(root, guestPath string) ([]byte, error) {
	r, err := openRootFS(root, true)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read module: root %s: %w", root, ErrNotFound)
		}
		return nil, fmt.Errorf("read module: root %s: %v: %w", root, err, ErrInvalidArgument)
	}
	defer r.close()
	// OpenRegular looks before opening for reading: opening a device or
	// a FIFO can have effects of its own.
	f, size, err := r.root.OpenRegular(guestPath)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("read module %s: %w", guestPath, ErrNotFound)
		}
		return nil, fmt.Errorf("read module %s: %v: %w", guestPath, err, ErrInvalidArgument)
	}
	defer f.Close()
	if size > MaxModuleSize {
		return nil, fmt.Errorf("read module %s: %d bytes, above %d: %w", guestPath, size, MaxModuleSize, ErrInvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", guestPath, err)
	}
	if len(b) > MaxModuleSize {
		return nil, fmt.Errorf("read module %s: grew above %d bytes: %w", guestPath, MaxModuleSize, ErrInvalidArgument)
	}
	return b, nil
}

func (r *rootFS) String() string { return r.root.Dir() }

// mustBeDir enforces a trailing slash on a name the syscall sees without
// one: "file/" names nothing.
func mustBeDir(dirfd int, base string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.ENOTDIR
	}
	return nil
}

// onName runs op on p's parent and last component. A trailing slash
// demands a directory.
func (r *rootFS) onName(p string, op func(dirfd int, base string) error) experimentalsys.Errno {
	dirfd, base, err := r.root.Parent(p)
	if err != nil {
		return experimentalsys.UnwrapOSError(err)
	}
	defer unix.Close(dirfd)
	if strings.HasSuffix(p, "/") {
		if err := mustBeDir(dirfd, base); err != nil && !errors.Is(err, unix.ENOENT) {
			return experimentalsys.UnwrapOSError(err)
		}
	}
	return experimentalsys.UnwrapOSError(op(dirfd, base))
}

// onInode resolves p inside the root (following a final symlink unless
// nofollow) and runs op with a /proc path naming exactly that inode, for
// the calls that have no descriptor form usable on an O_PATH descriptor.
func (r *rootFS) onInode(p string, nofollow bool, op func(procPath string) error) experimentalsys.Errno {
	flags := unix.O_PATH
	if nofollow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := r.root.OpenFD(p, flags, 0)
	if err != nil {
		return experimentalsys.UnwrapOSError(err)
	}
	defer unix.Close(fd)
	return experimentalsys.UnwrapOSError(op(rootfs.ProcPath(fd)))
}

// OpenFile implements experimentalsys.FS.
func (r *rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if r.readOnly && (flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) != 0 ||
		flag&(experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0) {
		return nil, experimentalsys.EROFS
	}
	// openat2, unlike open, refuses a mode without O_CREAT, and wazero
	// passes one on every open.
	var mode uint32
	if flag&experimentalsys.O_CREAT != 0 {
		mode = rootfs.UnixMode(perm)
	}
	fd, err := r.root.OpenFD(p, toOpenFlags(flag), mode)
	if err != nil {
		return nil, experimentalsys.UnwrapOSError(err)
	}
	return r.pin(fd, flag, perm)
}

// Lstat implements experimentalsys.FS.
func (r *rootFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	return toStat(r.root.Lstat(p))
}

// Stat implements experimentalsys.FS.
func (r *rootFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	return toStat(r.root.Stat(p))
}

// Readlink implements experimentalsys.FS.
func (r *rootFS) Readlink(p string) (target string, errno experimentalsys.Errno) {
	errno = r.onName(p, func(dirfd int, base string) error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			n, err := unix.Readlinkat(dirfd, base, buf)
			if err != nil {
				return err
			}
			if n < size {
				target = string(buf[:n])
				return nil
			}
		}
	})
	return target, errno
}

// Mkdir implements experimentalsys.FS.
func (r *rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	errno := r.onName(p, func(dirfd int, base string) error {
		return unix.Mkdirat(dirfd, base, rootfs.UnixMode(perm))
	})
	// wazero's DirFS reports a missing parent as ENOENT, as WASI expects.
	if errno == experimentalsys.ENOTDIR {
		errno = experimentalsys.ENOENT
	}
	return errno
}

// Chmod implements experimentalsys.FS.
func (r *rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onInode(p, false, func(procPath string) error {
		return unix.Chmod(procPath, rootfs.UnixMode(perm))
	})
}

// Rename implements experimentalsys.FS.
func (r *rootFS) Rename(from, to string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onName(from, func(fromfd int, fromBase string) error {
		return errnoErr(r.onName(to, func(tofd int, toBase string) error {
			return unix.Renameat(fromfd, fromBase, tofd, toBase)
		}))
	})
}

// Rmdir implements experimentalsys.FS.
func (r *rootFS) Rmdir(p string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onName(p, func(dirfd int, base string) error {
		return unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	})
}

// Unlink implements experimentalsys.FS.
func (r *rootFS) Unlink(p string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onName(p, func(dirfd int, base string) error {
		return unix.Unlinkat(dirfd, base, 0)
	})
}

// Link implements experimentalsys.FS. Neither name is followed.
func (r *rootFS) Link(oldPath, newPath string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onName(oldPath, func(oldfd int, oldBase string) error {
		return errnoErr(r.onName(newPath, func(newfd int, newBase string) error {
			return unix.Linkat(oldfd, oldBase, newfd, newBase, 0)
		}))
	})
}

// Symlink implements experimentalsys.FS. The target is stored verbatim;
// absolute targets are allowed because they resolve inside the root, as
// they would under runc (wazero's DirFS refuses them because it cannot).
func (r *rootFS) Symlink(target, link string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return r.onName(link, func(dirfd int, base string) error {
		return unix.Symlinkat(target, dirfd, base)
	})
}

// Utimens implements experimentalsys.FS; it follows a final symlink.
func (r *rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	ts, ok := timespecs(atim, mtim)
	if !ok {
		return 0
	}
	return r.onInode(p, false, func(procPath string) error {
		return unix.UtimesNanoAt(unix.AT_FDCWD, procPath, ts[:], 0)
	})
}

// errnoErr turns a zero Errno into a nil error so nested onName calls
// compose.
func errnoErr(e experimentalsys.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func toOpenFlags(oflag experimentalsys.Oflag) int {
	var flags int
	switch oflag & (experimentalsys.O_RDONLY | experimentalsys.O_RDWR | experimentalsys.O_WRONLY) {
	case experimentalsys.O_RDWR:
		flags = unix.O_RDWR
	case experimentalsys.O_WRONLY:
		flags = unix.O_WRONLY
	default:
		flags = unix.O_RDONLY
	}
	for _, m := range [...]struct {
		o experimentalsys.Oflag
		f int
	}{
		{experimentalsys.O_APPEND, unix.O_APPEND},
		{experimentalsys.O_CREAT, unix.O_CREAT},
		{experimentalsys.O_DIRECTORY, unix.O_DIRECTORY},
		{experimentalsys.O_DSYNC, unix.O_DSYNC},
		{experimentalsys.O_EXCL, unix.O_EXCL},
		{experimentalsys.O_NOFOLLOW, unix.O_NOFOLLOW},
		{experimentalsys.O_NONBLOCK, unix.O_NONBLOCK},
		{experimentalsys.O_RSYNC, unix.O_RSYNC},
		{experimentalsys.O_SYNC, unix.O_SYNC},
		{experimentalsys.O_TRUNC, unix.O_TRUNC},
	} {
		if oflag&m.o != 0 {
			flags |= m.f
		}
	}
	return flags
}

func toStat(st unix.Stat_t, err error) (sys.Stat_t, experimentalsys.Errno) {
	if err != nil {
		return sys.Stat_t{}, experimentalsys.UnwrapOSError(err)
	}
	return sys.Stat_t{
		Dev:   st.Dev,
		Ino:   st.Ino,
		Mode:  rootfs.FileMode(st.Mode),
		Nlink: uint64(st.Nlink),
		Size:  st.Size,
		Atim:  st.Atim.Nano(),
		Mtim:  st.Mtim.Nano(),
		Ctim:  st.Ctim.Nano(),
	}, 0
}

// timespecs converts wazero's times (UTIME_OMIT is its own sentinel) to
// the kernel's; ok is false when both are omitted and there is nothing to do.
func timespecs(atim, mtim int64) (ts [2]unix.Timespec, ok bool) {
	if atim == experimentalsys.UTIME_OMIT && mtim == experimentalsys.UTIME_OMIT {
		return ts, false
	}
	for i, t := range [2]int64{atim, mtim} {
		if t == experimentalsys.UTIME_OMIT {
			ts[i] = unix.Timespec{Nsec: unix.UTIME_OMIT}
		} else {
			ts[i] = unix.NsecToTimespec(t)
		}
	}
	return ts, true
}

// pinned is an open file of a rootFS: wazero's own file type (which keeps
// the path it was opened with, to reopen itself for SetAppend and for
// directory rewinds), opened through /proc/self/fd/<pin> where pin is the
// descriptor openat2 resolved inside the root. That path names the pinned
// inode, never a lookup in the tree, and stays valid while pin is open.
type pinned struct {
	experimentalsys.File
	pin      int
	readOnly bool
}

// procFS opens the /proc/self/fd links of pinned descriptors.
var procFS = sysfs.DirFS("/proc/self/fd")

func (r *rootFS) pin(fd int, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	// The first open created, truncated and checked O_EXCL/O_NOFOLLOW
	// already; O_NOFOLLOW would now refuse the /proc link itself.
	flag &^= experimentalsys.O_CREAT | experimentalsys.O_EXCL | experimentalsys.O_TRUNC | experimentalsys.O_NOFOLLOW
	f, errno := procFS.OpenFile(strconv.Itoa(fd), flag, perm)
	if errno != 0 {
		unix.Close(fd)
		return nil, errno
	}
	return &pinned{File: f, pin: fd, readOnly: r.readOnly}, 0
}

var _ experimentalsys.PollableFile = (*pinned)(nil)

func (f *pinned) Close() experimentalsys.Errno {
	errno := f.File.Close()
	if f.pin >= 0 {
		unix.Close(f.pin)
		f.pin = -1
	}
	return errno
}

// Utimens on a read-only mount is refused: as root, futimens would
// succeed on a descriptor opened for reading.
func (f *pinned) Utimens(atim, mtim int64) experimentalsys.Errno {
	if f.readOnly {
		return experimentalsys.EROFS
	}
	return f.File.Utimens(atim, mtim)
}

func (f *pinned) SetAppend(enable bool) experimentalsys.Errno {
	if f.readOnly && enable {
		return experimentalsys.EROFS
	}
	return f.File.SetAppend(enable)
}

func (f *pinned) IsNonblock() bool {
	if p, ok := f.File.(experimentalsys.PollableFile); ok {
		return p.IsNonblock()
	}
	return false
}

func (f *pinned) SetNonblock(enable bool) experimentalsys.Errno {
	if p, ok := f.File.(experimentalsys.PollableFile); ok {
		return p.SetNonblock(enable)
	}
	return experimentalsys.ENOSYS
}

func (f *pinned) Poll(flag experimentalsys.Pflag, timeoutMillis int32) (bool, experimentalsys.Errno) {
	if p, ok := f.File.(experimentalsys.Pollable); ok {
		return p.Poll(flag, timeoutMillis)
	}
	return false, experimentalsys.ENOSYS
}
