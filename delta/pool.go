package delta

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// Pool is where attempts' deltas live when their disk use is limited: a
// btrfs file system on a sparse image file under the state dir, mounted
// with quotas (qgroups) on. Each delta is a subvolume whose qgroup limit
// is the attempt's disk limit, so writes past it fail inside the attempt
// with EDQUOT, and the host file system loses at most what the deltas
// hold (the image is sparse, and discard gives freed blocks back).
// Metadata counts against the limit too: with no inode table, a delta's
// file count is bounded by its bytes (about 350 bytes an empty file).
//
// Why btrfs: project quotas on XFS or ext4 (what container engines use)
// need kernel quota support that not every kernel has (CONFIG_XFS_QUOTA,
// CONFIG_QFMT_V2), and an image per attempt costs a mkfs and a loop mount
// per activation; a subvolume and its limit are two ioctls.
type Pool struct {
	Dir   string // the mount point: deltas are created under it
	Image string // the backing file
}

// btrfsMagic is statfs's f_type of btrfs.
const btrfsMagic = 0x9123683e

// OpenPool mounts the pool at dir, backed by image, or adopts the pool
// mounted there already (a restarted daemon). A new pool's image is sparse
// and as large as the file system holding it: the pool itself limits
// nothing, its deltas' limits do. dir must not hold anything when no pool
// is mounted on it.
func OpenPool(dir, image string) (*Pool, error) {
	p := &Pool{Dir: dir, Image: image}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == btrfsMagic && Mounted(dir) {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return nil, fmt.Errorf("disk pool: %s holds deltas of attempts made without disk limits (%d entries, %v): %w", dir, len(ents), err, cas.ErrFailedPrecondition)
	}
	var host unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(image), &host); err != nil {
		return nil, err
	}
	size := int64(host.Blocks) * host.Bsize
	os.Remove(image) // a pool not mounted held nothing live: start afresh
	f, err := os.OpenFile(image, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return nil, err
	}
	steps := [][]string{
		// -K: no discard of a sparse file's blocks, which it does not have.
		{"mkfs.btrfs", "-q", "-f", "-K", image},
		{"mount", "-t", "btrfs", "-o", "loop,nodev,nosuid,noatime,discard=async", image, dir},
		{"btrfs", "quota", "enable", dir},
	}
	for i, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			if i == 2 {
				unix.Unmount(dir, 0)
			}
			os.Remove(image)
			return nil, fmt.Errorf("disk pool: %s: %v: %s", strings.Join(s, " "), err, bytes(out))
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func bytes(b []byte) string { return strings.TrimSpace(string(b)) }

// ClosePool closes the pool mounted at dir, if there is one.
func ClosePool(dir, image string) error {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type != btrfsMagic || !Mounted(dir) {
		return nil
	}
	return (&Pool{Dir: dir, Image: image}).Close()
}

// Close unmounts the pool and deletes its image. Every delta must be gone.
func (p *Pool) Close() error {
	if err := unix.Unmount(p.Dir, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("disk pool: unmount %s: %w", p.Dir, err)
	}
	if err := os.Remove(p.Image); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// The btrfs ioctls NewDelta uses (linux/btrfs.h).
const (
	iocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	limitMaxRfer    = 1          // BTRFS_QGROUP_LIMIT_MAX_RFER
)

type volArgs struct {
	fd   int64
	name [4088]byte
}

type qgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// NewDelta creates dir (a path in the pool whose parent exists) as a
// subvolume of at most limit bytes, data and metadata. A dir that exists
// already (a delta mounted before) is left as it is.
func (p *Pool) NewDelta(dir string, limit int64) error {
	if limit <= 0 {
		return fmt.Errorf("disk limit %d: %w", limit, cas.ErrInvalidArgument)
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	parent, err := unix.Open(filepath.Dir(dir), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disk pool: %w", err)
	}
	defer unix.Close(parent)
	var va volArgs
	name := filepath.Base(dir)
	if len(name) >= len(va.name) {
		return fmt.Errorf("disk pool: name %q too long: %w", name, cas.ErrInvalidArgument)
	}
	copy(va.name[:], name)
	if err := ioctl(parent, iocSubvolCreate, unsafe.Pointer(&va)); err != nil {
		return fmt.Errorf("disk pool: create subvolume %s: %w", dir, err)
	}
	sub, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		// qgroupid 0: the subvolume of the fd.
		la := qgroupLimitArgs{flags: limitMaxRfer, maxRfer: uint64(limit)}
		err = ioctl(sub, iocQgroupLimit, unsafe.Pointer(&la))
		unix.Close(sub)
	}
	if err != nil {
		os.Remove(dir)
		return fmt.Errorf("disk pool: limit %s to %d bytes: %w", dir, limit, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	return nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}
