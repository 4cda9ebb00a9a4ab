package runc

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

// checkLeaves refuses a rootfs in which a mountpoint the container needs
// (leaves: /proc, /sys, /dev, the init, the caller's mounts) is a symlink,
// lies below one, or lies below something that is not a directory. The
// rootfs is a sandbox's tree, so this is the tree's doing, not the host's:
// failed_precondition naming the path, where runc would fail with an
// opaque message ("filesystem proc must be mounted on ordinary directory")
// or, for a tmpfs or bind, follow the link inside the rootfs and mount
// over whatever the sandbox pointed it at. Missing components are fine:
// runc creates them (see absentFootprint).
func checkLeaves(rootfs string, leaves []string) error {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	defer unix.Close(root)
	for _, leaf := range leaves {
		if err := checkLeaf(root, leaf); err != nil {
			return err
		}
	}
	return nil
}

func checkLeaf(root int, leaf string) error {
	comps := components(leaf)
	dir := root
	defer func() {
		if dir != root {
			unix.Close(dir)
		}
	}()
	for i, c := range comps {
		at := "/" + strings.Join(comps[:i+1], "/")
		var st unix.Stat_t
		err := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		typ := st.Mode & unix.S_IFMT
		if typ == unix.S_IFLNK {
			return fmt.Errorf("the tree's %s is a symlink, and the container runtime mounts at %s: make it a directory: %w",
				at, leaf, executor.ErrFailedPrecondition)
		}
		if i == len(comps)-1 {
			return nil
		}
		if typ != unix.S_IFDIR {
			return fmt.Errorf("the tree's %s is not a directory, and the container runtime mounts at %s: %w",
				at, leaf, executor.ErrFailedPrecondition)
		}
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		if dir != root {
			unix.Close(dir)
		}
		dir = next
	}
	return nil
}
