package delta

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// IDMap shifts ids between a delta's layers and its mount, for attempts
// whose container runs in a user namespace with the same mapping: id k
// inside (as stored in the layers: the projected tree and the upper
// directory on disk) is host id Start+k in the mount. The container's root
// (host id Start) then owns what the tree records as owned by 0, and what
// it creates lands in the upper directory as owned by 0, exactly as the
// sandbox saw it, so a seal records in-sandbox ownership without any
// translation.
//
// Overlayfs itself cannot be idmapped, but its layers can (Linux 5.19):
// Mount clones the lower and the delta directory as detached idmapped
// mounts and hands them to overlayfs by file descriptor (Linux 6.13). The
// idmapped clones are referenced only by the overlay and go with it.
type IDMap struct {
	Start, Count uint32
	userns       *os.File // a user namespace with the mapping 0 → Start, Count ids
}

// NewIDMap makes the user namespace an idmapped mount takes its mapping
// from. A namespace lives as long as a file refers to it, so it costs a
// short-lived process (cat, blocked on a pipe) once per daemon.
func NewIDMap(start, count uint32) (*IDMap, error) {
	if count == 0 || start == 0 || uint64(start)+uint64(count) > 1<<32-1 {
		return nil, fmt.Errorf("id map %d:%d: want a non-empty range of host ids above 0: %w", start, count, cas.ErrInvalidArgument)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		return nil, fmt.Errorf("id map: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("id map: %w", err)
	}
	cmd := exec.Command(cat)
	cmd.Stdin = r
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(start), Size: int(count)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m,
		GidMappingsEnableSetgroups: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("id map: user namespace: %w", err)
	}
	// End of input ends cat; the namespace outlives it through ns.
	defer func() { w.Close(); cmd.Wait() }()
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	if err != nil {
		cmd.Process.Kill()
		return nil, fmt.Errorf("id map: %w", err)
	}
	return &IDMap{Start: start, Count: count, userns: ns}, nil
}

// Close releases the namespace; mounts made with it keep their mapping.
func (m *IDMap) Close() error { return m.userns.Close() }

// HostID is in-sandbox id k as the host sees it through the mount.
func (m *IDMap) HostID(k uint32) (uint32, error) {
	if k >= m.Count {
		return 0, fmt.Errorf("id %d outside the sandbox's %d ids: %w", k, m.Count, cas.ErrInvalidArgument)
	}
	return m.Start + k, nil
}

// clone is a detached idmapped copy of the mount at path.
func (m *IDMap) clone(path string) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(m.userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", path, err)
	}
	return fd, nil
}

// IDMappedSource is the mount source of an idmapped delta over dir, which
// mountinfo shows instead of layer paths (layers given by descriptor are
// named relative to their detached mounts).
func IDMappedSource(dir string) string { return "esf-delta:" + dir }

// mountIDMapped mounts l's overlay with idmapped layers at l.Root.
func (l Layout) mountIDMapped() error {
	m := l.IDMap
	lower, err := m.clone(l.Lower)
	if err != nil {
		return err
	}
	defer unix.Close(lower)
	dir, err := m.clone(l.Dir)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, name := range []string{"upper", "work"} {
		fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fds = append(fds, fd)
	}
	// Overlayfs does its own work in the layers (the work directory,
	// copy-ups) with the mounter's credentials, which must map through
	// the layers' idmaps: the mount is made by a thread whose file system
	// ids are the sandbox's root (host id Start) and which keeps every
	// capability. The thread is locked and never unlocked, so the runtime
	// ends it with the goroutine and no other code runs with these ids.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Setfsgid(int(m.Start)); err != nil {
				return err
			}
			if err := unix.Setfsuid(int(m.Start)); err != nil {
				return err
			}
			// A non-zero fsuid clears the file system capabilities from the
			// effective set; overlayfs needs them (copy-up keeps owners).
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var caps [2]unix.CapUserData
			if err := unix.Capget(&hdr, &caps[0]); err != nil {
				return err
			}
			caps[0].Effective, caps[1].Effective = caps[0].Permitted, caps[1].Permitted
			if err := unix.Capset(&hdr, &caps[0]); err != nil {
				return err
			}
			var attr int
			if l.HostView {
				attr = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
			}
			return overlayByFD(lower, fds[0], fds[1], IDMappedSource(l.Dir), l.Root, attr)
		}()
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("mount idmapped overlay at %s: %w", l.Root, err)
	}
	return nil
}

func overlayByFD(lower, upper, work int, source, target string, attr int) error {
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fs)
	set := func(key string, err error) error {
		if err != nil {
			return fmt.Errorf("overlay %s: %w", key, err)
		}
		return nil
	}
	if err := errors.Join(
		set("source", unix.FsconfigSetString(fs, "source", source)),
		set("lowerdir+", unix.FsconfigSetFd(fs, "lowerdir+", lower)),
		set("upperdir", unix.FsconfigSetFd(fs, "upperdir", upper)),
		set("workdir", unix.FsconfigSetFd(fs, "workdir", work)),
		set("redirect_dir", unix.FsconfigSetString(fs, "redirect_dir", "off")),
		set("index", unix.FsconfigSetString(fs, "index", "off")),
		set("metacopy", unix.FsconfigSetString(fs, "metacopy", "off")),
		set("xino", unix.FsconfigSetString(fs, "xino", "off")),
		set("volatile", unix.FsconfigSetFlag(fs, "volatile")),
	); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("overlay create: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attr)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mnt)
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}
