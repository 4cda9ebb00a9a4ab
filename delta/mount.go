package delta

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// Layout is where one attempt's delta lives.
type Layout struct {
	Lower string // the projected root, read-only
	Dir   string // private to the attempt: holds upper/ and work/
	Root  string // where the writable root is mounted
	// LowerAttr, if set, is the lower root's owner, mode, times and xattrs
	// (ReadRootAttr), which Mount gives the upper root. A projected root
	// never changes, so a caller can read it once per root and spare every
	// later Mount the round trips to the FUSE server.
	LowerAttr *RootAttr
	// HostView mounts the root nosuid,nodev: it is a directory the caller
	// chose on the host, where other users may run or open what the
	// attempt holds, and a setuid-root binary or a device node made in a
	// sandbox must not work there. A root private to the daemon (under its
	// 0700 state dir) is the sandbox's own and keeps the usual semantics.
	HostView bool
	// IDMap, if set, shows the layers' ids shifted into a user
	// namespace's range (see IDMap); the directories on disk keep the
	// sandbox's own ids.
	IDMap *IDMap
}

// Upper is the directory holding the attempt's changes.
func (l Layout) Upper() string { return filepath.Join(l.Dir, "upper") }

// Work is overlayfs's scratch directory.
func (l Layout) Work() string { return filepath.Join(l.Dir, "work") }

func (l Layout) options() (string, error) {
	for _, p := range []string{l.Lower, l.Upper(), l.Work()} {
		if !filepath.IsAbs(p) || strings.ContainsAny(p, ",:\\") {
			return "", fmt.Errorf("overlay path %q must be absolute without ',', ':' or '\\': %w", p, cas.ErrInvalidArgument)
		}
	}
	return "lowerdir=" + l.Lower + ",upperdir=" + l.Upper() + ",workdir=" + l.Work() + "," + Options, nil
}

// Options are the overlay features of every delta mount (see the package
// doc): nothing outside the upper directory, and volatile.
const Options = "redirect_dir=off,index=off,metacopy=off,xino=off,volatile"

// Mount creates the delta directories and mounts the writable root. The
// upper directory starts empty: activating adds no payload bytes. The
// directories may exist already (a retry after a failed mount), but the
// work directory must not hold the marker of an earlier volatile mount:
// see Reclaim.
func Mount(l Layout) error {
	opts, err := l.options()
	if err != nil {
		return err
	}
	// Plain mkdirs, parents first: MkdirAll would stat every level first,
	// twice the system calls on the activation path.
	for _, d := range []string{filepath.Dir(l.Dir), l.Dir, l.Upper(), l.Work(), l.Root} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			if errors.Is(err, os.ErrNotExist) {
				err = os.MkdirAll(d, 0o700) // a deeper custom layout
			}
			if err != nil {
				return err
			}
		}
	}
	// The merged root is the upper root directory itself, so it must start
	// with the lower root's attributes or the attempt would see 0700 root.
	attr := l.LowerAttr
	if attr == nil {
		a, err := ReadRootAttr(l.Lower)
		if err != nil {
			return err
		}
		attr = &a
	}
	if err := attr.apply(l.Upper()); err != nil {
		return err
	}
	if l.IDMap != nil {
		return l.mountIDMapped()
	}
	var flags uintptr
	if l.HostView {
		flags = unix.MS_NOSUID | unix.MS_NODEV
	}
	if err := unix.Mount("overlay", l.Root, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", l.Root, err)
	}
	return nil
}

// volatileMarker is where overlayfs notes a volatile mount in the work
// directory; it refuses to mount the same upper and work directories again
// while the marker is there, because after a crash of the machine the
// upper directory may be missing writes.
func (l Layout) volatileMarker() string { return filepath.Join(l.Work(), "work", "incompat") }

// Reclaim removes the volatile marker an earlier mount of this delta left,
// so that Mount can mount it again. Call it only when the machine has not
// restarted since that mount (BootID is unchanged): then every write the
// attempt made is in the page cache or on disk and the upper directory is
// whole. After a restart, the delta must be discarded instead.
func Reclaim(l Layout) error {
	if err := os.RemoveAll(l.volatileMarker()); err != nil {
		return fmt.Errorf("reclaim delta %s: %w", l.Dir, err)
	}
	return nil
}

var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
})

// BootID identifies the running boot of the machine. A delta mounted under
// one boot id and found unmounted under another went through a restart of
// the machine, which a volatile upper directory does not survive.
func BootID() (string, error) { return bootID() }

// Unmount detaches the writable root. An already unmounted root is fine.
func Unmount(root string) error {
	err := unix.Unmount(root, 0)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("unmount %s: still in use: %w", root, cas.ErrFailedPrecondition)
	}
	return fmt.Errorf("unmount %s: %w", root, err)
}

// Remove unmounts the root and deletes the delta and the mountpoint.
func Remove(l Layout) error {
	if err := Unmount(l.Root); err != nil {
		return err
	}
	if err := os.RemoveAll(l.Dir); err != nil {
		return err
	}
	if err := os.Remove(l.Root); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// Mounted reports whether an overlay is mounted at root.
func Mounted(root string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(root, &st) != nil || unix.Lstat(filepath.Dir(root), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// RootAttr is what the upper root directory copies from the lower root:
// owner, permission bits, times and extended attributes.
type RootAttr struct {
	UID, GID   uint32
	Mode       uint32 // permission bits only
	Atim, Mtim unix.Timespec
	Xattrs     []Xattr
}

// Xattr is one extended attribute.
type Xattr struct {
	Name  string
	Value []byte
}

// ReadRootAttr reads dir's RootAttr. Extended attributes the file system
// does not support, or lists but cannot read, are left out.
func ReadRootAttr(dir string) (RootAttr, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return RootAttr{}, fmt.Errorf("overlay lower %s: %w", dir, err)
	}
	a := RootAttr{UID: st.Uid, GID: st.Gid, Mode: st.Mode & 0o7777, Atim: st.Atim, Mtim: st.Mtim}
	sz, err := unix.Llistxattr(dir, nil)
	if err != nil || sz == 0 {
		return a, nil // no xattrs, or none supported
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(dir, buf); err != nil {
		return a, nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		vsz, err := unix.Lgetxattr(dir, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(dir, name, val); err != nil {
			continue
		}
		a.Xattrs = append(a.Xattrs, Xattr{Name: name, Value: val[:vsz]})
	}
	return a, nil
}

// apply gives dst the attributes; the times go last, as the other changes
// would touch them.
func (a *RootAttr) apply(dst string) error {
	if err := unix.Chown(dst, int(a.UID), int(a.GID)); err != nil {
		return err
	}
	if err := unix.Chmod(dst, a.Mode); err != nil {
		return err
	}
	for _, x := range a.Xattrs {
		if err := unix.Lsetxattr(dst, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("copy xattr %s to %s: %w", x.Name, dst, err)
		}
	}
	return unix.UtimesNano(dst, []unix.Timespec{a.Atim, a.Mtim})
}
