package delta

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// Layout is where one attempt's delta lives.
type Layout struct {
	Lower string // the projected root, read-only
	Dir   string // private to the attempt: holds upper/ and work/
	Root  string // where the writable root is mounted
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
	return "lowerdir=" + l.Lower + ",upperdir=" + l.Upper() + ",workdir=" + l.Work() +
		",redirect_dir=off,index=off,metacopy=off,xino=off", nil
}

// Mount creates the delta directories and mounts the writable root. The
// upper directory starts empty: activating adds no payload bytes.
func Mount(l Layout) error {
	opts, err := l.options()
	if err != nil {
		return err
	}
	for _, d := range []string{l.Upper(), l.Work(), l.Root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	// The merged root is the upper root directory itself, so it must start
	// with the lower root's attributes or the attempt would see 0700 root.
	if err := copyRootAttrs(l.Lower, l.Upper()); err != nil {
		return err
	}
	if err := unix.Mount("overlay", l.Root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", l.Root, err)
	}
	return nil
}

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

// copyRootAttrs gives dst the owner, mode, xattrs and mtime of src.
func copyRootAttrs(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return fmt.Errorf("overlay lower %s: %w", src, err)
	}
	if err := unix.Chown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNano(dst, ts)
}

func copyXattrs(src, dst string) error {
	sz, err := unix.Llistxattr(src, nil)
	if err != nil || sz == 0 {
		return nil // no xattrs, or none supported
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(src, buf); err != nil {
		return nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		vsz, err := unix.Lgetxattr(src, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(src, name, val); err != nil {
			continue
		}
		if err := unix.Lsetxattr(dst, name, val[:vsz], 0); err != nil {
			return fmt.Errorf("copy xattr %s to %s: %w", name, dst, err)
		}
	}
	return nil
}
