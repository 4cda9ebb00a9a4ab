package fabric

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/errdefs"
)

// The state dir holds the journal (with --env secrets and logical state),
// the content store, the provenance key and every attempt's delta; none of
// it is anyone's but the daemon's. Open makes it private whatever modes it
// was created with (issue 15, finding 8): the state dir becomes 0700, and
// every file and directory under it loses its group and other bits (a
// read-only object stays read-only: 0444 becomes 0400). The full walk
// runs once per state dir, recorded by privateMarker; later starts redo
// only the state dir and its top level, which is cheap and enough, since
// nothing below a 0700 directory can be reached by path by another user.
// Files created later keep the modes their writers give them (the store's
// 0444 objects, pebble's files) behind that 0700 directory. Mounts inside
// the state dir (the projection, attempt roots) are not descended into:
// they show trees, not state, and have their own permissions.

// privateMarker records that the whole state dir was made private.
const privateMarker = "private-v1"

// makePrivate makes dir 0700 and strips group and other bits below it.
func makePrivate(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("make state private: open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("make state private: %w", err)
	}
	if st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return fmt.Errorf("make state private: chmod %s: %w", dir, err)
		}
	}
	full := unix.Faccessat(fd, privateMarker, unix.F_OK, 0) != nil
	if err := privateTree(fd, st.Dev, full, ""); err != nil {
		return fmt.Errorf("make state private: %w", err)
	}
	if full {
		mfd, err := unix.Openat(fd, privateMarker, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("make state private: marker: %w", err)
		}
		unix.Close(mfd)
	}
	return nil
}

// privateTree strips group and other bits from the entries of the
// directory fd (rel below the state dir), descending into directories on
// device dev when deep. Symlinks have no mode of their own.
func privateTree(fd int, dev uint64, deep bool, rel string) error {
	// A fresh open file description: reading moves its offset, not fd's.
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(rfd), rel)
	defer d.Close()
	for {
		names, err := d.Readdirnames(1024)
		for _, name := range names {
			if err := privateEntry(fd, dev, deep, rel, name); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", relOrDot(rel), err)
		}
	}
}

func privateEntry(fd int, dev uint64, deep bool, rel, name string) error {
	path := filepath.Join(rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed meanwhile
		}
		if errors.Is(err, unix.ENOTCONN) {
			return nil // a dead projection mount: not state
		}
		return fmt.Errorf("stat %s: %w", path, err)
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFLNK || st.Dev != dev {
		return nil // a symlink, or a mount: a tree shown, not state
	}
	if st.Mode&0o077 != 0 {
		if err := chmodNoFollow(fd, name, st.Mode&0o7700); err != nil {
			return fmt.Errorf("chmod %s: %w", path, err)
		}
	}
	if !deep || typ != unix.S_IFDIR {
		return nil
	}
	cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(cfd)
	return privateTree(cfd, dev, deep, path)
}

// chmodNoFollow chmods name in fd, which fstatat just found not to be a
// symlink; a symlink swapped in meanwhile is refused, never followed.
func chmodNoFollow(fd int, name string, mode uint32) error {
	err := unix.Fchmodat(fd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
	if err != unix.EOPNOTSUPP && err != unix.ENOSYS {
		return err
	}
	pfd, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	return unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", pfd), mode)
}

func relOrDot(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// ownMount says whether dir (absolute) is inside the state dir: the
// projection, an attempt's private root, or anything else of the daemon's
// own, which umount must refuse. Symlinks in dir are resolved first, as
// umount(2) would follow them; a final component that cannot be resolved
// (a dead FUSE mount) is judged by its resolved parent.
func (f *Fabric) ownMount(dir string) (what string, own bool) {
	p, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if parent, perr := filepath.EvalSymlinks(filepath.Dir(dir)); perr == nil {
			p = filepath.Join(parent, filepath.Base(dir))
		} else {
			p = dir
		}
	}
	state := f.stateDir
	if s, err := filepath.EvalSymlinks(state); err == nil {
		state = s
	}
	if p != state && !strings.HasPrefix(p, state+string(filepath.Separator)) {
		return "", false
	}
	switch rel, _ := filepath.Rel(state, p); {
	case rel == "mnt" || strings.HasPrefix(rel, "mnt/"):
		return "the projection", true
	case strings.HasPrefix(rel, "attempts/"):
		return "an attempt's root", true
	}
	return "the state dir", true
}

// errOwnMount is the stable refusal of an umount of esf's own mounts.
func errOwnMount(dir, what string) error {
	return fmt.Errorf("umount %s: %s is esf's own mount, not a view (release or suspend an attempt instead): %w",
		dir, what, errdefs.ErrInvalidArgument)
}
